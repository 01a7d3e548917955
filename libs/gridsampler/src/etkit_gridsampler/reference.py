"""The ideal the integer kernels are held to: PyTorch's float64 grid_sample on the dequantized
inputs, then quantized to the output's parameters (round half to even, clamp)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from etkit_gridsampler.cpu import check_inputs, check_op
from etkit_gridsampler.op import GridSampleOp, dequantize, quantize


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """The ideal output of ``op``: int8 when ``op.output`` is set, else float64. The operands
    are checked as the kernels check them (``cpu.check_inputs``); a float tensor may have any
    floating dtype, a quantized one must have its QParams' dtype. Any op, inside the contract
    or not."""
    check_op(op)
    check_inputs(image, grid)
    for name, tensor, qparams in (("image", image, op.image), ("grid", grid, op.grid)):
        if qparams is None and not tensor.dtype.is_floating_point:
            raise ValueError(
                f"{name} must be a floating-point tensor (op.{name} is None), got {tensor.dtype}"
            )
        if qparams is not None and tensor.dtype != qparams.dtype:
            raise ValueError(
                f"{name} must be {qparams.dtype}, the dtype of op.{name}, got {tensor.dtype}"
            )
    result = F.grid_sample(
        dequantize(image, op.image),
        dequantize(grid, op.grid),
        mode=op.mode,
        padding_mode=op.padding_mode,
        align_corners=op.align_corners,
    )
    return result if op.output is None else quantize(result, op.output)
