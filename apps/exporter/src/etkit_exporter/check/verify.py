"""Running an exported program in ``executorch.runtime`` and comparing it with the PyTorch
models it came from."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from executorch.runtime import Runtime
from torch.utils import _pytree as pytree

from etkit_exporter.check.envelope import rounding_envelope
from etkit_exporter.check.judgement import judge_outputs, output_reducer
from etkit_exporter.check.localization import Progress, judge_calls
from etkit_exporter.check.metrics import psnr
from etkit_exporter.check.pictures import is_image_like, write_panel
from etkit_exporter.check.tolerance import DEFAULT_TOLERANCE, VerifyTolerance
from etkit_exporter.core import memory
from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND, VGF_BACKEND
from etkit_exporter.core.diagnostics import capture_native_log
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.model_explorer import write_node_data
from etkit_exporter.programs import load_program
from etkit_exporter.programs.runtime import runtime_method
from etkit_exporter.vgf.delegate import vgf_io
from etkit_gridsampler import reference, runtime
from etkit_gridsampler.delegate_format import decode
from etkit_gridsampler.op import dequantize

if TYPE_CHECKING:
    from etkit_pterunner import DelegateFn

logger = logging.getLogger(__name__)


def _outputs(value: object) -> list[torch.Tensor]:
    """The tensors a forward returned, in the program's order (a dict's values, a tuple's)."""
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _run_in_executorch_runtime(pte: Path, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    failure: RuntimeError | None = None
    with capture_native_log(echo=logger.isEnabledFor(logging.DEBUG)) as log:
        try:
            method = runtime_method(pte)
            raw = list(method.execute(inputs))
        except RuntimeError as error:
            failure = error
    if failure is not None:
        said = "; ".join(log.errors[-3:]) or "nothing on its log"
        raise RuntimeError(f"{failure} (the runtime said: {said})") from failure
    return raw


def _run_in_etkit_runner(
    pte: Path, inputs: list[torch.Tensor], delegates: Mapping[str, DelegateFn] | None = None
) -> tuple[list[torch.Tensor], list[dict[str, Any]], list[Any]]:
    program = load_program(pte, delegates=delegates)
    result = program.run(inputs, keep_delegate_io=True)
    for warning in result.warnings:
        logger.warning("runner: %s", warning)
    blobs = {d.index: d.processed for d in program.method("forward").delegates}
    rows = [_delegate_row(call, blobs[call.delegate]) for call in result.delegate_calls]
    return list(result.outputs), rows, list(result.delegate_calls)


def check_program_loads(pte: Path, target: str) -> str:
    """Loads the written program as a runtime would, before an export reports success, and
    returns what loaded it. An XNNPACK program: ``executorch.runtime`` loads the program and
    its ``forward`` method (which builds every delegate: XNNPACK creates its operators then).
    A VGF program, which that runtime cannot load: etkit's runner reads it, resolves every
    operator and backend, and reads each VGF's declarations and each grid-sampler blob, without
    running it. Raises ``RuntimeError`` with the runtime's own reason (its log lines) in one
    line when the program is refused."""
    if target != "vgf":
        runtime.register()
        failure: Exception | None = None
        with capture_native_log(echo=logger.isEnabledFor(logging.DEBUG)) as log:
            try:
                program = Runtime.get().load_program(pte)
                if program.load_method("forward") is None:
                    failure = RuntimeError("the program has no method 'forward'")
            except Exception as error:
                failure = error
        if failure is not None:
            said = _runtime_said(log.errors, log.text)
            # not chained: root_cause reports the innermost error, and this line is the reason
            raise RuntimeError(
                f"executorch.runtime refuses the written program: {failure}; the runtime said: "
                f"{said}"
            ) from None
        return "executorch.runtime (program and method loaded)"

    program = load_program(pte)
    program.check("forward")
    for delegate in program.method("forward").delegates:
        if delegate.backend_id == VGF_BACKEND:
            vgf_io(delegate.processed)
        elif delegate.backend_id == GRID_SAMPLER_BACKEND:
            decode(delegate.processed)
    return "etkit runner (program read, every operator, VGF and grid-sampler blob checked)"


def _runtime_said(errors: list[str], text: str) -> str:
    """The runtime's reason: its error lines that say more than the method's failure code
    (XNNPACK's own ``Failed to create ... node`` first), joined on one line."""
    lines = [e for e in errors if e.strip()]
    if not lines:
        lines = [line.strip() for line in text.splitlines() if "rror" in line or "ailed" in line]
    specific = [e for e in lines if "Failed to load method" not in e]
    chosen = (specific or lines)[-4:]
    return "; ".join(chosen) or "nothing on its log"


# A nearest sample whose source coordinate lies this close to a rounding tie may pick either
# pixel: the ideal computes it in float64 from the same int16 grid, exact to ~1e-12 pixels.
TIE_TOLERANCE_PX = 1e-6


def _delegate_row(call: Any, processed: bytes) -> dict[str, Any]:
    """One delegate call of a runner verification: where, what ran it, its time; for a
    grid-sampler call, its output against the grid-sampler contract's ideal computed on the very
    integer inputs the program gave it (``etkit_gridsampler.reference``: PyTorch's float64
    grid_sample on the dequantized operands, quantized): steps max and histogram, nearest
    samples at rounding ties set apart. This isolates the sampler: a program output further
    from the quantized model than the contract allows got there upstream."""
    row: dict[str, Any] = {
        "instruction": call.instruction,
        "delegate": call.delegate,
        "backend": call.backend_id,
        "implementation": call.implementation,
        "seconds": round(call.seconds, 6),
    }
    if call.backend_id != GRID_SAMPLER_BACKEND or call.inputs is None or call.outputs is None:
        return row

    blob = decode(processed)
    op = blob.op
    image, grid = call.inputs[blob.roles.image], blob.grid_operand(call.inputs[blob.roles.grid])
    row["mode"] = op.mode
    if op.output is None:
        return row
    ideal = reference.grid_sample(image, grid, op).long()
    steps = (call.outputs[0].long() - ideal).abs()
    ties = torch.zeros_like(steps, dtype=torch.bool)
    if op.mode == "nearest":
        ties = _ties(grid, op, tuple(image.shape[-2:])).unsqueeze(1).expand_as(steps)
        row["ties"] = int(ties.sum())
    steps = steps.masked_fill(ties, 0)
    row.update({"max_steps_vs_ideal": int(steps.max()), "steps_histogram": _histogram(steps)})
    return row


def _ties(grid: torch.Tensor, op: Any, size: tuple[int, int]) -> torch.Tensor:
    """N x Ho x Wo: where the source coordinate of a nearest sample lies on a rounding tie."""

    g = dequantize(grid, op.grid).double()
    height, width = size
    tie = torch.zeros(g.shape[:3], dtype=torch.bool)
    for axis, extent in ((0, width), (1, height)):
        coordinate = g[..., axis]
        source = (
            (coordinate + 1) / 2 * (extent - 1)
            if op.align_corners
            else ((coordinate + 1) * extent - 1) / 2
        )
        tie |= ((source - torch.floor(source)) - 0.5).abs() < TIE_TOLERANCE_PX
    return tie


RUNNERS: dict[str, str] = {
    "vgf": "etkit runner (VGF on scenario_runner, Vulkan)",
    "xnnpack": "executorch.runtime",
}


def _steps(actual: torch.Tensor, reference: torch.Tensor, entry: dict[str, Any]) -> dict[str, Any]:
    """How many output quantization steps apart two dequantized outputs are: max and a
    histogram (0, 1, 2, more)."""
    steps = ((actual.double() - reference.double()).abs() / entry["scale"]).round().long()
    return {"max_steps": int(steps.max()), "steps_histogram": _histogram(steps)}


def _histogram(steps: torch.Tensor) -> dict[str, int]:
    """How many values are 0, 1, 2 and more steps apart."""
    histogram = {str(k): int((steps == k).sum()) for k in range(3)}
    histogram["more"] = int((steps > 2).sum())
    return histogram


@dataclass(frozen=True)
class VerifiedRun:
    """A verification and the run it judged: the program's inputs (the example inputs in its IO
    types and layouts) and its outputs as it returned them; for a run in etkit's runner, its
    delegate calls with the tensors each read and wrote."""

    verification: dict[str, Any]
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    delegate_calls: list[Any] | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        """Whether the verdict passed (see ``etkit_exporter.check.verdict``)."""
        verdict = self.verification.get("verdict") or {}
        return verdict.get("result") != "fail"


class _Steps:
    """The verification's own stages, each timed and its peak resident memory watched (report
    ``verification["stages"]``), announced to ``progress`` as they go."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.figures: dict[str, dict[str, float | None]] = {}  # by stage, in order

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        if self.progress is not None:
            self.progress(name, 0, 0)
        start = time.perf_counter()
        with memory.watch() as peak:
            yield
            high = peak()
        self.figures[name] = {
            "seconds": round(time.perf_counter() - start, 3),
            "peak_mb": None if high is None else round(high / memory.MB, 1),
        }

    def runs(self, name: str) -> Callable[[int, int], None] | None:
        """``progress`` of a step made of runs (done, total)."""
        progress = self.progress
        return None if progress is None else (lambda done, total: progress(name, done, total))


def verify_run(
    pte: Path,
    model: torch.nn.Module,
    quantized_model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    io_params: dict[str, Any],
    target: str = "xnnpack",
    pictures: Path | None = None,
    *,
    tolerance: VerifyTolerance = DEFAULT_TOLERANCE,
    float_export: bool = False,
    delegates: Mapping[str, DelegateFn] | None = None,
    progress: Progress | None = None,
    steps: _Steps | None = None,
) -> VerifiedRun:
    """Runs the written ``pte`` on integer inputs made from the example inputs through
    ``io_params`` (an XNNPACK program in ``executorch.runtime``; a VGF program, which that
    runtime cannot run, in etkit's runner (``etkit_exporter.programs``) with its VGF delegates
    on the Vulkan device through ``scenario_runner``), dequantizes its outputs and compares each
    with the float model and with the quantized PT2E model: max abs error and PSNR, and for
    integer outputs against the quantized model the steps apart (max and histogram). With
    ``pictures`` (a folder), each image-like output gets ``verify_output_K.png`` there: float
    model, program, error heatmap (``etkit_exporter.check.pictures``), named in its float-model
    comparison as ``picture``.

    ``verification["verdict"]`` judges each output against the quantized PT2E model with
    ``tolerance`` (``check.judgement``; ``float_export``: the export is not quantized).
    ``delegates`` (backend id -> Python implementation, as ``PteProgram.register_delegate``
    takes) runs the program in etkit's runner with those implementations in place of the
    built-in ones, whatever the target: to verify a program against another implementation
    of a backend. ``progress(stage, done, total)`` hears of each stage as it starts (0, 0) and
    of each envelope run.

    Memory: the values are computed in the order the comparisons read them and dropped after;
    the envelope's runs keep their figures (``judgement.output_reducer``), not their outputs.
    ``verification["stages"]`` gives each stage's seconds and peak resident memory."""

    steps = _Steps(progress) if steps is None else steps
    with steps.step("program run"):
        inputs = [
            program_input(x, entry)
            for x, entry in zip(example_inputs, io_params["inputs"], strict=True)
        ]
        rows: list[dict[str, Any]] | None = None
        calls: list[Any] | None = None
        if target == "vgf" or delegates:
            raw, rows, calls = _run_in_etkit_runner(pte, inputs, delegates)
        else:
            raw = _run_in_executorch_runtime(pte, inputs)
        actual = [float_output(y, e) for y, e in zip(raw, io_params["outputs"], strict=True)]
    with steps.step("references"), torch.no_grad():
        before = memory.resident()
        with memory.watch() as forward_peak:
            quantized = _outputs(quantized_model(*example_inputs))
        forward = _working_set(before, forward_peak())
        comparisons = [
            *_compare(actual, _outputs(model(*example_inputs)), "float model", io_params,
                      pictures, quantized),
            *_compare(actual, quantized, QUANTIZED_MODEL, io_params, None, quantized),
        ]  # fmt: skip
    runner = RUNNERS["vgf"] if calls is not None else RUNNERS.get(target, "executorch.runtime")
    if delegates:
        runner += " with " + ", ".join(f"{k} by a given implementation" for k in delegates)
    verification: dict[str, Any] = {"runner": runner, "comparisons": comparisons}
    if rows is not None:
        verification["delegates"] = rows
    envelope = None
    if not float_export and isinstance(quantized_model, torch.fx.GraphModule):
        _require(forward, "the rounding envelope of the outputs (one quantized forward a run)")
        with steps.step("envelope of the outputs"):
            envelope = rounding_envelope(
                quantized_model,
                list(example_inputs),
                samples=tolerance.samples,
                band=tolerance.band,
                outputs=output_reducer(quantized, io_params["outputs"]),
                on_run=steps.runs("envelope of the outputs"),
            )
    verification["verdict"] = judge_outputs(
        actual, quantized, io_params["outputs"], tolerance, envelope=envelope,
        float_export=float_export,
    )  # fmt: skip
    if forward is not None:  # what one quantized forward needed: the unit of the estimates
        steps.figures["references"]["quantized_forward_mb"] = round(forward / memory.MB, 1)
    verification["stages"] = steps.figures
    return VerifiedRun(verification, inputs, [y.clone() for y in raw], calls)


QUANTIZED_MODEL: Final = "quantized PT2E model"


def _compare(
    actual: list[torch.Tensor],
    references: list[torch.Tensor],
    name: str,
    io_params: dict[str, Any],
    pictures: Path | None,
    quantized: list[torch.Tensor],
) -> list[dict[str, Any]]:
    """Each program output against ``references`` (the model called ``name``): max abs error
    and PSNR; against the quantized model, the steps apart; with ``pictures``, each image-like
    output's picture."""
    comparisons = []
    for index, (y, ref) in enumerate(zip(actual, references, strict=True)):
        y = y.contiguous().reshape(ref.shape)
        comparison: dict[str, Any] = {
            "output": index,
            "reference": name,
            "max_abs_error": float((y - ref).abs().max()),
            "psnr_db": psnr(y, ref),
        }
        entry = io_params["outputs"][index]
        if name == QUANTIZED_MODEL and entry["scale"] is not None:
            comparison.update(_steps(y, ref, entry))
        if pictures is not None and is_image_like(ref):
            picture = f"verify_output_{index}.png"
            db = comparison["psnr_db"]
            write_panel(
                pictures / picture,
                ref,
                y,
                f"output {index} vs the float model: PSNR "
                + ("inf" if db is None else f"{db:.2f} dB")
                + f", max abs error {comparison['max_abs_error']:.4g}",
                quantized=quantized[index],
                step=entry["scale"],
            )
            comparison["picture"] = picture
        comparisons.append(comparison)
    return comparisons


def _working_set(before: int | None, high: int | None) -> int | None:
    """What one forward needed beyond what the process held before it (bytes)."""
    if before is None or high is None:
        return None
    return max(high - before, 0)


def _require(forward: int | None, what: str) -> None:
    """Refuses, in one line, a stage of about one quantized forward's working set more than is
    free (``memory.require``)."""
    if forward is not None:
        memory.require(
            forward,
            what,
            "close other programs, or verify at a smaller size (--sizes or a smaller example "
            "input: the verdict judges the size it is given)",
        )


def verify_export(
    folder: Path,
    model: torch.nn.Module,
    quantized_model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    io_params: dict[str, Any],
    target: str = "xnnpack",
    *,
    tolerance: VerifyTolerance = DEFAULT_TOLERANCE,
    float_export: bool = False,
    delegates: Mapping[str, DelegateFn] | None = None,
    progress: Progress | None = None,
) -> VerifiedRun:
    """What ``export_model(verify=True)`` does with an export in ``folder`` (its ``model.pte``,
    ``etrecord.bin`` and ``etrecord.json``): ``verify_run`` (pictures into ``folder``); the
    coordinate rule on every delegate call output upstream of a sampler's grid; when an output
    or a coordinate fails its tolerance, the localization (``check.localization``): each
    delegate call against the quantized PT2E model's value of the same tensor, the first
    failing one in ``verification["verdict"]["divergence"]`` and every call in
    ``["delegate_calls"]``; then the Model Explorer per-node data. ``delegates`` and
    ``progress`` as in ``verify_run``."""

    steps = _Steps(progress)
    run = verify_run(
        folder / "model.pte", model, quantized_model, example_inputs, io_params, target,
        pictures=folder, tolerance=tolerance, float_export=float_export, delegates=delegates,
        progress=progress, steps=steps,
    )  # fmt: skip
    verdict = run.verification["verdict"]
    forward = steps.figures["references"].get("quantized_forward_mb")
    if forward is not None:
        _require(int(forward * memory.MB), "the coordinate rule and the localization")
    with steps.step("coordinates and localization"):
        found = judge_calls(
            folder, tolerance, run.delegate_calls, io_params, float_export=float_export,
            localize=verdict["result"] == "fail", progress=progress,
        )  # fmt: skip
    verdict["coordinates"] = found.coordinates
    wrong_places = [c for c in found.coordinates if not c["passes"]]
    if wrong_places:
        verdict["result"] = "fail"
        verdict["failing_coordinates"] = [c["node"] for c in wrong_places]
    if verdict["result"] == "fail":
        verdict["divergence"] = found.first
        verdict["delegate_calls"] = found.rows
        if found.note is not None:
            verdict["localization_note"] = found.note
    with steps.step("model explorer data"):
        write_node_data(folder, run.verification)  # Model Explorer per-node data, per delegate
    run.verification["stages"] = steps.figures
    return run
