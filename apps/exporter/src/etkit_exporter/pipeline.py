"""``export_model``: the pipeline of design.md, from a PyTorch model to a deployable,
integer-IO ExecuTorch program with its artifacts and report."""

from __future__ import annotations

import errno
import functools
import json
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import torch
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter import __version__
from etkit_exporter.artifacts import Staging, check_destination
from etkit_exporter.diagnostics import root_cause
from etkit_exporter.provenance import shared_provenance
from etkit_quant import (
    BoundaryQuantizer,
    ObservedRange,
    Saturation,
    boundary_fixed_qspecs,
    check_calibration,
    clipping_report,
    default_qspecs,
    describe_qspec,
    fixed_qparams,
    is_fixed,
    observe_ranges,
    saturation_report,
)
from etkit_quant.graph import is_grid_sampler

if TYPE_CHECKING:
    from etkit_exporter.verdict import VerifyTolerance

logger = logging.getLogger(__name__)

TARGETS: Final = ("vgf", "xnnpack")
VGF_TOSA_SPEC: Final = "TOSA-1.0+INT+FP+int16"
StageCallback = Callable[[str, float], None]


class ExportError(RuntimeError):
    """The export failed in one of its stages; the message names the stage."""


class QspecCountError(ValueError):
    """Not one qspec per input (``boundary`` "input") or per output ("output"): ``given`` of
    them for ``count``."""

    def __init__(self, boundary: str, given: int, count: int) -> None:
        self.boundary, self.given, self.count = boundary, given, count
        super().__init__(
            f"{boundary}_qspecs has {given} entries but the model has {count} "
            f"{'user inputs' if boundary == 'input' else 'outputs'}; give one qspec (or None) "
            f"per {boundary}"
        )


@dataclass
class ExportResult:
    """What ``export_model`` made."""

    edge_program: ExportedProgram
    example_inputs: tuple[torch.Tensor, ...]
    io_quant_params: dict[str, Any]
    pte_path: Path
    report: dict[str, Any]
    artifacts_root: Path
    verification: dict[str, Any] | None = None
    converted_model: torch.nn.Module | None = field(default=None, repr=False)
    saturation: tuple[Saturation, ...] = ()


class _Calibrated:
    """The default of a grid-sampler qspec: chosen from the calibration data."""

    def __repr__(self) -> str:
        return "CALIBRATED"


CALIBRATED: Final = _Calibrated()
SamplerQSpec: TypeAlias = "QuantizationSpec | _Calibrated | None"


@dataclass(frozen=True)
class _QuantOptions:
    enabled: bool
    inputs: tuple[QuantizationSpec | None, ...] | None
    outputs: tuple[QuantizationSpec | None, ...] | None
    sampler_image: SamplerQSpec
    sampler_grid: SamplerQSpec
    sampler_output: SamplerQSpec
    samples: tuple[tuple[torch.Tensor, ...], ...]
    on_sample: Callable[[int, int], None] | None
    grid_math: str = "float"


def _check_arguments(
    model: object,
    example_inputs: object,
    target: object,
) -> tuple[torch.Tensor, ...]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}"
        )
    if not example_inputs:
        raise ValueError("example_inputs is empty: the model needs at least one input")
    for index, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{index}] must be a torch.Tensor, got {type(value).__name__}"
            )
        check_example_tensor(value, f"example_inputs[{index}]")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return example_inputs


def check_tosa_spec(tosa_spec: object, target: str, quantized: bool) -> str:
    """The TOSA specification to lower to, checked (``VGF_TOSA_SPEC`` when ``None``)."""
    if tosa_spec is None:
        return VGF_TOSA_SPEC
    if not isinstance(tosa_spec, str):
        raise TypeError(f"tosa_spec must be a string such as {VGF_TOSA_SPEC!r}")
    if target != "vgf":
        raise ValueError(f"tosa_spec applies to target 'vgf' only, not {target!r}")
    from executorch.backends.arm.tosa import TosaSpecification

    try:
        parsed = TosaSpecification.create_from_string(tosa_spec)
    except ValueError as error:
        raise ValueError(
            f"tosa_spec {tosa_spec!r} is not a TOSA specification ({error}); e.g. {VGF_TOSA_SPEC!r}"
        ) from None
    if quantized and not parsed.support_integer():
        raise ValueError(
            f"tosa_spec {tosa_spec!r} has no INT profile, and a quantized export lowers integer "
            f"operators: add +INT (e.g. {VGF_TOSA_SPEC!r}) or export with quantization off"
        )
    return tosa_spec


def _check_extra_artifacts(extra: object) -> dict[str, bytes]:
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra_artifacts must map file names to bytes, got {type(extra).__name__}")
    reserved = {
        "model.pte", "model.bpte", "model.bpte.json", "io_quant_params.json", "report.json",
        "report.md", "intermediates", "etrecord.bin", "etrecord.json", "scenario", "timings.json",
    }  # fmt: skip
    checked = {}
    for name, data in extra.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"extra_artifacts name {name!r} must be a plain file name")
        if name in reserved or name.startswith("etkit-") or name.startswith("verify_output_"):
            raise ValueError(f"extra_artifacts name {name!r} is one etkit writes itself")
        if not isinstance(data, bytes):
            raise TypeError(f"extra_artifacts[{name!r}] must be bytes, got {type(data).__name__}")
        checked[name] = data
    return checked


def check_example_tensor(value: torch.Tensor, what: str) -> None:
    """Refuses a tensor an export cannot take as an example or calibration input: not a dense
    CPU tensor, a float type other than float32, NaN or infinite values. The error names
    ``what`` and says what to give instead."""
    if value.device.type != "cpu" or value.layout != torch.strided:
        raise TypeError(
            f"{what} is a {value.device.type} tensor with layout {value.layout}; give a dense "
            "CPU tensor (.to('cpu'), .to_dense())"
        )
    if value.dtype.is_floating_point and value.dtype != torch.float32:
        raise TypeError(
            f"{what} is {str(value.dtype).removeprefix('torch.')}; etkit exports float32 "
            "models: convert the model and its inputs with .float()"
        )
    if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise ValueError(
            f"{what} holds {bad} NaN or infinite values; quantization parameters and "
            "verification need finite data: give finite values"
        )


def _check_forward(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Runs the model once on its example inputs, so that inputs of the wrong number, rank or
    shape fail here with the model's own error rather than deep inside ``torch.export``."""
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as error:
        shapes = ", ".join("x".join(map(str, x.shape)) or "scalar" for x in inputs)
        raise ValueError(
            f"the model's forward fails on the example inputs ({shapes}): {root_cause(error)}; "
            "give inputs of the number and shapes its forward takes"
        ) from error


def _check_grid_samplers(program: ExportedProgram) -> None:
    for node in program.graph.nodes:
        image = node.args[0] if is_grid_sampler(node) else None
        value = image.meta.get("val") if isinstance(image, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() != 4:
            raise ValueError(
                f"{node.name} samples a {value.dim()}-D input ({'x'.join(map(str, value.shape))}):"
                " etkit exports 2-D grid_sample only (image N x C x H x W, grid N x Ho x Wo x 2);"
                " reshape volumes into batches of 2-D images"
            )


class _Stages:
    def __init__(self, callback: StageCallback | None) -> None:
        self.timings: dict[str, float] = {}
        self.callback = callback

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except Exception as error:
            raise ExportError(f"stage '{name}' failed: {root_cause(error)}") from error
        seconds = time.perf_counter() - start
        self.timings[name] = round(seconds, 3)
        if self.callback is not None:
            self.callback(name, seconds)


def _keeps_train_mode(export: Callable[..., ExportResult]) -> Callable[..., ExportResult]:
    """``export``, leaving the caller's model in the train/eval mode of each of its modules as
    it was (an export runs it in eval mode)."""

    @functools.wraps(export)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> ExportResult:
        modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
        modes = [m.training for m in modules]
        try:
            return export(model, *args, **kwargs)
        finally:
            for module, training in zip(modules, modes, strict=True):
                module.training = training

    return wrapper


@_keeps_train_mode
def export_model(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    artifacts_root: str | Path = "artifacts",
    intermediate_artifacts_root: str | Path | None = None,
    quantized_input_qspecs: Sequence[QuantizationSpec | None] | None = None,
    quantized_output_qspecs: Sequence[QuantizationSpec | None] | None = None,
    grid_sampler_image_qspec: SamplerQSpec = CALIBRATED,
    grid_sampler_grid_qspec: SamplerQSpec = CALIBRATED,
    grid_sampler_output_qspec: SamplerQSpec = CALIBRATED,
    quantize_grid_sample_output: bool = True,
    calibration: Iterable[tuple[torch.Tensor, ...]] | None = None,
    enable_pt2e_quantization: bool = True,
    target: str = "vgf",
    tosa_spec: str | None = None,
    verify: bool = False,
    verify_tolerance: VerifyTolerance | str | None = None,
    bundle: bool = False,
    scenario: bool = False,
    sampler_delegate: bool = False,
    grid_math: str = "float",
    force: bool = False,
    on_stage: StageCallback | None = None,
    on_calibration_sample: Callable[[int, int], None] | None = None,
    extra_artifacts: Mapping[str, bytes] | None = None,
) -> ExportResult:
    """Exports ``model`` to an ExecuTorch program for ``target`` ("vgf": VGF plus etkit's grid
    sampler; "xnnpack": XNNPACK plus etkit's grid sampler), writing under ``artifacts_root``:
    ``model.pte``, ``io_quant_params.json``, ``report.json``, ``report.md`` and the VGF/TOSA
    intermediates (under ``intermediate_artifacts_root``, default ``artifacts_root/intermediates``).

    Quantization (``enable_pt2e_quantization``) is calibrated on ``calibration`` (an iterable of
    input tuples shaped like ``example_inputs``; the example inputs alone when ``None``). One
    qspec per input and per output (``None``: that boundary stays float); the grid samplers'
    image, grid and output qspecs (``None``: float; ``quantize_grid_sample_output=False`` is
    ``grid_sampler_output_qspec=None``). Each left at its default (``CALIBRATED``) is chosen
    from the calibration data (``etkit_quant.default_qspecs``): SNORM8 for values in [-1, 1],
    SNORM16 for grids in [-1, 1], a power-of-two int16 scale covering wider grids, observed int8
    parameters for anything else, so no default clips. Every fixed-parameter boundary and sampler
    input gets a saturation record (``result.saturation``, report.json/.md, a logged warning past
    0.1 %). ``tosa_spec`` (target "vgf"): the TOSA specification VGF lowers to (default
    ``VGF_TOSA_SPEC``; a quantized export needs INT, int16 grids the int16 extension).
    ``grid_math``: "float" (default) computes the coordinate arithmetic (the elementwise and
    shape ops between the last compute-heavy op and a grid sampler's grid input: base grid plus
    flow, scaling to [-1, 1], ``affine_grid``) in float, quantized once, at the sampler, and
    every layer before it in integers; "int" quantizes the coordinate arithmetic too. Every op
    the lowered program runs in float is listed in the report (``float_ops``), and a conv,
    linear or matmul in float is warned about.
    ``extra_artifacts``: more files (name -> bytes) written into the artifacts folder and
    listed in its manifest, such as the CLI's ``export.toml``. ``verify`` (target "xnnpack")
    runs the program in ``executorch.runtime`` and compares it with the float and the quantized
    model (target "vgf": in ``etkit_exporter.runner``, its VGF delegates run by
    ``scenario_runner`` on the Vulkan device), and judges each output against the quantized
    model with ``verify_tolerance`` (``etkit_exporter.verdict.VerifyTolerance`` or its text;
    the README's "Verification verdict"; giving one implies ``verify``): a failure raises
    ``VerificationError`` naming the failing outputs and the first delegate call that
    diverges, and the export is kept in ``artifacts_root.failed-verification``, never at
    ``artifacts_root``. Every export loads the program it wrote before it succeeds (stage
    ``load``). ``bundle`` (implies ``verify``) also writes ``model.bpte``: the program with the
    example inputs in its IO types and, as expected outputs, what it returned on them in that
    verified run; ``model.bpte.json`` beside it says so and gives the tolerance
    (``etkit_exporter.bundle``). ``scenario`` (target "vgf") also writes ``scenario/``: the
    whole program as one Vulkan scenario for ``scenario_runner``
    (``etkit_exporter.scenario_export``; a program it cannot express gets none, the report's
    ``scenario`` section saying why). ``sampler_delegate`` (target "vgf"): keep the grid
    samplers in etkit's own delegate between VGF delegates; by default each sampler the integer
    contract covers is a compute segment inside the VGF (``etkit_gridsampler.vgf_shader``), the
    report's ``grid_sampler_paths`` saying where each went.

    Everything is checked before any work (``TypeError``/``ValueError``/``FileExistsError``;
    ``etkit_exporter.artifacts.DestinationError``, a ``ValueError``, for an ``artifacts_root``
    etkit will not write or replace; calibration samples are checked one by one, the error naming
    the sample and input). ``force`` replaces an earlier etkit export, never anything else (see
    ``etkit_exporter.artifacts``). Artifacts are written to a staging folder beside
    ``artifacts_root`` and swapped into place at the end, so a kill at any instant leaves the
    previous export or the new one; a failing stage raises ``ExportError`` naming it (a full disk
    says so) and leaves nothing behind."""
    root = Path(artifacts_root)
    inputs = _check_arguments(model, example_inputs, target)
    spec = check_tosa_spec(tosa_spec, target, enable_pt2e_quantization)
    if scenario and target != "vgf":
        raise ValueError(f"scenario applies to target 'vgf' only, not {target!r}")
    extras = _check_extra_artifacts(extra_artifacts)
    from etkit_exporter.verdict import check_tolerance, failed_destination, keep_failed

    tolerance = check_tolerance(verify_tolerance)
    verify = verify or bundle or verify_tolerance is not None  # each implies a verification
    _check_forward(model.eval(), inputs)
    quant = _QuantOptions(
        enabled=enable_pt2e_quantization,
        inputs=_check_qspec_list(quantized_input_qspecs, "quantized_input_qspecs"),
        outputs=_check_qspec_list(quantized_output_qspecs, "quantized_output_qspecs"),
        sampler_image=grid_sampler_image_qspec,
        sampler_grid=grid_sampler_grid_qspec,
        sampler_output=grid_sampler_output_qspec if quantize_grid_sample_output else None,
        samples=tuple(check_calibration(calibration, inputs)),
        on_sample=on_calibration_sample,
        grid_math=_check_grid_math(grid_math),
    )
    if quant.enabled:
        _refuse_unsigned(quant)
    destination = check_destination(root, force)
    failed = failed_destination(root, force) if verify else None
    for note in destination.notes:
        logger.warning("%s", note)
    stages = _Stages(on_stage)
    try:
        with _sigterm_as_exit(), Staging(destination) as staging, shared_provenance():
            result = _run(
                model.eval(),
                inputs,
                staging.path,
                Path(intermediate_artifacts_root) if intermediate_artifacts_root else None,
                quant,
                target,
                spec,
                verify,
                bundle,
                stages,
                scenario,
                sampler_delegate=sampler_delegate,
                tolerance=tolerance,
            )
            for name, data in extras.items():
                (staging.path / name).write_bytes(data)
            producer = {"tool": "etkit-exporter", "version": __version__}
            if failed is not None and result.verification is not None:
                keep_failed(staging, failed, force, producer, result.verification, root)
            staging.commit(force, producer=producer)
    except (ExportError, OSError) as error:
        full = _disk_full(error)
        if full is None:
            raise
        raise ExportError(
            f"the disk is full: no space left on the device holding {destination.path.parent} "
            f"({full.strerror}); nothing was written and {root} is as it was before; free some "
            "space and export again"
        ) from error
    result.artifacts_root = root
    result.pte_path = root / "model.pte"
    return result


def _disk_full(error: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error in ``error``'s chain of causes, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (so the staging folder is removed) and exits 143; only where
    SIGTERM has its default action and on the main thread, as Python allows."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    work: Path,
    intermediates_root: Path | None,
    quant: _QuantOptions,
    target: str,
    tosa_spec: str,
    verify: bool,
    bundle: bool,
    stages: _Stages,
    scenario: bool = False,
    sampler_delegate: bool = False,
    tolerance: Any = None,
) -> ExportResult:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.passes.quantize_io_pass import extract_io_quant_params

    from etkit_exporter.activation_bounds import keep_activation_bounds
    from etkit_exporter.io_params import io_table, with_pte_layouts
    from etkit_exporter.report import build_report, write_report
    from etkit_gridsampler import GridSamplerBackend, GridSamplerPartitioner
    from etkit_gridsampler.call_sites import check_call_sites
    from etkit_layout import channels_last, pad_rgb_to_rgba, pin_delegate_layouts
    from etkit_partition import (
        DetagInputQuantize,
        DetagOps,
        DetagOutputDequantize,
        DetagQuantizedPads,
        DetagQuantizeDtypes,
        PolicyPartitioner,
    )
    from etkit_quant import quantize as quantize_model

    intermediates = intermediates_root or work / "intermediates"
    intermediates.mkdir(parents=True, exist_ok=True)
    with stages.stage("capture"):
        exported = torch.export.export(model, inputs, strict=True)
        num_outputs = len(exported.graph_signature.user_outputs)
        _check_grid_samplers(exported)
    with stages.stage("normalize"):  # library-built graphs made to look hand-written
        from etkit_quant.normalize import normalize_program

        exported, _normalized = normalize_program(exported, inputs)
    base, partitioner, spec = _backend(target, intermediates, tosa_spec)
    quantizer = None
    saturations: tuple[Saturation, ...] = ()
    coordinates: dict[str, Any] = {}
    if quant.enabled:
        for given, count, what in (
            (quant.inputs, len(inputs), "input"),
            (quant.outputs, num_outputs, "output"),
        ):
            if given is not None and len(given) != count:
                raise QspecCountError(what, len(given), count)
        with stages.stage("observe_ranges"):
            quantizer, saturations, coordinates = _boundary_quantizer(
                exported, base, quant, len(inputs)
            )
        for record in saturations:
            if not record.passes():
                logger.warning("saturation: %s", record.message())
    ins, outs = (quantizer.input_qspecs, quantizer.output_qspecs) if quantizer else ((), ())
    with stages.stage("rgb_to_rgba"):
        graph = exported.module(check_guards=False)
        pad_rgb_to_rgba(graph)
    converted: torch.nn.Module = graph
    if quantizer is not None:
        with stages.stage("quantize"):
            converted = quantize_model(
                graph, inputs, quantizer, calibration=quant.samples, on_sample=quant.on_sample
            )
            # What the backend's quantizer chose inside the graph may clip too (one scale
            # shared over a concatenation with a fixed-range input): never silently.
            clipped = clipping_report(
                converted,
                quant.samples or (inputs,),
                fixed=boundary_fixed_qspecs(quantizer),
                watch=quantizer.coordinate_inputs,  # a predicted flow: reported, clipping or not
            )
        for record in clipped:
            if record.count:  # a watched tensor is reported even when nothing clips
                logger.warning("saturation: %s", record.message())
        saturations += clipped
    with stages.stage("re_export"):
        program = torch.export.export(converted, inputs, strict=True)
    quantized_inputs = [k for k, q in enumerate(ins) if q is not None]
    quantized_outputs = [k for k, q in enumerate(outs) if q is not None]
    # VGF: each sampler the integer contract covers becomes a compute segment of the VGF
    # (etkit's shader); the others, and all with sampler_delegate, go to etkit's delegate.
    in_vgf = target == "vgf" and not sampler_delegate
    if in_vgf:
        from etkit_gridsampler.vgf_shader import VgfSamplerPartitioner

        partitioner = VgfSamplerPartitioner(partitioner)
    policies = PolicyPartitioner(
        partitioner,
        [
            DetagInputQuantize(quantized_inputs),
            DetagOutputDequantize(quantized_outputs),
            *([] if in_vgf else [DetagOps([torch.ops.aten.grid_sampler_2d.default])]),
            # XNNPACK has no int16 activations (grids are int16)
            *([DetagQuantizeDtypes([torch.int16])] if target == "xnnpack" else []),
            # pads ExecuTorch 1.5.1's partitioners claim but cannot compile (etkit_partition.pads)
            *([DetagQuantizedPads()] if target == "xnnpack" else []),
        ],
    )
    # Channels-last boundaries are for a GPU engine (VGF); XNNPACK's delegates expect the
    # contiguous layout they were partitioned with (its runtime rejects some NHWC inputs).
    # keep_activation_bounds: the Arm backend drops a ReLU before a quantize it assumes clips
    # at 0; etkit's fixed qspecs (SNORM8) do not.
    layout_passes = [keep_activation_bounds, channels_last] if target == "vgf" else []
    with stages.stage("lower_main"), _sampler_lowering(in_vgf) as segments:
        manager = to_edge_transform_and_lower(
            program,
            partitioner=[policies],
            transform_passes=layout_passes,
            generate_etrecord=True,  # the record survives to_backend and to_executorch
        )
    sampler_paths = _sampler_paths(
        partitioner, manager.exported_program(), segments if in_vgf else None, target
    )
    grid_partitioner = GridSamplerPartitioner()
    with stages.stage("lower_grid_sampler"):
        manager = manager.to_backend(grid_partitioner)
    for rejection in grid_partitioner.rejections:  # loud: the user asked for a delegated sampler
        logger.warning(
            "grid sampler %s is not delegated (it runs as ExecuTorch's portable float kernel, on "
            "the CPU): %s",
            rejection.node,
            rejection.reason,
        )
    with stages.stage("pin_layouts"):
        # to_executorch re-traces the program: without this, delegate outputs get the layout
        # their operators compute (a grid sampler's is NCHW), not the one they were compiled for
        pin_delegate_layouts(
            manager.exported_program(), any_layout_backends={GridSamplerBackend.__name__}
        )
    with stages.stage("extract_io_quant_params"):
        extracted = (
            extract_io_quant_params(
                manager, input_idxs=tuple(quantized_inputs), output_idxs=tuple(quantized_outputs)
            )
            if quantized_inputs or quantized_outputs
            else {"inputs": {}, "outputs": {}}
        )
        io_params = io_table(manager.exported_program(), extracted)
    with stages.stage("check_delegates"):  # a program that could never run fails here
        check_call_sites(manager.exported_program())
    from etkit_exporter.float_ops import report_section

    float_section = report_section(  # the edge program as lowered, before to_executorch
        manager.exported_program(),
        quantized=quant.enabled,
        grid_math=quant.grid_math,
        intermediates=intermediates if target == "vgf" else None,
    )
    for warning in float_section["warnings"]:
        logger.warning("%s", warning)
    with stages.stage("serialize"):
        strip_build_paths(manager.exported_program())
        executorch_manager = manager.to_executorch()
        pte = executorch_manager.buffer
        io_params = with_pte_layouts(io_params, pte)  # the dim orders the .pte really has
        (work / "model.pte").write_bytes(pte)
        (work / "io_quant_params.json").write_text(json.dumps(io_params, indent=2) + "\n")
    with stages.stage("load"):  # a program the runtime refuses is no export
        from etkit_exporter.verify import check_program_loads

        check_program_loads(work / "model.pte", target)
    with stages.stage("etrecord"):  # for ExecuTorch's Inspector and etkit inspect
        from etkit_exporter.etrecord import write_etrecord

        write_etrecord(
            work,
            executorch_manager,
            inputs,
            float_program=exported,
            forbidden_paths=[work, intermediates],
        )
    verification = None
    if verify:
        from etkit_exporter.verify import RUNNERS, verify_export

        with stages.stage("verify"):  # the verdict, and where a failing program diverges
            run = verify_export(
                work, model, converted, inputs, io_params, target,
                tolerance=tolerance, float_export=not quant.enabled,
            )  # fmt: skip
            verification = run.verification
        if bundle and run.passed:  # a failed program's outputs are no test vectors
            from etkit_exporter.bundle import BUNDLE_NAME, SIDECAR_NAME, bundle_bytes, sidecar

            with stages.stage("bundle"):
                (work / BUNDLE_NAME).write_bytes(
                    bundle_bytes(work / "model.pte", run.inputs, run.outputs)
                )
                side = sidecar(
                    io_params,
                    RUNNERS.get(target, "executorch.runtime"),
                    verdict=verification["verdict"],
                )
                (work / SIDECAR_NAME).write_text(json.dumps(side, indent=2) + "\n")
    scenario_section = None
    if scenario:  # the whole program as one Vulkan scenario (docs/scenario.md)
        from etkit_exporter.scenario_export import export_scenario

        with stages.stage("scenario"):
            scenario_section = export_scenario(work, inputs, io_params)
    report = build_report(
        manager.exported_program(),
        target=target,
        io_params=io_params,
        detagged=policies.detagged,
        grid_rejections=[(r.node, r.reason) for r in grid_partitioner.rejections],
        timings=stages.timings,
        intermediates=intermediates,
        verification=verification,
        tosa_spec=spec,
        saturation=[record.as_dict() for record in saturations],
    )
    if scenario_section is not None:
        report["scenario"] = scenario_section
    report["grid_sampler_paths"] = sampler_paths
    if quantizer is not None and quant.grid_math == "float":
        coordinates["inputs"] = list(quantizer.coordinate_inputs)
        float_section["coordinate_inputs"] = coordinates
    report["float_ops"] = float_section
    write_report(report, work)
    return ExportResult(
        edge_program=manager.exported_program(),
        example_inputs=inputs,
        io_quant_params=io_params,
        pte_path=work / "model.pte",
        report=report,
        artifacts_root=work,
        verification=verification,
        converted_model=converted,
        saturation=saturations,
    )


# Compile-spec keys that hold a folder of the machine that lowered the program (the Arm backend's
# intermediates); no runtime reads them, and a shipped program must not carry them.
BUILD_PATH_COMPILE_SPECS: Final = frozenset({"debug_artifact_path"})


def strip_build_paths(program: ExportedProgram) -> list[str]:
    """Removes the compile specs of ``BUILD_PATH_COMPILE_SPECS`` from every lowered module of
    ``program`` (nested ones included), so that the serialized program holds no path of this
    machine and two exports of one model are byte-identical. Returns the removed keys."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    removed: list[str] = []
    for module in program.graph_module.modules():
        if isinstance(module, LoweredBackendModule):
            kept = [c for c in module.compile_specs if c.key not in BUILD_PATH_COMPILE_SPECS]
            removed += [c.key for c in module.compile_specs if c.key in BUILD_PATH_COMPILE_SPECS]
            module._compile_specs = kept
    return removed


def _check_grid_math(grid_math: object) -> str:
    """``grid_math`` checked: "float" (the coordinate arithmetic between the last compute-heavy
    op and each grid sampler's grid input in float) or "int" (quantized too)."""
    from etkit_quant.boundary import GRID_MATHS

    if grid_math not in GRID_MATHS:
        raise ValueError(
            f"grid_math must be one of {', '.join(map(repr, GRID_MATHS))}, got {grid_math!r}"
        )
    return str(grid_math)


def _check_qspec_list(
    qspecs: Sequence[QuantizationSpec | None] | None, what: str
) -> tuple[QuantizationSpec | None, ...] | None:
    if qspecs is None:
        return None
    if isinstance(qspecs, QuantizationSpec) or not isinstance(qspecs, Sequence):
        raise TypeError(f"{what} must be a sequence of qspecs (or None), one per boundary")
    return tuple(qspecs)


def _refuse_unsigned(quant: _QuantOptions) -> None:
    """uint8 (UNORM8) qspecs are refused: ExecuTorch 1.5.1's XNNPACK serializer writes every
    8-bit per-tensor type as qint8 (UNORM8 values past 127 are clipped, silently), its VGF
    lowering has no uint8 PAD or boundaries, and the grid-sampler blob holds int8 and int16."""
    named = [
        *(("input", k, q) for k, q in enumerate(quant.inputs or ())),
        *(("output", k, q) for k, q in enumerate(quant.outputs or ())),
        *(
            (f"grid sampler {role}", None, q)
            for role, q in (
                ("image", quant.sampler_image),
                ("grid", quant.sampler_grid),
                ("output", quant.sampler_output),
            )
        ),
    ]
    for what, index, qspec in named:
        if isinstance(qspec, QuantizationSpec) and qspec.dtype == torch.uint8:
            where = what if index is None else f"{what} {index}"
            raise ValueError(
                f"{where} asks for uint8 (unorm8): ExecuTorch 1.5.1 computes uint8 tensors wrongly "
                "in XNNPACK and cannot lower them for VGF; use snorm8 (an image in [0, 1] keeps "
                "128 levels) or leave it to the calibrated default"
            )


def _coordinate_input_qspec(
    exported: ExportedProgram, base: Any, quant: _QuantOptions
) -> tuple[QuantizationSpec, dict[str, Any]]:
    """The qspec of the tensors entering the coordinate arithmetic (a predicted flow or
    theta), and why: int8 (``observed_int8``) unless rounding them to int8 moves a sampling
    position by more than ``POSITION_TOLERANCE_PX`` on the calibration data and the backend
    has int16 activations (VGF; XNNPACK has none: there it stays int8, and the report says
    so)."""
    from etkit_quant import observed_int8
    from etkit_quant.calibration import POSITION_TOLERANCE_PX, coordinate_position_error
    from etkit_quant.qspecs import observed_int16

    if quant.grid_math != "float":
        return observed_int8(), {}  # the coordinate arithmetic is quantized by the base
    error = coordinate_position_error(exported, quant.samples)
    int16_capable = type(base).__module__.startswith("executorch.backends.arm")
    needs = error > POSITION_TOLERANCE_PX
    qspec = observed_int16() if needs and int16_capable else observed_int8()
    if not needs:
        why = f"int8 moves sampling positions by at most {error:.3g} px"
    elif int16_capable:
        why = f"int8 would move sampling positions by up to {error:.3g} px"
    else:
        why = (
            f"int8 moves sampling positions by up to {error:.3g} px, but the backend has no "
            "int16 activations"
        )
        logger.warning("tensors entering the coordinate arithmetic: %s", why)
    section = {
        "qspec": describe_qspec(qspec),
        "int8_position_error_px": error,
        "tolerance_px": POSITION_TOLERANCE_PX,
        "why": why,
    }
    return qspec, section


def _boundary_quantizer(
    exported: ExportedProgram, base: Any, quant: _QuantOptions, num_inputs: int
) -> tuple[BoundaryQuantizer, tuple[Saturation, ...], dict[str, Any]]:
    """The boundary quantizer over ``base`` with the given qspecs and, where none is given, the
    ones the calibration data calls for; and the saturation of each fixed-parameter one."""
    given = [
        q
        for q in (
            *(quant.inputs or ()),
            *(quant.outputs or ()),
            quant.sampler_image,
            quant.sampler_grid,
            quant.sampler_output,
        )
        if isinstance(q, QuantizationSpec)
    ]
    observation = observe_ranges(exported, quant.samples, count_outside=given)
    defaults = default_qspecs(observation)

    def chosen(value: SamplerQSpec, default: QuantizationSpec) -> QuantizationSpec | None:
        return default if isinstance(value, _Calibrated) else value

    input_qspecs = quant.inputs if quant.inputs is not None else defaults.input_qspecs
    output_qspecs = quant.outputs if quant.outputs is not None else defaults.output_qspecs
    observed_boundaries = list(zip(observation.inputs, input_qspecs, strict=False)) + list(
        zip(observation.outputs, output_qspecs, strict=False)
    )

    coordinate_qspec, coordinates = _coordinate_input_qspec(exported, base, quant)
    quantizer = BoundaryQuantizer(
        base,
        coordinate_input_qspec=coordinate_qspec,
        input_qspecs=input_qspecs,
        output_qspecs=output_qspecs,
        grid_sampler_image_qspec=chosen(quant.sampler_image, defaults.grid_sampler_image_qspec),
        grid_sampler_grid_qspec=chosen(quant.sampler_grid, defaults.grid_sampler_grid_qspec),
        grid_sampler_output_qspec=chosen(quant.sampler_output, defaults.grid_sampler_output_qspec),
        # A calibrated image qspec only fills in for images that arrive in float: one the
        # model already quantizes is read as it is, not requantized before the sampler.
        grid_sampler_image_from_producer=isinstance(quant.sampler_image, _Calibrated)
        and _fixed_boundaries_fit_samplers(observed_boundaries),
        grid_math=quant.grid_math,  # type: ignore[arg-type]  # checked: _check_grid_math
    )
    quantizer.check_counts(num_inputs, len(observation.outputs))
    try:
        saturations = saturation_report(observation, quantizer)
    except ValueError:  # a default's fixed range was not counted in the first pass
        observation = observe_ranges(
            exported, quant.samples, count_outside=boundary_fixed_qspecs(quantizer)
        )
        saturations = saturation_report(observation, quantizer)
    return quantizer, saturations, coordinates


def _fixed_boundaries_fit_samplers(
    boundaries: list[tuple[ObservedRange, QuantizationSpec | None]],
) -> bool:
    """Whether a grid sampler can read an int8 boundary's fixed parameters as they are: the integer
    kernel requantizes by image scale / output scale <= 32, and a sampler's calibrated output
    qspec covers about what its image holds, so a fixed range more than 16 times wider than
    the data it was observed to carry (a boundary using under 1/16 of its range) could leave a
    sampler outside the contract, and undelegated. Then every sampler keeps its own image
    qspec (a requantize before it), as with an explicit one."""
    for observed, qspec in boundaries:
        if qspec is None or qspec.dtype != torch.int8 or not is_fixed(qspec) or not observed.count:
            continue  # (only int8 images are read as produced)
        params = fixed_qparams(qspec)
        span = max(abs(params.low), abs(params.high))
        if observed.max_abs * 16 < span:
            logger.info(
                "%s uses under 1/16 of its fixed range %s: grid samplers requantize their "
                "images rather than read it as it is",
                observed.name,
                describe_qspec(qspec),
            )
            return False
    return True


@contextmanager
def _sampler_lowering(in_vgf: bool) -> Iterator[list[dict[str, Any]]]:
    """While lowering to VGF, etkit's samplers become compute segments (etkit_gridsampler's
    rewrite pass runs before the Arm backend's own grid-sampler passes); yields the segments
    made."""
    if not in_vgf:
        yield []
        return
    from etkit_gridsampler.vgf_shader import sampler_lowering

    with sampler_lowering() as segments:
        yield segments


def _sampler_paths(
    partitioner: Any, program: ExportedProgram, segments: list[dict[str, Any]] | None, target: str
) -> list[dict[str, Any]]:
    """Which way each grid sampler went (a compute segment inside the VGF, with its
    configuration, or etkit's own delegate with the reason), said on the console too."""
    from etkit_gridsampler.vgf_shader import IN_VGF, OWN_DELEGATE

    if segments is None:
        left = [n.name for n in program.graph_module.graph.nodes if is_grid_sampler(n)]
        why = (
            "sampler_delegate: samplers kept in etkit's own delegate"
            if target == "vgf"
            else f"target {target}: etkit's own delegate"
        )
        return [{"node": name, "path": OWN_DELEGATE, "reason": why} for name in left]
    paths = [p.as_dict() for p in getattr(partitioner, "paths", [])]
    made = {segment["node"]: segment for segment in segments}
    for path in paths:
        segment = made.get(str(path["node"]))
        if segment is not None:
            op = segment["op"]
            path["segment"] = {
                "mode": op.mode,
                "padding_mode": op.padding_mode,
                "align_corners": op.align_corners,
                "image_shape": list(segment["image_shape"]),
                "grid_shape": list(segment["grid_shape"]),
                "grid_dtype": str(op.grid.dtype).removeprefix("torch."),
                "params": segment["params_mode"],
                "workgroups": segment["workgroups"],
            }
        if path["path"] == IN_VGF:
            logger.info("grid sampler %s: a compute segment inside the VGF", path["node"])
        else:
            logger.warning(
                "grid sampler %s stays outside the VGF, in etkit's own delegate: %s",
                path["node"],
                path["reason"],
            )
    return paths


def _backend(target: str, intermediates: Path, tosa_spec: str) -> tuple[Any, Any, str | None]:
    """The base quantizer, the main partitioner and the TOSA spec of a target."""
    if target == "vgf":
        from executorch.backends.arm.quantizer import (
            VgfQuantizer,
            get_symmetric_quantization_config,
        )
        from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner

        from etkit_exporter.tools import configure_model_converter

        configure_model_converter()
        spec = VgfCompileSpec(tosa_spec)
        spec.dump_intermediate_artifacts_to(str(intermediates))
        base = VgfQuantizer(spec)
        base.set_global(get_symmetric_quantization_config())
        return base, VgfPartitioner(spec), tosa_spec
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    return XNNPACKQuantizer().set_global(xnnpack_config()), XnnpackPartitioner(), None
