"""What a grid sampler computes: its mode, padding, corner alignment and the quantization of its
image, grid and output. Values, not behaviour: frozen, comparable, hashable."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import torch

Mode = Literal["bilinear", "nearest"]
PaddingMode = Literal["zeros", "border", "reflection"]

# The integer codes of aten.grid_sampler_2d's interpolation_mode and padding_mode arguments.
MODE_CODES: Final[dict[str, int]] = {"bilinear": 0, "nearest": 1}
PADDING_CODES: Final[dict[str, int]] = {"zeros": 0, "border": 1, "reflection": 2}
MODE_NAMES: Final[dict[int, Mode]] = {0: "bilinear", 1: "nearest"}
PADDING_NAMES: Final[dict[int, PaddingMode]] = {0: "zeros", 1: "border", 2: "reflection"}

_DTYPE_RANGES: Final[dict[torch.dtype, tuple[int, int]]] = {
    torch.int8: (-128, 127),
    torch.int16: (-32768, 32767),
    torch.uint8: (0, 255),
}


@dataclass(frozen=True)
class QParams:
    """Per-tensor affine quantization: ``value = (q - zero_point) * scale``, ``q`` in
    ``[quant_min, quant_max]`` of ``dtype``. The scale is rounded to float32 on construction, as
    PT2E and ExecuTorch's quantized operators hold it; every kernel and the reference use that
    value."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", float(np.float32(self.scale)))
        if self.dtype not in _DTYPE_RANGES:
            raise ValueError(f"QParams dtype must be torch.int8, int16 or uint8, got {self.dtype}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"QParams scale must be positive and finite, got {self.scale}")
        low, high = _DTYPE_RANGES[self.dtype]
        if not low <= self.quant_min <= self.quant_max <= high:
            raise ValueError(
                f"QParams range [{self.quant_min}, {self.quant_max}] must lie inside "
                f"[{low}, {high}] of {self.dtype}"
            )
        if not self.quant_min <= self.zero_point <= self.quant_max:
            raise ValueError(
                f"QParams zero_point {self.zero_point} must lie in "
                f"[{self.quant_min}, {self.quant_max}]"
            )


@dataclass(frozen=True)
class GridSampleOp:
    """One grid sampler: ``torch.nn.functional.grid_sample(image, grid, mode, padding_mode,
    align_corners)`` with optional quantization of each tensor (``None``: float32)."""

    mode: Mode = "bilinear"
    padding_mode: PaddingMode = "zeros"
    align_corners: bool = False
    image: QParams | None = None
    grid: QParams | None = None
    output: QParams | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODE_CODES:
            raise ValueError(f"mode must be one of {sorted(MODE_CODES)}, got {self.mode!r}")
        if self.padding_mode not in PADDING_CODES:
            raise ValueError(
                f"padding_mode must be one of {sorted(PADDING_CODES)}, got {self.padding_mode!r}"
            )

    @property
    def is_float(self) -> bool:
        """True when image, grid and output are all float32."""
        return self.image is None and self.grid is None and self.output is None


def dequantize(q: torch.Tensor, qparams: QParams | None) -> torch.Tensor:
    """``q`` as float64 values (a float tensor when ``qparams`` is None)."""
    if qparams is None:
        return q.to(torch.float64)
    return (q.to(torch.float64) - qparams.zero_point) * qparams.scale


def quantize(values: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """Rounds (half to even, as PyTorch's quantize) and clamps ``values`` to ``qparams``."""
    q = torch.round(values.to(torch.float64) / qparams.scale) + qparams.zero_point
    return q.clamp(qparams.quant_min, qparams.quant_max).to(qparams.dtype)


def rounded_per_tensor(values: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """``nearbyint(values * (1 / scale)) + zero_point`` in float32 (halves to even), before the
    clamp: the arithmetic of PyTorch's ``quantized_decomposed.quantize_per_tensor`` and of
    ExecuTorch's kernel alike. They compute the inverse differently (a float64 quotient rounded
    to float32; a float32 quotient) but get the same float32: double rounding of a quotient is
    innocuous when the wider format has at least 2p + 2 bits (53 >= 2 * 24 + 2)."""
    if not values.dtype.is_floating_point:
        raise ValueError(f"values to quantize must be a floating-point tensor, got {values.dtype}")
    inverse = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(
        qparams.scale, dtype=torch.float32
    )
    return torch.round(values.to(torch.float32) * inverse) + float(qparams.zero_point)


def quantize_per_tensor(values: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """``values`` quantized as the program's ``quantize_per_tensor`` does (ExecuTorch's portable
    kernel, and the grid-sampler delegate that quantizes a grid on entry): ``rounded_per_tensor``
    clamped to ``[quant_min, quant_max]``, in ``qparams.dtype``. Bit for bit on finite values;
    NaN gives ``quant_min`` and infinities the bound on their side (ExecuTorch's kernel leaves NaN
    and values beyond int64 to the C++ conversion, which differs by CPU)."""
    rounded = torch.nan_to_num(rounded_per_tensor(values, qparams), nan=float(qparams.quant_min))
    return rounded.clamp(qparams.quant_min, qparams.quant_max).to(qparams.dtype)
