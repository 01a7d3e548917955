"""The CPU kernel (C++), called from Python."""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Literal

import torch

from etkit_gridsampler._library import native_library
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp
from etkit_gridsampler.plan import UnsupportedOpError, c_qparams, unsupported_reason

Isa = Literal["auto", "scalar", "avx2", "avx512"]
# The C API's codes (etkit_gridsampler_best_isa); every instruction set computes the same bits.
_ISA_CODES: dict[str, int] = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}


@cache
def available_isas() -> tuple[str, ...]:
    """The instruction sets the integer kernel can use on this CPU, best last: a prefix of
    ``("scalar", "avx2", "avx512")`` ("avx512": F, BW, DQ, VL, VBMI and VNNI). The vectorized
    kernels serve bilinear sampling of 4-channel channels-last images into channels-last
    outputs; every other configuration runs the scalar one, whatever ``isa`` says."""
    best = native_library().etkit_gridsampler_best_isa()
    return tuple(name for name, code in _ISA_CODES.items() if 0 < code <= best)


def _int64_array(values: tuple[int, ...] | torch.Size) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


def check_inputs(image: torch.Tensor, grid: torch.Tensor) -> None:
    """Raises ``ValueError`` naming the argument whose shape does not fit grid sampling."""
    if image.dim() != 4:
        raise ValueError(f"image must be N x C x H x W (4-D), got shape {tuple(image.shape)}")
    if grid.dim() != 4 or grid.shape[-1] != 2:
        raise ValueError(f"grid must be N x Ho x Wo x 2, got shape {tuple(grid.shape)}")
    if grid.shape[0] != image.shape[0]:
        raise ValueError(
            f"image and grid must have the same batch size, got {image.shape[0]} and "
            f"{grid.shape[0]}"
        )
    if min(image.shape) < 1 or min(grid.shape) < 1:
        raise ValueError(f"empty image {tuple(image.shape)} or grid {tuple(grid.shape)}")


def check_dtypes(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.dtype:
    """Raises ``ValueError`` when the tensors' dtypes are not the ones ``op`` quantizes to, or
    ``UnsupportedOpError`` when ``op`` is outside the contract. Returns the output dtype."""
    if op.is_float:
        if image.dtype != torch.float32 or grid.dtype != torch.float32:
            raise ValueError(
                f"a float GridSampleOp needs float32 image and grid, got {image.dtype} and "
                f"{grid.dtype}"
            )
        return torch.float32
    reason = unsupported_reason(op, image.shape[2], image.shape[3])
    if reason is not None:
        raise UnsupportedOpError(reason)
    assert op.image is not None and op.grid is not None
    if image.dtype != op.image.dtype or grid.dtype != op.grid.dtype:
        raise ValueError(
            f"op quantizes the image to {op.image.dtype} and the grid to {op.grid.dtype}; got "
            f"{image.dtype} and {grid.dtype}"
        )
    return torch.float32 if op.output is None else op.output.dtype


def is_channels_last(image: torch.Tensor) -> bool:
    """True when ``image`` is NHWC in memory (and not also plain contiguous, as when C == 1)."""
    return (
        bool(image.is_contiguous(memory_format=torch.channels_last)) and not image.is_contiguous()
    )


def _output_like(image: torch.Tensor, grid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    channels_last = is_channels_last(image)
    return torch.empty(
        (image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]),
        dtype=dtype,
        memory_format=torch.channels_last if channels_last else torch.contiguous_format,
    )


def grid_sample(
    image: torch.Tensor,
    grid: torch.Tensor,
    op: GridSampleOp,
    *,
    num_threads: int = 0,
    isa: Isa = "auto",
) -> torch.Tensor:
    """Samples ``image`` (N x C x H x W, contiguous or channels-last) at ``grid`` (N x Ho x Wo x 2)
    as ``op`` says; the output has the image's memory format.

    Float ``op``: float32 tensors, within 1e-5 of PyTorch. Quantized ``op``: an int8 image, an
    int16 or int8 grid (the dtypes of ``op.image`` and ``op.grid``), int8 output when
    ``op.output`` is set, float32 otherwise, by the integer contract of docs/contract.md.
    ``num_threads``: 0 for all hardware threads (the integer kernel; the float one uses one).
    ``isa``: the integer kernel's instruction set, ``"auto"`` for the best in
    ``available_isas()``; all give the same bits (``"scalar"`` is there to check that).

    Raises ``ValueError`` for shapes or dtypes that do not fit, ``UnsupportedOpError`` (a
    ``ValueError``) for a configuration outside the contract."""
    check_inputs(image, grid)
    if isa not in _ISA_CODES or (isa != "auto" and isa not in available_isas()):
        raise ValueError(
            f"isa must be 'auto' or one of {available_isas()} on this CPU, got {isa!r}"
        )
    output_dtype = check_dtypes(image, grid, op)
    output = _output_like(image, grid, output_dtype)
    library = native_library()
    if op.is_float:
        status = library.etkit_gridsampler_grid_sample_f32(
            image.data_ptr(), _int64_array(image.shape), _int64_array(image.stride()),
            grid.data_ptr(), _int64_array(grid.shape), _int64_array(grid.stride()),
            output.data_ptr(), _int64_array(output.stride()),
            MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"the native kernel rejected the arguments of {op}")
        return output
    image_q, grid_q, output_q = (c_qparams(q) for q in (op.image, op.grid, op.output))
    error = ctypes.c_char_p()
    status = library.etkit_gridsampler_grid_sample_q(
        image.data_ptr(), _int64_array(image.shape), _int64_array(image.stride()),
        grid.data_ptr(), int(grid.dtype == torch.int8), _int64_array(grid.shape),
        _int64_array(grid.stride()),
        output.data_ptr(), _int64_array(output.stride()),
        MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        ctypes.byref(image_q) if image_q else None,
        ctypes.byref(grid_q) if grid_q else None,
        ctypes.byref(output_q) if output_q else None,
        num_threads, _ISA_CODES[isa], ctypes.byref(error),
    )  # fmt: skip
    if status != 0:
        raise UnsupportedOpError(error.value.decode() if error.value else "unsupported op")
    return output
