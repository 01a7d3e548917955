"""Quantization-spec presets with fixed parameters: the formats a GPU engine knows in advance.

Each preset is a torchao PT2E ``QuantizationSpec`` whose observer reports fixed parameters, so
calibration cannot move them. Two presets made with the same arguments are equal and hash alike,
which PT2E's ``prepare`` relies on to share one observer between the two ends of an edge.

``observed_int8`` is the one preset whose parameters calibration chooses (per tensor, MinMax);
``describe_qspec`` names any of them for reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Final

import torch
from torchao.quantization.pt2e.observer import FixedQParamsObserver, MinMaxObserver
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

    @property
    def low(self) -> float:
        """The smallest representable value, ``(quant_min - zero_point) * scale``."""
        return (self.quant_min - self.zero_point) * self.scale

    @property
    def high(self) -> float:
        """The largest representable value, ``(quant_max - zero_point) * scale``."""
        return (self.quant_max - self.zero_point) * self.scale

    @property
    def rounding_range(self) -> tuple[float, float]:
        """``[low - scale / 2, high + scale / 2]``: the values that round into the range. One
        inside it loses at most half a step, as every quantized value does; one beyond it is
        clipped."""
        half = self.scale / 2
        return self.low - half, self.high + half


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


def _symmetric_range(dtype: torch.dtype) -> tuple[int, int]:
    """The symmetric range of ``dtype`` (signed: without the most negative value), or ``[0,
    max]`` for uint8."""
    if dtype not in _DTYPE_RANGES:
        raise ValueError(
            f"dtype must be one of {', '.join(str(d) for d in _DTYPE_RANGES)}, got {dtype!r}"
        )
    low, high = _DTYPE_RANGES[dtype]
    return (0, high) if low == 0 else (-high, high)


def fixed_scale(scale: float, dtype: torch.dtype = torch.int16) -> QuantizationSpec:
    """A fixed ``scale``, zero point 0, the symmetric range of ``dtype`` (int8: [-127, 127],
    int16: [-32767, 32767], int32: [-(2**31 - 1), 2**31 - 1], uint8: [0, 255]):
    value = q * scale. ``fixed_scale(2 / 32767)`` is an int16 grid reaching [-2, 2]."""
    quant_min, quant_max = _symmetric_range(dtype)
    return fixed(scale, 0, dtype, quant_min, quant_max)


def covering(max_abs: float, dtype: torch.dtype = torch.int16) -> QuantizationSpec:
    """The fixed symmetric qspec of a signed ``dtype`` whose range is the smallest power of two
    ``p >= max_abs``: scale ``p / quant_max``, zero point 0, range [-p, p]. Covers every value of
    magnitude up to ``max_abs`` (and leaves headroom up to ``p``); a power-of-two range keeps
    the scale exact for the integer kernels. ``covering(1.5)`` is 2/32767 (int16),
    ``covering(20, torch.int8)`` is 32/127; ``covering(1.0)`` is ``snorm16()``.

    Raises ``ValueError`` for a ``max_abs`` that is not positive and finite, or a ``dtype`` that
    is not int8, int16 or int32."""
    if (
        isinstance(max_abs, bool)
        or not isinstance(max_abs, int | float)
        or not (math.isfinite(max_abs) and max_abs > 0)
    ):
        raise ValueError(f"max_abs must be positive and finite, got {max_abs!r}")
    if dtype not in (torch.int8, torch.int16, torch.int32):
        raise ValueError(f"covering needs a signed dtype (int8, int16, int32), got {dtype!r}")
    mantissa, exponent = math.frexp(float(max_abs))  # max_abs = mantissa * 2**exponent
    power = 2.0 ** (exponent - 1 if mantissa == 0.5 else exponent)
    return fixed_scale(power / _symmetric_range(dtype)[1], dtype)


def observed_int8(*, full_range: bool = False) -> QuantizationSpec:
    """A static per-tensor int8 qspec whose parameters calibration chooses: a ``MinMaxObserver``
    over every calibration sample, affine (zero point chosen too), range [-127, 127], or
    [-128, 127] with ``full_range`` (what XNNPACK computes: it clamps int8 there whatever the
    qspec says; ``BoundaryQuantizer`` picks it for a base that is not Arm's). Its range covers
    the calibrated values (and zero) to within half a step (the zero point is rounded). Equal and
    hashable by value like the fixed presets."""
    return QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=MinMaxObserver,
        quant_min=-128 if full_range else -127,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=False,
    )


def observed_int16() -> QuantizationSpec:
    """``observed_int8``'s int16 counterpart: a static per-tensor int16 qspec whose parameters
    calibration chooses (``MinMaxObserver``, symmetric, range [-32767, 32767]); for a tensor
    entering coordinate arithmetic whose int8 rounding would move grid positions too far, on a
    backend with int16 activations (VGF). Equal and hashable by value."""
    return QuantizationSpec(
        dtype=torch.int16,
        observer_or_fake_quant_ctr=MinMaxObserver,
        quant_min=-32767,
        quant_max=32767,
        qscheme=torch.per_tensor_symmetric,
        is_dynamic=False,
    )


def is_fixed(qspec: object) -> bool:
    """True for a qspec with fixed parameters (made by ``fixed`` and the presets built on it)."""
    return isinstance(qspec, QuantizationSpec) and isinstance(
        qspec.observer_or_fake_quant_ctr, FixedQParamsObserverFactory
    )


def _fraction(scale: float, quant_max: int) -> str | None:
    """``scale`` as ``"p/quant_max"`` when ``scale * quant_max`` is (within rounding) an integer
    or a power of two, else ``None``."""
    for numerator in (scale * quant_max, round(scale * quant_max)):
        if numerator > 0 and math.isclose(scale, numerator / quant_max, rel_tol=1e-12):
            mantissa, _ = math.frexp(numerator)
            if mantissa == 0.5 or float(numerator).is_integer():
                return f"{numerator:g}/{quant_max}"
    return None


def describe_qspec(qspec: QuantizationSpec | None) -> str:
    """A short human description of a qspec, for reports: ``"SNORM8 (int8, scale 1/127)"``,
    ``"int16, fixed scale 2/32767, range [-2, 2]"``, ``"int8, observed (MinMaxObserver), [-127,
    127]"``; ``"float"`` for ``None``."""
    if qspec is None:
        return "float"
    if not isinstance(qspec, QuantizationSpec):
        raise TypeError(f"expected a torchao QuantizationSpec or None, got {type(qspec).__name__}")
    dtype = str(qspec.dtype).removeprefix("torch.")
    if not is_fixed(qspec):
        ctr = qspec.observer_or_fake_quant_ctr
        inner = getattr(ctr, "p", None)  # torchao's with_args wraps a functools.partial
        target = getattr(inner, "func", None) or getattr(ctr, "func", None) or ctr
        kind = "dynamic" if qspec.is_dynamic else "observed"
        name = getattr(target, "__name__", type(target).__name__)
        return f"{dtype}, {kind} ({name}), [{qspec.quant_min}, {qspec.quant_max}]"
    params = fixed_qparams(qspec)
    names = {snorm8(): "SNORM8", snorm16(): "SNORM16", unorm8(): "UNORM8"}
    for preset, name in names.items():
        if qspec == preset:
            return f"{name} ({dtype}, scale {_fraction(params.scale, params.quant_max)})"
    scale = _fraction(params.scale, params.quant_max) if params.zero_point == 0 else None
    mantissa, exponent = math.frexp(params.scale)
    if scale is None and mantissa == 0.5 and exponent <= -3:  # 2**-4 and finer
        scale = f"2**{exponent - 1}"
    text = f"{dtype}, fixed scale {scale or f'{params.scale:.6g}'}"
    if params.zero_point:
        text += f", zero point {params.zero_point}"
    return f"{text}, range [{params.low:.6g}, {params.high:.6g}]"


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
