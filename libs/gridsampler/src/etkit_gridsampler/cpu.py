"""The CPU kernel (C++), called from Python."""

from __future__ import annotations

import ctypes

import torch

from etkit_gridsampler._library import native_library
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp


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


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """Samples ``image`` (N x C x H x W, contiguous or channels-last) at ``grid`` (N x Ho x Wo x 2)
    as ``op`` says. The output has the image's memory format.

    This build implements float32 images and grids (``op.is_float``); quantized operands raise
    ``NotImplementedError``."""
    check_inputs(image, grid)
    if not op.is_float:
        raise NotImplementedError("the integer grid sampler is not implemented yet")
    if image.dtype != torch.float32 or grid.dtype != torch.float32:
        raise ValueError(
            f"a float GridSampleOp needs float32 image and grid, got {image.dtype} and {grid.dtype}"
        )
    channels_last = image.is_contiguous(memory_format=torch.channels_last) and not (
        image.is_contiguous()
    )
    output = torch.empty(
        (image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]),
        dtype=torch.float32,
        memory_format=torch.channels_last if channels_last else torch.contiguous_format,
    )
    status = native_library().etkit_gridsampler_grid_sample_f32(
        image.data_ptr(),
        _int64_array(image.shape),
        _int64_array(image.stride()),
        grid.data_ptr(),
        _int64_array(grid.shape),
        _int64_array(grid.stride()),
        output.data_ptr(),
        _int64_array(output.stride()),
        MODE_CODES[op.mode],
        PADDING_CODES[op.padding_mode],
        int(op.align_corners),
    )
    if status != 0:
        raise ValueError(f"the native kernel rejected the arguments of {op}")
    return output
