"""The quantizer an export uses: the backend's own, with etkit's boundary, grid-sampler and
grid-position qspecs composed over it (``BoundaryQuantizer``), calibrated ranges where asked."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec, SharedQuantizationSpec

from etkit_exporter.export.arguments import (
    Calibrated,
    QuantOptions,
    SamplerQSpec,
    UnproducibleQspecError,
)
from etkit_exporter.export.state import share_state_qspecs
from etkit_quant import (
    BoundaryQuantizer,
    ObservedRange,
    Saturation,
    boundary_fixed_qspecs,
    default_qspecs,
    describe_qspec,
    fixed_qparams,
    is_fixed,
    observe_ranges,
    observed_int8,
    saturation_report,
)
from etkit_quant.boundary import ANNOTATION_KEY, user_inputs, user_outputs
from etkit_quant.calibration import POSITION_TOLERANCE_PX, coordinate_position_error
from etkit_quant.graph import is_grid_sampler, target_name
from etkit_quant.qspecs import observed_int16

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


def coordinate_input_qspec(
    exported: ExportedProgram, base: Any, quant: QuantOptions
) -> tuple[QuantizationSpec, dict[str, Any]]:
    """The qspec of the tensors entering the coordinate arithmetic (a predicted flow or
    theta), and why: int8 (``observed_int8``) unless rounding them to int8 moves a sampling
    position by more than ``POSITION_TOLERANCE_PX`` on the calibration data and the backend
    has int16 activations (VGF; XNNPACK has none: there it stays int8, and the report says
    so)."""

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


def boundary_quantizer(
    exported: ExportedProgram, base: Any, quant: QuantOptions, num_inputs: int
) -> tuple[BoundaryQuantizer, tuple[Saturation, ...], dict[str, Any]]:
    """The boundary quantizer over ``base`` with the given qspecs and, where none is given, the
    ones the calibration data calls for; and the saturation of each fixed-parameter one. An
    output qspec the target cannot produce is refused first (``refuse_unproducible_outputs``),
    before the calibration data is run."""
    refuse_unproducible_outputs(exported, base, quant)
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
        return default if isinstance(value, Calibrated) else value

    input_qspecs = _unread_inputs_float(
        exported, quant.inputs if quant.inputs is not None else defaults.input_qspecs
    )
    output_qspecs = quant.outputs if quant.outputs is not None else defaults.output_qspecs
    if quant.state:  # a state's input and output: one qspec, exactly (export.state)
        input_qspecs, output_qspecs = share_state_qspecs(
            input_qspecs, output_qspecs, observation.inputs, observation.outputs, quant.state,
            quant.inputs,
        )  # fmt: skip
    observed_boundaries = list(zip(observation.inputs, input_qspecs, strict=False)) + list(
        zip(observation.outputs, output_qspecs, strict=False)
    )

    coordinate_qspec, coordinates = coordinate_input_qspec(exported, base, quant)
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
        grid_sampler_image_from_producer=isinstance(quant.sampler_image, Calibrated)
        and fixed_boundaries_fit_samplers(observed_boundaries),
        grid_math=quant.grid_math,  # type: ignore[arg-type]  # checked: check_grid_math
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


def _unread_inputs_float(
    exported: ExportedProgram, qspecs: Sequence[QuantizationSpec | None]
) -> tuple[QuantizationSpec | None, ...]:
    """``qspecs`` (one per user input), with ``None`` for each input the program does not read
    (an argument the model ignores, or one whose only readers ``normalize`` removed as dead): the
    program takes it as it is, in float, and its IO parameters say so."""
    names = set(exported.graph_signature.user_inputs)
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name in names]
    if len(placeholders) != len(qspecs):
        return tuple(qspecs)  # (the count is checked, with its own error, right after)
    chosen = list(qspecs)
    for k, node in enumerate(placeholders):
        if not node.users and chosen[k] is not None:
            logger.warning("input %d (%s) is not read by the program: it stays float", k, node.name)
            chosen[k] = None
    return tuple(chosen)


def fixed_boundaries_fit_samplers(
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


_NARROW: Final = (torch.int8, torch.uint8)


def refuse_unproducible_outputs(exported: ExportedProgram, base: Any, quant: QuantOptions) -> None:
    """Raises ``UnproducibleQspecError`` for a given output qspec wider than 8 bits (int16,
    int32) that XNNPACK cannot produce: one whose parameters ``BoundaryQuantizer`` puts on an
    op XNNPACK computes from 8-bit integers (conv, linear, add, mul), as when the output comes
    from an op XNNPACK's quantizer leaves alone that only moves values (a clamp) and the
    boundary's parameters move back through it (an op that computes new values, a tanh, keeps
    its input's parameters and computes in float: nothing to refuse). ExecuTorch 1.5.1's
    XNNPACK partitioner takes such an op and its runtime then refuses the program ("Failed to
    create convolution node ... with code: xnn_status_invalid_parameter"), after every stage
    has run. A wide output XNNPACK can give
    is let through: the output of an op XNNPACK quantizes itself (etkit requantizes its int8
    result on the portable kernels), of a grid sampler, or of a float op.

    Annotates a throwaway copy of the graph with the base and the given qspecs (the
    calibrated ones stand in at their widths): no calibration sample is run. Other targets
    (VGF computes int16) and exports without such an output return at once."""
    if not type(base).__module__.startswith("executorch.backends.xnnpack") or not quant.outputs:
        return
    wide = [
        (k, q)
        for k, q in enumerate(quant.outputs)
        if isinstance(q, QuantizationSpec) and q.dtype not in _NARROW
    ]
    if not wide:
        return
    graph: Any = exported.module(check_guards=False)
    for node in graph.graph.nodes:  # .module() shares these dicts with `exported`; annotate writes
        if isinstance(node.meta.get("custom"), dict):
            node.meta["custom"] = dict(node.meta["custom"])
    graph = base.transform_for_annotation(graph)
    samplers: dict[str, Any] = {
        f"grid_sampler_{role}_qspec": value
        for role, value in (
            ("image", quant.sampler_image),
            ("grid", quant.sampler_grid),
            ("output", quant.sampler_output),
        )
        if not isinstance(value, Calibrated)  # the defaults have the calibrated ones' widths
    }
    inputs = quant.inputs if quant.inputs is not None else (None,) * len(user_inputs(graph))
    provisional = BoundaryQuantizer(
        base,
        input_qspecs=inputs,
        output_qspecs=quant.outputs,
        grid_math=quant.grid_math,  # type: ignore[arg-type]  # checked: check_grid_math
        **samplers,
    )
    provisional.annotate(graph)
    outputs = user_outputs(graph)
    for k, qspec in wide:
        writer = _integer_writer(outputs[k], qspec)
        if writer is None:
            continue
        bits = qspec.dtype.itemsize * 8
        op = target_name(writer) or str(writer.target)
        raise UnproducibleQspecError(
            f"output {k} asks for {describe_qspec(qspec)}, which XNNPACK cannot produce: "
            f"{writer.name} ({op}) would write it, an op XNNPACK computes from int8 values and "
            f"cannot write in {bits} bits (ExecuTorch 1.5.1 refuses the program when it loads); "
            f"give output {k} an 8-bit qspec for XNNPACK (snorm8, or the calibrated default) or "
            "export for vgf",
            boundary=f"output {k}",
            qspec=describe_qspec(qspec),
            op=writer.name,
        )


def _integer_writer(node: Node, qspec: QuantizationSpec) -> Node | None:
    """The op, among ``node`` and the ops its parameters reach back through (each writing
    ``qspec``), that writes ``qspec`` from 8-bit integer inputs; grid samplers left out (etkit's
    delegate, or the portable kernel, takes one with a wide output)."""
    seen: set[Node] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if current in seen or current.op != "call_function":
            continue
        seen.add(current)
        if _written(current) != qspec:
            continue
        annotation = current.meta.get(ANNOTATION_KEY)
        reads = [] if annotation is None else list(annotation.input_qspec_map.values())
        narrow = any(getattr(_resolved(q), "dtype", None) in _NARROW for q in reads)
        if narrow and not is_grid_sampler(current):
            return current
        pending.extend(current.all_input_nodes)
    return None


def _written(node: Node) -> Any:
    """The qspec ``node``'s output is quantized with (through shared qspecs), or ``None``."""
    annotation = node.meta.get(ANNOTATION_KEY)
    return _resolved(None if annotation is None else annotation.output_qspec)


def _resolved(qspec: Any, depth: int = 0) -> Any:
    """``qspec``, or the qspec a ``SharedQuantizationSpec`` shares (an op's output, an edge)."""
    while isinstance(qspec, SharedQuantizationSpec) and depth < 32:
        depth += 1
        target = qspec.edge_or_node
        if isinstance(target, Node):
            annotation = target.meta.get(ANNOTATION_KEY)
            qspec = None if annotation is None else annotation.output_qspec
            continue
        source, consumer = target
        annotation = consumer.meta.get(ANNOTATION_KEY)
        qspec = None if annotation is None else annotation.input_qspec_map.get(source)
    return qspec
