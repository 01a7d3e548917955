"""What etkit-gridsampler's conformance and property tests check, in one place (on pytest's
pythonpath)."""

from __future__ import annotations

import torch

from etkit_gridsampler import GridSampleOp, QParams, cpu, reference, vulkan
from etkit_gridsampler.op import dequantize

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)


def near_tie(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """N x Ho x Wo: where the exact source coordinate of a nearest sampler lies within 1e-9
    pixel of a rounding tie (either axis), the contract lets the kernels pick either pixel."""
    g = dequantize(grid, op.grid)
    mask = torch.zeros(grid.shape[:3], dtype=torch.bool)
    for axis, size in ((0, image.shape[3]), (1, image.shape[2])):
        coord = g[..., axis]
        pixel = (coord + 1) / 2 * (size - 1) if op.align_corners else ((coord + 1) * size - 1) / 2
        if op.padding_mode == "reflection":
            low, span = (0.0, size - 1.0) if op.align_corners else (-0.5, float(size))
            if span > 0:
                folded = torch.remainder((pixel - low).abs(), 2 * span)
                pixel = torch.where(folded > span, 2 * span - folded, folded) + low
        fraction = pixel - torch.floor(pixel)
        mask |= (fraction - 0.5).abs() < 1e-9
    return mask


def check_against_reference(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> None:
    """The CPU kernel is within the contract's bound of the reference, its scalar form gives the
    same bits as its best vectorized form, and the Vulkan kernel the same bits again."""
    actual = cpu.grid_sample(image, grid, op)
    scalar = cpu.grid_sample(image, grid, op, isa="scalar")
    assert torch.equal(actual, scalar), f"the vectorized CPU kernel differs from the scalar: {op}"
    ideal = reference.grid_sample(image, grid, op)
    if op.output is not None:
        steps = (actual.to(torch.int32) - ideal.to(torch.int32)).abs()
    else:
        assert op.image is not None
        steps = (actual.to(torch.float64) - ideal).abs() / op.image.scale
    if op.mode == "nearest":
        # the same source pixel as the ideal, except within 1e-9 pixel of a rounding tie
        bound = 0.0 if op.output is not None else 1e-3
        allowed = near_tie(image, grid, op)[:, None].expand_as(steps)
        assert not ((steps > bound) & ~allowed).any(), f"nearest differs from the ideal: {op}"
    else:
        # within one quantization step (int8 output); float output: within 0.01 image steps
        bound = 1.0 if op.output is not None else 0.01
        assert steps.max().item() <= bound, f"{steps.max().item()} steps off: {op}"
    if vulkan.is_available():
        on_gpu = vulkan.grid_sample(image, grid, op)
        assert torch.equal(on_gpu, actual), f"Vulkan differs from the CPU kernel: {op}"
        assert on_gpu.stride() == actual.stride()


def random_grid(
    shape: tuple[int, int, int], dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, (*shape, 2), dtype=dtype, generator=generator)


def random_image(shape: tuple[int, int, int, int], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)
