"""The ideal the integer kernels are held to: PyTorch's float64 grid_sample on the dequantized
inputs, then quantized to the output's parameters (round half to even, clamp)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from etkit_gridsampler.cpu import check_inputs
from etkit_gridsampler.op import GridSampleOp, dequantize, quantize


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """The ideal output of ``op``: int8 when ``op.output`` is set, else float64."""
    check_inputs(image, grid)
    result = F.grid_sample(
        dequantize(image, op.image),
        dequantize(grid, op.grid),
        mode=op.mode,
        padding_mode=op.padding_mode,
        align_corners=op.align_corners,
    )
    return result if op.output is None else quantize(result, op.output)
