"""Quantization-spec presets with fixed parameters: the formats a GPU engine knows in advance.

Each preset is a torchao PT2E ``QuantizationSpec`` whose observer reports fixed parameters, so
calibration cannot move them. Two presets made with the same arguments are equal and hash alike,
which PT2E's ``prepare`` relies on to share one observer between the two ends of an edge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Final

import torch
from torchao.quantization.pt2e.observer import FixedQParamsObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec

_DTYPE_RANGES: Final[dict[torch.dtype, tuple[int, int]]] = {
    torch.int8: (-128, 127),
    torch.uint8: (0, 255),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}


class FixedQParamsObserverFactory:
    """The ``observer_or_fake_quant_ctr`` of a fixed-parameter preset: builds a
    ``FixedQParamsObserver`` with this scale and zero point. Compared and hashed by value."""

    __name__ = "FixedQParamsObserverFactory"  # PT2E's prepare reads the constructor's __name__

    def __init__(self, scale: float, zero_point: int) -> None:
        self.scale = float(scale)
        self.zero_point = int(zero_point)

    def with_args(self, **kwargs: Any) -> functools.partial[FixedQParamsObserver]:
        """What PT2E's ``prepare`` calls with the spec's dtype, range and qscheme."""
        kwargs.pop("is_dynamic", None)
        return functools.partial(
            FixedQParamsObserver, scale=self.scale, zero_point=self.zero_point, **kwargs
        )

    def __call__(self, **kwargs: Any) -> FixedQParamsObserver:
        return self.with_args(**kwargs)()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedQParamsObserverFactory) and (self.scale, self.zero_point) == (
            other.scale,
            other.zero_point,
        )

    def __hash__(self) -> int:
        return hash((FixedQParamsObserverFactory, self.scale, self.zero_point))

    def __repr__(self) -> str:
        return f"FixedQParamsObserverFactory(scale={self.scale!r}, zero_point={self.zero_point})"


@dataclass(frozen=True)
class FixedQParams:
    """The fixed parameters of a preset, read back: ``value = (q - zero_point) * scale`` with
    ``q`` in ``[quant_min, quant_max]`` of ``dtype``."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype


def fixed(
    scale: float, zero_point: int, dtype: torch.dtype, quant_min: int, quant_max: int
) -> QuantizationSpec:
    """A per-tensor qspec with fixed ``scale`` and ``zero_point``.

    Raises ``ValueError`` when the scale is not positive and finite, the dtype is not an integer
    dtype PT2E quantizes to (int8, uint8, int16, int32), the range does not lie inside the dtype,
    or the zero point lies outside the range."""
    if not isinstance(scale, int | float) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be positive and finite, got {scale!r}")
    if dtype not in _DTYPE_RANGES:
        raise ValueError(
            f"dtype must be one of {', '.join(str(d) for d in _DTYPE_RANGES)}, got {dtype!r}"
        )
    low, high = _DTYPE_RANGES[dtype]
    for name, value in (
        ("zero_point", zero_point),
        ("quant_min", quant_min),
        ("quant_max", quant_max),
    ):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= quant_min <= quant_max <= high:
        raise ValueError(
            f"range [{quant_min}, {quant_max}] must be non-empty and inside {dtype}'s "
            f"[{low}, {high}]"
        )
    if not quant_min <= zero_point <= quant_max:
        raise ValueError(f"zero_point {zero_point} must lie in [{quant_min}, {quant_max}]")
    return QuantizationSpec(
        dtype=dtype,
        observer_or_fake_quant_ctr=FixedQParamsObserverFactory(scale, zero_point),
        quant_min=quant_min,
        quant_max=quant_max,
        qscheme=torch.per_tensor_symmetric if zero_point == 0 else torch.per_tensor_affine,
        is_dynamic=False,
    )


def snorm8() -> QuantizationSpec:
    """int8 SNORM, as a GPU reads an R8_SNORM texel: value = q / 127, q in [-127, 127]."""
    return fixed(1 / 127, 0, torch.int8, -127, 127)


def snorm16() -> QuantizationSpec:
    """int16 SNORM: value = q / 32767, q in [-32767, 32767]. The default for sampling grids."""
    return fixed(1 / 32767, 0, torch.int16, -32767, 32767)


def unorm8() -> QuantizationSpec:
    """uint8 UNORM, as a GPU reads an R8_UNORM texel: value = q / 255, q in [0, 255]."""
    return fixed(1 / 255, 0, torch.uint8, 0, 255)


def qformat(frac_bits: int, bits: int = 8, signed: bool = True) -> QuantizationSpec:
    """A Q-format: value = q * 2**-frac_bits, zero point 0, the full symmetric range of ``bits``
    (signed: [-(2**(bits-1) - 1), 2**(bits-1) - 1]; unsigned: [0, 2**bits - 1]).
    ``qformat(7)`` is Q0.7; ``qformat(12, bits=16)`` is Q3.12. ``bits`` is 8 or 16 (unsigned: 8)."""
    if not isinstance(frac_bits, int) or isinstance(frac_bits, bool) or not 0 <= frac_bits <= 31:
        raise ValueError(f"frac_bits must be an int in [0, 31], got {frac_bits!r}")
    if signed and bits == 8:
        return fixed(2.0**-frac_bits, 0, torch.int8, -127, 127)
    if signed and bits == 16:
        return fixed(2.0**-frac_bits, 0, torch.int16, -32767, 32767)
    if not signed and bits == 8:
        return fixed(2.0**-frac_bits, 0, torch.uint8, 0, 255)
    raise ValueError(
        f"a Q-format has bits=8 or 16 when signed and bits=8 when unsigned, got bits={bits!r}, "
        f"signed={signed!r}"
    )


def fixed_qparams(qspec: QuantizationSpec) -> FixedQParams:
    """The fixed parameters of a preset (for reports and runtimes). Raises ``ValueError`` for a
    qspec whose parameters are observed rather than fixed."""
    if not isinstance(qspec, QuantizationSpec):
        raise TypeError(f"expected a torchao QuantizationSpec, got {type(qspec).__name__}")
    factory = qspec.observer_or_fake_quant_ctr
    if not isinstance(factory, FixedQParamsObserverFactory):
        raise ValueError(
            f"{qspec!r} has observed, not fixed, parameters; make it with etkit_quant's presets"
        )
    low, high = _DTYPE_RANGES[qspec.dtype]
    return FixedQParams(
        scale=factory.scale,
        zero_point=factory.zero_point,
        quant_min=low if qspec.quant_min is None else qspec.quant_min,
        quant_max=high if qspec.quant_max is None else qspec.quant_max,
        dtype=qspec.dtype,
    )
