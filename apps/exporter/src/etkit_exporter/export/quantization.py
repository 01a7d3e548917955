"""The quantizer an export uses: the backend's own, with etkit's boundary, grid-sampler and
grid-position qspecs composed over it (``BoundaryQuantizer``), calibrated ranges where asked."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter.export.arguments import Calibrated, QuantOptions, SamplerQSpec
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
from etkit_quant.calibration import POSITION_TOLERANCE_PX, coordinate_position_error
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
        return default if isinstance(value, Calibrated) else value

    input_qspecs = _unread_inputs_float(
        exported, quant.inputs if quant.inputs is not None else defaults.input_qspecs
    )
    output_qspecs = quant.outputs if quant.outputs is not None else defaults.output_qspecs
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
