"""The derived constants of the integer contract (docs/contract.md), computed once, by the C++
code, for every kernel: the CPU kernel plans internally, the Vulkan kernel gets these as push
constants."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

import torch

from etkit_gridsampler._library import CQParams, native_library
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp, QParams


class UnsupportedOpError(ValueError):
    """The op (with these shapes) is outside what the grid-sampler backend implements."""


@dataclass(frozen=True)
class QuantizedPlan:
    """``plan[0..15]`` of ``etkit_gridsampler_plan`` and the float output scale."""

    values: tuple[int, ...]
    float_output_scale: float


def c_qparams(qparams: QParams | None) -> CQParams | None:
    if qparams is None:
        return None
    return CQParams(qparams.scale, qparams.zero_point, qparams.quant_min, qparams.quant_max)


def _check_arguments(op: object, height: object, width: object) -> str | None:
    """Raises ``TypeError`` naming the argument that is not a ``GridSampleOp`` or an int; returns
    why the sizes cannot be sampled (below 1), or ``None``."""
    if not isinstance(op, GridSampleOp):
        raise TypeError(f"op must be an etkit_gridsampler.GridSampleOp, got {type(op).__name__}")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int (the image's size), got {value!r}")
    assert isinstance(height, int) and isinstance(width, int)
    if height < 1 or width < 1:
        return f"image height and width must be at least 1, got {height} x {width}"
    return None


@lru_cache(maxsize=1024, typed=True)  # pure; the CPU kernel asks it on every call
def unsupported_reason(op: GridSampleOp, height: int, width: int) -> str | None:
    """Why ``op`` on an image of ``height`` x ``width`` is outside the backend's contract, or
    ``None`` when the backend implements it (sizes below 1 are a reason). Raises ``TypeError``
    for arguments that are not an op and two ints."""
    size_reason = _check_arguments(op, height, width)
    if size_reason is not None:
        return size_reason
    if op.is_float:
        return None
    if op.image is None or op.image.dtype != torch.int8:
        return "a quantized grid sampler needs an int8 image"
    if op.grid is None or op.grid.dtype not in (torch.int16, torch.int8):
        return "a quantized grid sampler needs an int16 or int8 grid"
    if op.output is not None and op.output.dtype != torch.int8:
        return "a quantized grid sampler writes int8 or float32"
    try:
        plan(op, height, width)
    except UnsupportedOpError as error:
        return str(error)
    return None


def plan(op: GridSampleOp, height: int, width: int) -> QuantizedPlan:
    """The integer contract's constants for ``op`` on an image of ``height`` x ``width``.
    Raises ``UnsupportedOpError`` saying why when the configuration is outside the contract (or
    a size is below 1), ``TypeError`` for arguments that are not an op and two ints."""
    size_reason = _check_arguments(op, height, width)
    if size_reason is not None:
        raise UnsupportedOpError(size_reason)
    if op.image is None or op.grid is None:
        raise UnsupportedOpError("the integer contract needs a quantized image and grid")
    values = (ctypes.c_int64 * 16)()
    float_scale = ctypes.c_float()
    error = ctypes.c_char_p()
    image_q, grid_q, output_q = (c_qparams(q) for q in (op.image, op.grid, op.output))
    status = native_library().etkit_gridsampler_plan(
        MODE_CODES[op.mode],
        PADDING_CODES[op.padding_mode],
        int(op.align_corners),
        ctypes.byref(image_q) if image_q else None,
        ctypes.byref(grid_q) if grid_q else None,
        int(op.grid.dtype == torch.int8),
        ctypes.byref(output_q) if output_q else None,
        height,
        width,
        values,
        ctypes.byref(float_scale),
        ctypes.byref(error),
    )
    if status != 0:
        raise UnsupportedOpError(error.value.decode() if error.value else "unsupported op")
    return QuantizedPlan(tuple(values), float_scale.value)
