"""Each boundary's qspec chosen from the observed ranges (``default_qspecs``): SNORM16 or a
covering int16 scale for grids, SNORM8 or observed int8 for other values, so that nothing
chosen clips the calibration data (the rule is in ``default_qspecs`` and
docs/libraries/quant-guide.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import torch
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant.qspecs import covering, observed_int8, snorm8, snorm16
from etkit_quant.ranges import ObservedRange, RangeObservation

SNORM8_MIN_ABS: Final = 0.5
"""``default_qspecs`` picks SNORM8 for data inside [-1, 1] only when its largest magnitude is at
least this: data that uses less than half of SNORM8's range gets an observed int8 qspec, which
spends all 255 levels on it."""


def _span(ranges: Iterable[ObservedRange]) -> tuple[float, float, bool]:
    """(min, max, all finite) over ``ranges``; (0, 0, True) when nothing was seen."""
    low, high, finite = math.inf, -math.inf, True
    for observed in ranges:
        finite &= observed.nonfinite == 0
        if observed.count > observed.nonfinite:
            low, high = min(low, observed.min), max(high, observed.max)
    return (0.0, 0.0, finite) if low > high else (low, high, finite)


def value_qspec(
    ranges: Iterable[ObservedRange], *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> QuantizationSpec:
    """The default qspec of values (not grids) seen in ``ranges``: ``snorm8()`` when every value
    lies in [-1, 1] and the largest magnitude is at least ``snorm8_min_abs``; otherwise
    ``observed_int8()``, per-tensor int8 whose parameters calibration chooses to cover the
    observed range (and zero)."""
    low, high, finite = _span(ranges)
    max_abs = max(abs(low), abs(high))
    if finite and low >= -1.0 and high <= 1.0 and max_abs >= snorm8_min_abs:
        return snorm8()
    return observed_int8()


def grid_qspec(ranges: Iterable[ObservedRange]) -> QuantizationSpec:
    """The default qspec of sampling grids seen in ``ranges``: ``snorm16()`` when every value
    lies in [-1, 1]; otherwise ``covering(max_abs, torch.int16)``, the fixed int16 scale
    ``p / 32767`` with ``p`` the smallest power of two at or above the largest magnitude (2/32767
    for grids reaching 1.5)."""
    low, high, _ = _span(ranges)
    max_abs = max(abs(low), abs(high))
    if max_abs <= 1.0:
        return snorm16()
    return covering(max_abs, torch.int16)


def default_qspec(
    observed: ObservedRange, *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> QuantizationSpec | None:
    """The default qspec of one graph input or output: ``None`` (left as it is) for a tensor that
    is not floating point, ``grid_qspec`` for a grid (see ``ObservedRange.is_grid``),
    ``value_qspec`` for anything else."""
    if not observed.dtype.is_floating_point:
        return None
    if observed.is_grid:
        return grid_qspec([observed])
    return value_qspec([observed], snorm8_min_abs=snorm8_min_abs)


@dataclass(frozen=True)
class DefaultQSpecs:
    """Qspecs chosen from the data for a ``BoundaryQuantizer``; its keyword arguments are
    ``kwargs()``: ``BoundaryQuantizer(base, **defaults.kwargs())``."""

    input_qspecs: tuple[QuantizationSpec | None, ...]
    output_qspecs: tuple[QuantizationSpec | None, ...]
    grid_sampler_image_qspec: QuantizationSpec
    grid_sampler_grid_qspec: QuantizationSpec
    grid_sampler_output_qspec: QuantizationSpec

    def kwargs(self) -> dict[str, Any]:
        """The ``BoundaryQuantizer`` keyword arguments (all five)."""
        return {
            "input_qspecs": self.input_qspecs,
            "output_qspecs": self.output_qspecs,
            "grid_sampler_image_qspec": self.grid_sampler_image_qspec,
            "grid_sampler_grid_qspec": self.grid_sampler_grid_qspec,
            "grid_sampler_output_qspec": self.grid_sampler_output_qspec,
        }


def default_qspecs(
    observation: RangeObservation, *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> DefaultQSpecs:
    """Every boundary's qspec chosen from ``observation``:

    - each graph input and output: ``default_qspec`` (grid-shaped inputs as grids);
    - grid samplers' grids (one qspec for all): ``grid_qspec`` over every sampler's grid;
    - grid samplers' images: ``value_qspec`` over every sampler's image (SNORM8 when all lie in
      [-1, 1], else observed int8, which each sampler observes for itself);
    - grid samplers' outputs: ``value_qspec`` over every sampler's image and output.

    Nothing chosen this way clips the calibration data (``saturation_report`` finds 0 values
    outside every fixed range chosen)."""
    images = observation.grid_sampler_images
    return DefaultQSpecs(
        input_qspecs=tuple(
            default_qspec(r, snorm8_min_abs=snorm8_min_abs) for r in observation.inputs
        ),
        output_qspecs=tuple(
            default_qspec(r, snorm8_min_abs=snorm8_min_abs) for r in observation.outputs
        ),
        grid_sampler_image_qspec=value_qspec(images, snorm8_min_abs=snorm8_min_abs),
        grid_sampler_grid_qspec=grid_qspec(observation.grid_sampler_grids),
        grid_sampler_output_qspec=value_qspec(
            images + observation.grid_sampler_outputs, snorm8_min_abs=snorm8_min_abs
        ),
    )
