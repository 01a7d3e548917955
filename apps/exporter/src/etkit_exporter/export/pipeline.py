"""``export_model``: the pipeline of design.md, from a PyTorch model to a deployable,
integer-IO ExecuTorch program with its artifacts and report."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.passes.quantize_io_pass import extract_io_quant_params
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter.artifact.etrecord import write_etrecord
from etkit_exporter.artifact.float_ops import report_section
from etkit_exporter.artifact.report import build_report, write_report
from etkit_exporter.artifact.staging import Staging, check_destination
from etkit_exporter.check.bundle import (
    BUNDLE_NAME,
    SIDECAR_NAME,
    BundleCase,
    bundle_bytes,
    sidecar,
)
from etkit_exporter.check.loop import LOOP_FRAMES
from etkit_exporter.check.tolerance import check_tolerance
from etkit_exporter.check.verdict import failed_destination, keep_failed
from etkit_exporter.check.verify import (
    RUNNERS,
    VerifiedRun,
    check_program_loads,
    verify_export,
)
from etkit_exporter.core import memory
from etkit_exporter.core.errors import ExportError
from etkit_exporter.core.io_params import io_table, with_pte_layouts
from etkit_exporter.core.version import __version__
from etkit_exporter.export import methods as multi
from etkit_exporter.export import sizes as sizing
from etkit_exporter.export.activation_bounds import keep_activation_bounds
from etkit_exporter.export.arguments import (
    CALIBRATED,
    QspecCountError,
    QuantOptions,
    SamplerQSpec,
    StageCallback,
    check_arguments,
    check_etrecord,
    check_extra_artifacts,
    check_forward,
    check_grid_samplers,
    check_no_state,
    check_tosa_spec,
    quant_options,
)
from etkit_exporter.export.average_pools import vgf_average_pools
from etkit_exporter.export.interruptions import disk_full, sigterm_as_exit
from etkit_exporter.export.lowering import (
    lowering_to,
    program_for_target,
    sampler_paths,
    strip_build_paths,
    target_backend,
)
from etkit_exporter.export.maxima import channel_maxima_last
from etkit_exporter.export.pass_profile import profiled
from etkit_exporter.export.provenance import shared_provenance
from etkit_exporter.export.qat import QatExport, is_qat_model, qat_export, quantization_given
from etkit_exporter.export.quantization import boundary_quantizer
from etkit_exporter.export.scenarios import export_scenario
from etkit_exporter.export.stages import ProgressCallback, Stages
from etkit_exporter.export.state import (
    ModelState,
    StatefulExport,
    check_state_export,
    prepare_state,
    state_table,
    verify_state_loop,
)
from etkit_gridsampler import GridSamplerBackend, GridSamplerPartitioner
from etkit_gridsampler.call_sites import check_call_sites
from etkit_gridsampler.vgf_shader import (
    VgfSamplerPartitioner,
)
from etkit_layout import channels_last, pad_rgb_to_rgba, pin_delegate_layouts
from etkit_partition import (
    DetagDynamicReshapes,
    DetagInputQuantize,
    DetagMovedQuantizes,
    DetagOps,
    DetagOutputDequantize,
    DetagQuantizedPads,
    DetagQuantizeDtypes,
    DetagQuantizeOfFloatResults,
    PolicyPartitioner,
    integer_moves,
)
from etkit_quant import (
    BoundaryQuantizer,
    ObserverStates,
    Saturation,
    boundary_fixed_qspecs,
    clipping_report,
    observer_states,
)
from etkit_quant import quantize as quantize_model
from etkit_quant.normalize import normalize_program

if TYPE_CHECKING:
    from etkit_exporter.check.tolerance import VerifyTolerance

logger = logging.getLogger(__name__)


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
    sizes: dict[str, Any] | None = None  # report.json's "sizes": methods, bounds, bytes, verdicts


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
    sizes: Sequence[tuple[int, int]] | None = None,
    dynamic_size: Sequence[Any] | None = None,
    etrecord: str = "slim",
    force: bool = False,
    on_stage: StageCallback | None = None,
    on_progress: ProgressCallback | None = None,
    on_calibration_sample: Callable[[int, int], None] | None = None,
    extra_artifacts: Mapping[str, bytes] | None = None,
    state: Mapping[str, str] | None = None,
    sequence: Sequence[tuple[torch.Tensor, ...]] | None = None,
    loop_frames: int = LOOP_FRAMES,
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
    model (target "vgf": in etkit's runner, ``etkit_exporter.programs``, its VGF delegates run
    by ``scenario_runner`` on the Vulkan device), and judges each output against the quantized
    model with ``verify_tolerance`` (``etkit_exporter.check.tolerance.VerifyTolerance`` or its
    text; the docs' "Verification verdict"; giving one implies ``verify``): a failure raises
    ``VerificationError`` naming the failing outputs and the first delegate call that diverges,
    and the export is kept in ``artifacts_root.failed-verification``, never at
    ``artifacts_root``. Every export loads the program it wrote before it succeeds (stage
    ``load``). ``on_stage(name, seconds)`` hears of each stage as it ends (each stage's time and
    peak resident memory also go to report.json's ``timings_s`` and ``peak_memory_mb``, written
    to ``timings.json``), ``on_progress(what, done, total)`` of a verification's parts as they
    start (total 0) and of its envelope runs. ``bundle`` (implies ``verify``) also writes
    ``model.bpte``: the program with the example inputs in its IO types and, as expected
    outputs, what it returned on them in that verified run; ``model.bpte.json`` beside it says
    so and gives the tolerance (``etkit_exporter.check.bundle``). ``scenario`` (target "vgf")
    also writes ``scenario/``: the whole program as one Vulkan scenario for ``scenario_runner``
    (``etkit_exporter.vgf.scenario_writer``; a program it cannot express gets none, the report's
    ``scenario`` section saying why). ``sampler_delegate`` (target "vgf"): keep the grid
    samplers in etkit's own delegate between VGF delegates; by default each sampler the integer
    contract covers is a compute segment inside the VGF (``etkit_gridsampler.vgf_shader``), the
    report's ``grid_sampler_paths`` saying where each went.

    Sizes (docs/how-to/sizes.md; ``export.sizes``): ``sizes=[(540, 960), (720, 1280)]``: one
    method per size in one program (``forward_540x960``, ...; ``forward`` the first size), each
    captured at its size and quantized with what calibration at one size observed (the
    samples', all of one listed size or the example's); ``dynamic_size=((256, 1088), (256,
    1920), 64)`` (target "xnnpack"): one method ``forward`` for every height and width in the
    bounds that is a multiple of 64, captured once with dynamic dimensions on each image
    input's height and width, calibrated on samples of any of its sizes. ``verify`` judges
    every method (a range: its smallest, largest, an odd and the example size).

    State (docs/how-to/state.md; ``export.state``): a buffer ``forward`` writes is lifted into
    an input and an output ``new_<name>``; ``state={"history": "new_history"}`` names the pairs
    of a model that takes its state; each pair shares one qspec exactly, io_quant_params.json's
    ``state`` says which output goes back into which input. ``calibration`` may then be
    sequences (lists of frames), run with the state fed back; ``verify`` also runs the loop
    over ``sequence`` (default: the first calibration sequence) for ``loop_frames`` frames
    (``check.loop``, report ``verification["loop"]``).

    ``etrecord`` (``artifact.etrecord``): "slim" (default) what ExecuTorch's Inspector and
    ``etkit inspect`` run; "full" adds the ATen program and the float model ("vs float").

    Everything is checked before any work (``TypeError``/``ValueError``/``FileExistsError``;
    ``artifact.staging.DestinationError``, a ``ValueError``, for an ``artifacts_root``
    etkit will not write or replace; calibration samples are checked one by one, the error naming
    the sample and input). ``force`` replaces an earlier etkit export, never anything else (see
    ``etkit_exporter.artifact.staging``). Artifacts are written to a staging folder beside
    ``artifacts_root`` and swapped into place at the end, so a kill at any instant leaves the
    previous export or the new one; a failing stage raises ``ExportError`` naming it (a full disk
    says so) and leaves nothing behind."""
    root = Path(artifacts_root)
    qat = None
    if is_qat_model(model):  # trained with QAT: its own quantization, nothing calibrated (qat.py)
        qat = qat_export(model, target=target, tosa_spec=tosa_spec, given=quantization_given(
            quantized_input_qspecs, quantized_output_qspecs, grid_sampler_image_qspec,
            grid_sampler_grid_qspec, grid_sampler_output_qspec, quantize_grid_sample_output,
            calibration, enable_pt2e_quantization,
        ))  # fmt: skip
        model, grid_math = qat.float_model, qat.grid_math or grid_math
    inputs = check_arguments(model, example_inputs, target)
    stateful = prepare_state(model.eval(), inputs, state, calibration, sequence, loop_frames)
    if stateful is not None:  # buffers written in forward lifted, the state named (state.py)
        check_state_export(qat is not None, sizes, dynamic_size)
        model, inputs, calibration = stateful.model, stateful.inputs, stateful.samples
    plan = sizing.check_sizes(sizes, dynamic_size, inputs, target, qat=qat is not None)
    spec = check_tosa_spec(tosa_spec, target, enable_pt2e_quantization)
    if scenario and target != "vgf":
        raise ValueError(f"scenario applies to target 'vgf' only, not {target!r}")
    extras = check_extra_artifacts(extra_artifacts)
    full_record = check_etrecord(etrecord)

    tolerance = check_tolerance(verify_tolerance)
    verify = verify or bundle or verify_tolerance is not None  # each implies a verification
    check_forward(model.eval(), inputs)
    sizing.check_forward_at_sizes(model, inputs, plan)
    quant = quant_options(
        enabled=enable_pt2e_quantization, inputs=inputs,
        quantized_input_qspecs=quantized_input_qspecs,
        quantized_output_qspecs=quantized_output_qspecs,
        sampler_image=grid_sampler_image_qspec, sampler_grid=grid_sampler_grid_qspec,
        sampler_output=grid_sampler_output_qspec if quantize_grid_sample_output else None,
        calibration=calibration, on_sample=on_calibration_sample, grid_math=grid_math,
        reference_for=sizing.calibration_reference(inputs, plan),  # samples of any of its sizes
    )  # fmt: skip
    if stateful is not None:
        quant = dataclasses.replace(quant, state=stateful.state.index_pairs)
    plan = sizing.calibrated_at(plan, quant.samples)  # an enumerated export's: one of them
    destination = check_destination(root, force)
    failed = failed_destination(root, force) if verify else None
    for note in destination.notes:
        logger.warning("%s", note)
    stages = Stages(on_stage, progress=on_progress)
    try:
        with (
            sigterm_as_exit(),
            Staging(destination) as staging,
            shared_provenance(),
            profiled(stages.profile),  # timings.json's profile_s (etkit-export --profile)
        ):
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
                qat=qat,
                plan=plan,
                full_record=full_record,
                stateful=stateful,
            )
            for name, data in extras.items():
                (staging.path / name).write_bytes(data)
            producer = {"tool": "etkit-exporter", "version": __version__}
            if failed is not None and result.verification is not None:
                keep_failed(staging, failed, force, producer, result.verification, root)
            staging.commit(force, producer=producer)
    except (ExportError, OSError) as error:
        full = disk_full(error)
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


def _run(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    work: Path,
    intermediates_root: Path | None,
    quant: QuantOptions,
    target: str,
    tosa_spec: str,
    verify: bool,
    bundle: bool,
    stages: Stages,
    scenario: bool = False,
    sampler_delegate: bool = False,
    tolerance: Any = None,
    qat: QatExport | None = None,
    plan: sizing.SizePlan | None = None,
    full_record: bool = False,
    stateful: StatefulExport | None = None,
) -> ExportResult:
    """The stages in order, one job after another: quantize, lower, write the program (and
    load it), verify (and bundle), write the scenario and the report."""
    intermediates = intermediates_root or work / "intermediates"
    intermediates.mkdir(parents=True, exist_ok=True)
    methods = multi.build_methods(  # forward first; with sizes, a method per size (export.methods)
        plan, inputs, stages,
        lambda ins, at, calibrated, name: _quantize(
            model, ins, intermediates / name if name else intermediates, quant, target,
            tosa_spec, at, qat, plan=plan, calibrated=calibrated,
        ),
        lambda q, ins, at: _lower(q, ins, target, sampler_delegate, at),
    )  # fmt: skip
    quantized, lowered, inputs = methods[0].quantized, methods[0].lowered, methods[0].inputs
    float_section = report_section(  # the edge program as lowered, before to_executorch
        lowered.manager.exported_program(),
        quantized=quant.enabled,
        grid_math=quant.grid_math,
        intermediates=intermediates if target == "vgf" else None,
    )
    for warning in float_section["warnings"]:
        logger.warning("%s", warning)
    io_params = _write_program(
        lowered, quantized, inputs, work, intermediates, target, stages, methods, full_record,
        stateful.state if stateful else None,
    )  # fmt: skip
    verification, run = None, None
    if verify:
        verification, run = _verify(
            work, model, quantized, inputs, io_params, target, tolerance, quant, stages, qat
        )
        if stateful is not None:  # the loop over frames, each state fed back (check.loop)
            verify_state_loop(work, model, quantized.converted, stateful, io_params, target,
                              tolerance, quant, stages, verification)  # fmt: skip
    sizes_section, size_cases = multi.sizes_section(  # bytes; every method or range size judged
        work, model, methods, plan, target, verification, io_params, stages.stage,
        tolerance=tolerance, float_export=not quant.enabled, intermediates=intermediates,
        full_record=full_record,
    )  # fmt: skip
    cases = [_case(run), *size_cases] if run is not None else []  # the verified runs
    if bundle and cases and verification is not None:
        _bundle(work, io_params, target, verification, cases, stages)
    scenario_section = None
    if scenario:  # the whole program as one Vulkan scenario per method (docs/scenario.md)
        with stages.stage("scenario"):  # each checked against its verified run, if any
            scenario_section = export_scenario(work, inputs, io_params, runs=cases)
            if len(methods) > 1:
                scenario_section["methods"] = {
                    m.name: export_scenario(work, m.inputs, m.io_params, m.name, cases)
                    for m in methods[1:]
                }
    report = _report(
        lowered, quantized, quant, target, io_params, verification, scenario_section,
        float_section, intermediates, stages,
    )  # fmt: skip
    if qat is not None:
        report["qat"] = qat.section(inputs)
    if sizes_section is not None:
        report["sizes"] = sizes_section
    write_report(report, work)
    return ExportResult(
        edge_program=lowered.manager.exported_program(),
        example_inputs=inputs,
        io_quant_params=io_params,
        pte_path=work / "model.pte",
        report=report,
        artifacts_root=work,
        verification=verification,
        converted_model=quantized.converted,
        saturation=quantized.saturations,
        sizes=sizes_section,
    )


@dataclass
class _Quantized:
    """The model captured, normalized and (with quantization) quantized, and what the lowering
    and the report need of that."""

    exported: ExportedProgram  # the float program, normalized (the ETRecord's float model)
    converted: torch.nn.Module  # the graph the program is exported from
    quantizer: BoundaryQuantizer | None  # None without quantization
    partitioner: Any  # the target's main partitioner
    spec: str | None  # the TOSA specification (VGF)
    saturations: tuple[Saturation, ...]
    coordinates: dict[str, Any]
    dynamic: Any = None  # torch.export's dynamic shapes of a size range
    observers: ObserverStates | None = None  # the calibration, for the other sizes


def _quantize(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    intermediates: Path,
    quant: QuantOptions,
    target: str,
    tosa_spec: str,
    stages: Stages,
    qat: QatExport | None = None,
    *,
    plan: sizing.SizePlan | None = None,
    calibrated: _Quantized | None = None,
) -> _Quantized:
    """Stages capture to quantize: the graph that is exported for lowering (for a QAT-trained
    model, ``convert_qat``'s, with the parameters it trained)."""
    dynamic = sizing.dynamic_shapes(plan, inputs)  # None but for a size range
    with sizing.fixed_sizes_refused(plan if dynamic else None), stages.stage("capture"):
        exported = torch.export.export(model, inputs, dynamic_shapes=dynamic, strict=True)
        num_outputs = len(exported.graph_signature.user_outputs)
        check_no_state(exported)
        check_grid_samplers(exported)
    with stages.stage("normalize"):  # library-built graphs made to look hand-written
        exported, _ = normalize_program(
            exported, inputs, dynamic_shapes=dynamic, **quant.rewrites(target),
            **sizing.fold_limit(plan, target, inputs))  # fmt: skip
    base, partitioner, spec = target_backend(target, intermediates, tosa_spec)
    if qat is not None:
        with stages.stage("quantize"):
            q = qat.quantize(inputs, dynamic)  # at this size, or a range's dynamic shapes
        return _Quantized(exported, q.converted, q.quantizer, partitioner, spec, *q.report, dynamic)
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
        if calibrated is not None:  # another size: the example size's quantizer and records
            quantizer, coordinates = copy.copy(calibrated.quantizer), calibrated.coordinates
            saturations = calibrated.saturations  # (warned about at the example size)
        else:
            with stages.stage("observe_ranges"):  # (a range's sizes alike: sizes.py)
                sizing.check_ranges_agree(exported, quant.samples, plan)
                quantizer, saturations, coordinates = boundary_quantizer(
                    exported, base, quant, len(inputs)
                )
        for record in () if calibrated else saturations:
            if not record.passes():
                logger.warning("saturation: %s", record.message())
    graph = exported.module(check_guards=False)
    if target == "vgf":  # RGBA textures for the GPU; a CPU program samples RGB as it is
        with stages.stage("rgb_to_rgba"):
            pad_rgb_to_rgba(graph)
    if quantizer is not None and target == "vgf":
        with stages.stage("average_pools"):  # AVG_POOL2D as the VGF computes it right
            vgf_average_pools(graph)
    if target == "xnnpack":
        with stages.stage("channel_maxima"):  # maxima over channels as XNNPACK lowers them
            channel_maxima_last(graph)
    converted: torch.nn.Module = graph
    kept: list[ObserverStates] = []
    if quantizer is not None and calibrated is not None:
        with stages.stage("quantize"):  # this size's graph, the example size's observers
            converted = quantize_model(
                graph, inputs, quantizer, observers=calibrated.observers, dynamic_shapes=dynamic
            )
    elif quantizer is not None:
        with stages.stage("quantize"):
            converted = quantize_model(
                graph, inputs, quantizer, calibration=quant.samples, on_sample=quant.on_sample,
                dynamic_shapes=dynamic, on_calibrated=lambda p: kept.append(observer_states(p)),
            )  # fmt: skip
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
    return _Quantized(
        exported, converted, quantizer, partitioner, spec, saturations, coordinates, dynamic,
        kept[0] if kept else None,
    )  # fmt: skip


@dataclass
class _Lowered:
    """The program lowered to its delegates, and what the report needs of the lowering."""

    manager: EdgeProgramManager
    policies: PolicyPartitioner
    grid_partitioner: GridSamplerPartitioner
    paths: list[dict[str, Any]]  # where each grid sampler went
    io_params: dict[str, Any]


def _lower(
    quantized: _Quantized,
    inputs: tuple[torch.Tensor, ...],
    target: str,
    sampler_delegate: bool,
    stages: Stages,
) -> _Lowered:
    """Stages re_export to check_delegates: the program on its delegates, its layouts pinned,
    its IO parameters extracted."""
    with stages.stage("re_export"):
        program = torch.export.export(
            quantized.converted, inputs, dynamic_shapes=quantized.dynamic, strict=True
        )
        program = program_for_target(program, target)  # unread float weights dropped, ...
    quantizer = quantized.quantizer
    ins, outs = (quantizer.input_qspecs, quantizer.output_qspecs) if quantizer else ((), ())
    quantized_inputs = [k for k, q in enumerate(ins) if q is not None]
    quantized_outputs = [k for k, q in enumerate(outs) if q is not None]
    # VGF: each sampler the integer contract covers becomes a compute segment of the VGF
    # (etkit's shader); the others, and all with sampler_delegate, go to etkit's delegate.
    in_vgf = target == "vgf" and not sampler_delegate
    partitioner = quantized.partitioner
    if in_vgf:
        partitioner = VgfSamplerPartitioner(partitioner)
    policies = PolicyPartitioner(
        partitioner,
        [
            DetagInputQuantize(quantized_inputs),
            DetagOutputDequantize(quantized_outputs),
            *([] if in_vgf else [DetagOps([torch.ops.aten.grid_sampler_2d.default])]),
            # XNNPACK has no int16 activations (grids are int16)
            *([DetagQuantizeDtypes([torch.int16])] if target == "xnnpack" else []),
            # pads ExecuTorch 1.5.1's partitioners claim but cannot compile (etkit_partition.pads);
            # not yet DetagMaximaOverChannels: on kornia's warps it left a dependency cycle
            *([DetagQuantizedPads()] if target == "xnnpack" else []),
            # reshapes XNNPACK cannot compile with more than one dynamic size (a range)
            *([DetagDynamicReshapes()] if quantized.dynamic else []),
            # a VGF cannot end in a quantize of a float result (etkit_partition.float_results)
            *([DetagQuantizeOfFloatResults()] if target == "vgf" else []),
            # last: a move left outside keeps its quantizes outside (integer_moves), in a range
            *([DetagMovedQuantizes()] if target == "xnnpack" and quantized.dynamic else []),
        ],
        # one VGF: pieces the Arm partitioner leaves apart (samplers sharing only inputs)
        merge=target == "vgf",
    )
    # Channels-last boundaries are for a GPU engine (VGF); XNNPACK's delegates expect the
    # contiguous layout they were partitioned with (its runtime rejects some NHWC inputs).
    # keep_activation_bounds: the Arm backend drops a ReLU before a quantize it assumes clips
    # at 0; etkit's fixed qspecs (SNORM8) do not.
    layout_passes = [keep_activation_bounds, channels_last] if target == "vgf" else []
    with stages.stage("lower_main"), lowering_to(in_vgf) as segments:
        manager = to_edge_transform_and_lower(
            program,
            partitioner=[policies],
            transform_passes=layout_passes,
            generate_etrecord=True,  # the record survives to_backend and to_executorch
        )
    edge_program = manager.exported_program()
    if target == "xnnpack":  # pads and moves outside the delegates move integers (exact)
        integer_moves(edge_program)
    grid_partitioner = GridSamplerPartitioner(fuse_grid_quantize=target == "xnnpack")  # no int16
    with stages.stage("lower_grid_sampler"):
        manager = manager.to_backend(grid_partitioner)
    rejected = {r.node: r.reason for r in grid_partitioner.rejections}
    paths = sampler_paths(partitioner, edge_program, segments if in_vgf else None, target, rejected)
    with stages.stage("pin_layouts"):
        # to_executorch re-traces the program: without this, delegate outputs get the layout
        # their operators compute (a grid sampler's is NCHW), not the one they were compiled for
        pin_delegate_layouts(
            manager.exported_program(), any_layout_backends={GridSamplerBackend.__name__}
        )
    with stages.stage("extract_io_quant_params"):
        if quantized.dynamic:  # each input quantize its input's one user (export.sizes)
            sizing.sizes_read_after_quantize(manager.exported_program())
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
    return _Lowered(manager, policies, grid_partitioner, paths, io_params)


def _write_program(
    lowered: _Lowered,
    quantized: _Quantized,
    inputs: tuple[torch.Tensor, ...],
    work: Path,
    intermediates: Path,
    target: str,
    stages: Stages,
    methods: Sequence[multi.Method] = (),
    full_record: bool = False,
    state: ModelState | None = None,
) -> dict[str, Any]:
    """Stages serialize, load and etrecord: model.pte and io_quant_params.json written, the
    program loaded back, the ETRecord written (``forward``'s). Returns the IO parameters with
    the dim orders the .pte has; with several ``methods``, one program holding them all, and
    each method's IO table under ``methods``."""
    with stages.stage("serialize"):
        strip_build_paths(lowered.manager.exported_program())
        executorch_manager = lowered.manager.to_executorch()
        pte = multi.program_buffer(methods, executorch_manager)  # one method, or all in one
        io_params = with_pte_layouts(lowered.io_params, pte)  # the dim orders the .pte really has
        multi.add_method_io(io_params, methods, pte)
        if state is not None:  # which output goes back into which input, as it is
            io_params["state"] = state_table(state, io_params)
        (work / "model.pte").write_bytes(pte)
        (work / "io_quant_params.json").write_text(json.dumps(io_params, indent=2) + "\n")
    with stages.stage("load"):  # a program the runtime refuses is no export
        check_program_loads(work / "model.pte", target)
        multi.check_methods_load(work / "model.pte", methods[1:], target)
    with stages.stage("etrecord"):  # for ExecuTorch's Inspector and etkit inspect
        write_etrecord(
            work,
            executorch_manager,
            inputs,
            float_program=quantized.exported,
            forbidden_paths=[work, intermediates],
            full=full_record,
        )
    return io_params


def _verify(
    work: Path,
    model: torch.nn.Module,
    quantized: _Quantized,
    inputs: tuple[torch.Tensor, ...],
    io_params: dict[str, Any],
    target: str,
    tolerance: Any,
    quant: QuantOptions,
    stages: Stages,
    qat: QatExport | None = None,
) -> tuple[dict[str, Any], VerifiedRun]:
    """Stage verify: the verdict on the written program (``forward``). Returns the
    verification and the run it judged."""
    ranges = stages.growth.get("observe_ranges")  # the float graph run on the samples
    if ranges is not None:  # the references and each envelope run: a quantized forward or two
        memory.require(
            2 * ranges, "verification (a quantized forward and the float model's at this size)",
            "close other programs, or verify at a smaller size",
        )  # fmt: skip
    with stages.stage("verify"):  # the verdict, and where a failing program diverges
        run = multi.verifier(quantized.dynamic, verify_export)(
            work, model, quantized.converted, inputs, io_params, target,
            tolerance=tolerance, float_export=not quant.enabled, progress=stages.progress,
        )  # fmt: skip
        verification = run.verification
        if qat is not None:  # the program against the QAT model's eval forward
            verification["qat_model"] = qat.compare_program(run.outputs, io_params, inputs)
    return verification, run


def _case(run: VerifiedRun) -> BundleCase:
    return BundleCase("forward", list(run.inputs), list(run.outputs))


def _bundle(
    work: Path,
    io_params: dict[str, Any],
    target: str,
    verification: dict[str, Any],
    cases: list[BundleCase],
    stages: Stages,
) -> None:
    """Stage bundle: model.bpte (every verified run as a test case: ``forward``'s, and each
    other method's or range size's) and its sidecar, when the verdict passed (every size's): a
    failed program's outputs are no test vectors."""
    verdict = verification.get("verdict") or {}
    if verdict.get("result") == "fail":
        return
    with stages.stage("bundle"):
        (work / BUNDLE_NAME).write_bytes(bundle_bytes(work / "model.pte", cases))
        side = sidecar(io_params, RUNNERS.get(target, "executorch.runtime"), verdict=verdict)
        (work / SIDECAR_NAME).write_text(json.dumps(side, indent=2) + "\n")


def _report(
    lowered: _Lowered,
    quantized: _Quantized,
    quant: QuantOptions,
    target: str,
    io_params: dict[str, Any],
    verification: dict[str, Any] | None,
    scenario_section: dict[str, Any] | None,
    float_section: dict[str, Any],
    intermediates: Path,
    stages: Stages,
) -> dict[str, Any]:
    """report.json's content: the lowering, the IO table, the stage timings so far, the
    verification, the saturation records, the scenario, where each grid sampler went and the
    float ops (with the coordinate inputs kept in float)."""
    report = build_report(
        lowered.manager.exported_program(),
        target=target,
        io_params=io_params,
        detagged=lowered.policies.detagged,
        grid_rejections=[(r.node, r.reason) for r in lowered.grid_partitioner.rejections],
        timings=stages.timings,
        intermediates=intermediates,
        verification=verification,
        tosa_spec=quantized.spec,
        saturation=[record.as_dict() for record in quantized.saturations],
    )
    if scenario_section is not None:
        report["scenario"] = scenario_section
    report["grid_sampler_paths"] = lowered.paths
    if quantized.quantizer is not None and quant.grid_math == "float":
        quantized.coordinates["inputs"] = list(quantized.quantizer.coordinate_inputs)
        float_section["coordinate_inputs"] = quantized.coordinates
    report["float_ops"] = float_section
    report["profile_s"] = stages.profile.section(stages.timings)
    report["peak_memory_mb"] = stages.peaks  # each stage's peak resident memory
    return report
