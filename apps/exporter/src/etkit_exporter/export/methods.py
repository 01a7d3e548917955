"""An export of several sizes (``export.sizes``): its methods, built by the pipeline's own
stages at each size; the one program that holds them; what the extra methods cost in bytes; and
the verification of every method, or of a range at the sizes that judge it.

- Enumerated sizes: one method per size, each captured, quantized and lowered at its size, in
  one ``.pte`` (ExecuTorch's multi-method program: constants outside the delegates and delegate
  blobs are stored once when equal, XNNPACK's weights are named data keyed by their hash). Every
  size is quantized with the observer states of the one calibration, at the calibration
  samples' size (``etkit_quant.observers``), so every method has the same quantization
  parameters, weights and biases: XNNPACK's weights are stored once, and the IO parameters are
  the same for every method.
- A range: one method; nothing more to build.

Verification of a method other than ``forward`` runs ``verify_export`` on that method's own
program (the method alone, lowered by the same stages, with its own ETRecord) in a scratch
folder, then requires the written program's method to return exactly that program's outputs on
the same inputs: the verdict holds for the method as written. That ETRecord, its Model Explorer
node data and pictures are kept in the export's ``methods/<method>/``."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from executorch.exir import EdgeProgramManager
from executorch.exir._serialize._program import deserialize_pte_binary

from etkit_exporter.artifact.etrecord import write_etrecord
from etkit_exporter.check.bundle import BundleCase
from etkit_exporter.check.verify import VerifiedRun, verify_export, verify_run
from etkit_exporter.core.io_params import with_pte_layouts
from etkit_exporter.export.lowering import strip_build_paths
from etkit_exporter.export.sizes import Size, SizePlan, resize_inputs, size_text
from etkit_exporter.programs import load_program
from etkit_exporter.programs.runtime import runtime_method

logger = logging.getLogger(__name__)


@dataclass
class Method:
    """One method of the program: its name and size, the inputs it was captured on, and the
    pipeline's ``_Quantized`` and ``_Lowered`` of it."""

    name: str
    size: Size
    inputs: tuple[torch.Tensor, ...]
    quantized: Any
    lowered: Any
    io_params: dict[str, Any] = field(default_factory=dict)


# quantize(inputs, stages, calibrated, folder name) and lower(quantized, inputs, stages): the
# pipeline's stages for one size (``calibrated``: the example size's, whose quantizer and
# observer states serve this size; ``None`` at the example size itself).
Quantize = Callable[[tuple[torch.Tensor, ...], Any, Any, str | None], Any]
Lower = Callable[[Any, tuple[torch.Tensor, ...], Any], Any]


def build_methods(
    plan: SizePlan | None,
    inputs: tuple[torch.Tensor, ...],
    stages: Any,
    quantize: Quantize,
    lower: Lower,
) -> list[Method]:
    """The program's methods, ``forward`` first. Without sizes or for a range: ``forward`` on
    the example inputs. Enumerated: the calibration samples' size (``plan.calibrated``: one of
    the listed sizes or the example's) is calibrated first, on the example inputs resized to
    it (and is that size's method when it is listed), then every other size is captured on the
    example inputs resized to it and quantized with those observer states (no calibration of
    its own);
    ``forward`` is the first size's method, ``forward_HxW`` each other size's."""
    if plan is None or not plan.enumerated:
        quantized = quantize(inputs, stages, None, None)
        return [Method("forward", plan.example if plan else (0, 0), inputs, quantized,
                       lower(quantized, inputs, stages))]  # fmt: skip
    at_calibration = resize_inputs(inputs, plan, plan.calibrated)
    label = None if plan.calibrated == plan.example else size_text(plan.calibrated)
    calibrated = quantize(at_calibration, stages.at(label) if label else stages, None, None)
    methods = []
    for name, size in plan.methods():
        if size == plan.calibrated:
            at = stages.at(label) if label else stages
            methods.append(Method(name, size, at_calibration, calibrated,
                                  lower(calibrated, at_calibration, at)))  # fmt: skip
            continue
        at = stages.at(size_text(size))
        resized = resize_inputs(inputs, plan, size)
        quantized = quantize(resized, at, calibrated, None if name == "forward" else name)
        methods.append(Method(name, size, resized, quantized, lower(quantized, resized, at)))
    return methods


def combined_program(methods: Sequence[Method]) -> EdgeProgramManager:
    """One ``EdgeProgramManager`` holding every method's lowered program (the first is
    ``forward``), with ``forward``'s IO-parameter methods (``input0_scale``, ...)."""
    first = methods[0].lowered.manager
    programs = {m.name: m.lowered.manager.exported_program() for m in methods}
    return EdgeProgramManager(
        programs,
        constant_methods=dict(first._config_methods or {}),
        compile_config=first.compile_config,
    )


def program_buffer(methods: Sequence[Method], forward: Any) -> bytes:
    """The program to write: ``forward`` (its ``ExecutorchProgramManager``) alone for one
    method, else every method in one program (``combined_program``), build paths stripped."""
    if len(methods) <= 1:
        return bytes(forward.buffer)
    for method in methods:
        strip_build_paths(method.lowered.manager.exported_program())
    return bytes(combined_program(methods).to_executorch().buffer)


def add_method_io(io_params: dict[str, Any], methods: Sequence[Method], pte: bytes) -> None:
    """With several methods, io_quant_params.json's ``methods``: per method its size and IO
    table with the layouts its method in ``pte`` has (the same quantization parameters in every
    method: one calibration serves them all); each ``Method.io_params`` set to its table."""
    if len(methods) <= 1:
        return
    tables: dict[str, Any] = {}
    for method in methods:
        table = with_pte_layouts(method.lowered.io_params, pte, method.name)
        method.io_params = table
        tables[method.name] = {"size": size_text(method.size), **table}
    io_params["methods"] = tables


def program_bytes(methods: Sequence[Method], pte: bytes, target: str) -> dict[str, Any]:
    """What the extra methods cost: the bytes of the written program, of each method's program
    alone (the method lowered by itself, serialized alone) and their ratio to the largest; the
    bytes the methods share (stored once: the sum of the methods alone less the program); and
    whether the weights are shared: XNNPACK's are named data keyed by their hash, stored once
    for every method that quantizes them to the same bytes (``named_data``: the entries); a
    VGF holds its weights compiled in, so each method's VGF carries its own."""
    alone = {m.name: len(m.lowered.manager.to_executorch().buffer) for m in methods}
    largest = max(alone.values(), default=len(pte))
    if target == "vgf":
        weights = "not shared: each method's VGF holds its weights compiled in"
    else:
        entries = len(deserialize_pte_binary(pte).named_data.pte_data)
        weights = f"shared: {entries} named data entries stored once for every method"
    return {
        "program": len(pte),
        "methods_alone": alone,
        "largest_alone": largest,
        "ratio_to_largest": round(len(pte) / largest, 4) if largest else None,
        "shared_bytes": sum(alone.values()) - len(pte),
        "weights": weights,
    }


def _outputs(pte: Path, method: str, inputs: list[torch.Tensor], target: str) -> list[Any]:
    """``method`` of ``pte`` run on ``inputs`` as verification runs it: XNNPACK in
    ``executorch.runtime``, VGF in etkit's runner."""
    if target == "vgf":
        return list(load_program(pte).run(inputs, method).outputs)
    loaded = runtime_method(pte, method)
    if loaded is None:
        raise RuntimeError(f"{pte} has no method {method!r}")
    return list(loaded.execute(inputs))


def why_different(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> str | None:
    """Why two runs' tensors differ (``None`` when each is equal, bit for bit); as many of
    each."""
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {k} is {x.dtype} {list(x.shape)} against {y.dtype} {list(y.shape)}"
        if not torch.equal(x.contiguous(), y.contiguous()):
            return f"output {k}: {int((x != y).sum())} of {x.numel()} values differ"
    return None


def sizes_section(
    work: Path,
    model: torch.nn.Module,
    methods: Sequence[Method],
    plan: SizePlan | None,
    target: str,
    verification: dict[str, Any] | None,
    io_params: dict[str, Any],
    stage: Callable[[str], Any],
    *,
    tolerance: Any,
    float_export: bool,
    intermediates: Path,
    full_record: bool = False,
) -> tuple[dict[str, Any] | None, list[BundleCase]]:
    """report.json's ``sizes`` (``None`` without sizes): the plan, the bytes the methods
    cost, and with a verification (``forward``'s) every other method or size judged too (stage
    ``verify_sizes``; a failing one fails ``verification``'s verdict; each method's records
    kept in ``methods/<method>/``), without one each other method's ETRecord written there
    (``records``: method -> paths); and the verified runs of those other methods or sizes as
    test cases for a bundle."""
    if plan is None:
        return None, []
    section = plan.as_dict()
    if len(methods) > 1:
        section["bytes"] = program_bytes(methods, (work / "model.pte").read_bytes(), target)
    cases: list[BundleCase] = []
    if verification is None and len(methods) > 1:
        with stage("etrecord_methods"):  # what verification would keep, less its pictures
            section["records"] = write_method_records(
                work, methods[1:], intermediates, full_record=full_record
            )
    if verification is not None:
        with stage("verify_sizes"):
            entries, cases = verify_sizes(
                work, model, methods, plan, target, verification, io_params,
                tolerance=tolerance, float_export=float_export, intermediates=intermediates,
                full_record=full_record,
            )  # fmt: skip
            section["verified"] = entries
    return section, cases


def verify_sizes(
    work: Path,
    model: torch.nn.Module,
    methods: Sequence[Method],
    plan: SizePlan,
    target: str,
    verification: dict[str, Any],
    io_params: dict[str, Any],
    *,
    tolerance: Any,
    float_export: bool,
    intermediates: Path,
    full_record: bool = False,
) -> tuple[list[dict[str, Any]], list[BundleCase]]:
    """Every method (enumerated) or the range's verification sizes judged as ``forward`` was
    (``verification``, the forward's, is that of the example size); returns the report's
    per-size entries and each judged run as a test case (the written program's inputs and
    outputs), and marks ``verification``'s verdict failed when any fails."""
    pte = work / "model.pte"
    entries: list[dict[str, Any]] = []
    cases: list[BundleCase] = []
    forward = methods[0]
    verdict = verification.get("verdict") or {}
    entries.append(_entry(forward.name, forward.size, verdict, "the export's verification"))
    if plan.dynamic is not None:
        for size in plan.dynamic.verification_sizes(plan.example):
            if size == plan.example:
                continue
            resized = resize_inputs(forward.inputs, plan, size)
            run = verify_run(
                pte, model, forward.quantized.converted, resized, io_params, target,
                tolerance=tolerance, float_export=float_export,
            )  # fmt: skip
            entries.append(
                _entry("forward", size, run.verification["verdict"], "verify_run at this size")
            )
            cases.append(BundleCase("forward", list(run.inputs), list(run.outputs)))
    else:
        for method in methods[1:]:
            entry, case = _verify_method(
                pte, model, method, target, tolerance, float_export, intermediates, full_record
            )
            entries.append(entry)
            cases.append(case)
    failing = [e for e in entries if e["result"] == "fail"]
    if failing and verdict:
        verdict["result"] = "fail"
        verdict["failing_sizes"] = [f"{e['method']} at {e['size']}" for e in failing]
        if not verdict.get("divergence"):  # the verdict's words name what failed: these sizes
            verdict["localization_note"] = "; ".join(_failure_text(e) for e in failing)
    return entries, cases


def _failure_text(entry: dict[str, Any]) -> str:
    """A failing size in one clause: the method, the size and why (report.json's
    ``sizes.verified`` holds the figures)."""
    if "differs" in entry:
        why = entry["differs"]
    else:
        why = (
            ", ".join(
                f"output {k}: {o.get('psnr_db') or 'inf'} dB, {o.get('max_steps')} steps max"
                for k, o in enumerate(entry["outputs"])
                if not o.get("passes", True)
            )
            or "its verdict failed"
        )
    return f"{entry['method']} at {entry['size']} fails ({why}; report.json's sizes.verified)"


def _entry(method: str, size: Size, verdict: dict[str, Any], how: str) -> dict[str, Any]:
    outputs = verdict.get("outputs") or []
    return {
        "method": method,
        "size": size_text(size),
        "result": verdict.get("result", "none"),
        "how": how,
        "outputs": [
            {k: o.get(k) for k in ("psnr_db", "max_steps", "passes") if k in o} for o in outputs
        ],
    }


def _verify_method(
    pte: Path,
    model: torch.nn.Module,
    method: Method,
    target: str,
    tolerance: Any,
    float_export: bool,
    intermediates: Path,
    full_record: bool = False,
) -> tuple[dict[str, Any], BundleCase]:
    """``method`` verified on its own program in a scratch folder (``verify_export``: the
    verdict, and where a failing one diverges), then the written program's method held to that
    program's outputs, bit for bit. Returns the report's entry and the written method's run as
    a test case."""
    with tempfile.TemporaryDirectory(prefix=f"etkit-{method.name}-") as scratch:
        folder = Path(scratch)
        manager = method.lowered.manager.to_executorch()
        (folder / "model.pte").write_bytes(manager.buffer)
        write_etrecord(
            folder, manager, method.inputs, float_program=method.quantized.exported,
            forbidden_paths=[folder, intermediates], full=full_record,
        )  # fmt: skip
        run = verify_export(
            folder, model, method.quantized.converted, method.inputs, method.io_params, target,
            tolerance=tolerance, float_export=float_export,
        )  # fmt: skip
        entry = _entry(method.name, method.size, run.verification["verdict"], "verify_export")
        entry["records"] = _keep_records(folder, pte.parent / METHODS_FOLDER / method.name)
        written = _outputs(pte, method.name, list(run.inputs), target)
        why = why_different(written, run.outputs)
        if why is not None:
            entry.update(result="fail", differs=f"the written program's method: {why}")
        else:
            entry["written_method"] = "returns the verified program's outputs, bit for bit"
    return entry, BundleCase(method.name, list(run.inputs), list(written))


METHODS_FOLDER = "methods"
# What a method's own verification writes that covers it as forward's cover forward: its
# ETRecord (ExecuTorch's Inspector, etkit inspect), Model Explorer node data and pictures.
_RECORDS = ("etrecord.bin", "etrecord.json", "model_explorer_node_data*.json", "verify_*.png")


def write_method_records(
    work: Path, methods: Sequence[Method], intermediates: Path, *, full_record: bool = False
) -> dict[str, list[str]]:
    """Each of ``methods``' ETRecord (``etrecord.bin``, ``etrecord.json``) of its own program
    (the method alone, as ``_verify_method`` writes it) in ``work``'s ``methods/<method>/``, so
    that ExecuTorch's Inspector and ``etkit inspect`` cover every method of an export made
    without verification too; returns each method's paths relative to ``work``."""
    kept: dict[str, list[str]] = {}
    for method in methods:
        with tempfile.TemporaryDirectory(prefix=f"etkit-{method.name}-") as scratch:
            folder = Path(scratch)
            write_etrecord(
                folder, method.lowered.manager.to_executorch(), method.inputs,
                float_program=method.quantized.exported,
                forbidden_paths=[folder, work, intermediates], full=full_record,
            )  # fmt: skip
            kept[method.name] = _keep_records(folder, work / METHODS_FOLDER / method.name)
    return kept


def _keep_records(scratch: Path, destination: Path) -> list[str]:
    """Copies ``_RECORDS`` of a method's verification folder into ``destination`` (the export's
    ``methods/<method>/``); returns their paths relative to the export's folder."""
    destination.mkdir(parents=True, exist_ok=True)
    kept: list[str] = []
    for pattern in _RECORDS:
        for path in sorted(scratch.glob(pattern)):
            (destination / path.name).write_bytes(path.read_bytes())
            kept.append(f"{METHODS_FOLDER}/{destination.name}/{path.name}")
    return kept


def check_methods_load(pte: Path, methods: Sequence[Method], target: str) -> None:
    """Each of ``methods`` of the written program loads as ``forward`` does
    (``check_program_loads``): XNNPACK in ``executorch.runtime`` (building its operators), VGF
    as far as etkit's runner checks without running it."""
    for method in methods:
        if target == "vgf":
            load_program(pte).check(method.name)
        elif runtime_method(pte, method.name) is None:
            raise RuntimeError(f"executorch.runtime finds no method {method.name!r} in {pte}")


# Why a size range's program is judged on its outputs alone (verify_run at each size).
RANGE_NOTE = (
    "a size range's delegate calls are not judged one by one: the verdict reads fixed sizes "
    "from the ETRecord's graph (check.coordinates), and a range's has symbolic ones; its "
    "outputs are judged at every verification size"
)


def verifier(dynamic: Any, verify: Callable[..., VerifiedRun]) -> Callable[..., VerifiedRun]:
    """``verify`` (``verify_export``) for a program of fixed sizes. For a size range (its
    ``dynamic`` shapes given): ``verify_run`` on the export's program with its pictures, the
    verdict on every output, its ``localization_note`` saying why the calls are not judged
    (``RANGE_NOTE``)."""
    if not dynamic:
        return verify

    def on_outputs(
        folder: Path,
        model: torch.nn.Module,
        quantized_model: torch.nn.Module,
        example_inputs: tuple[torch.Tensor, ...],
        io_params: dict[str, Any],
        target: str,
        **kwargs: Any,
    ) -> VerifiedRun:
        run = verify_run(
            folder / "model.pte", model, quantized_model, example_inputs, io_params, target,
            pictures=folder, **kwargs,
        )  # fmt: skip
        run.verification["verdict"]["localization_note"] = RANGE_NOTE
        return run

    return on_outputs
