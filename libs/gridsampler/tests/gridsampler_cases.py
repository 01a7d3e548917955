"""What etkit-gridsampler's conformance and property tests check, in one place (on pytest's
pythonpath)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

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


# ---- the exhaustive cases of the vectorized kernels' tests (test_vectorized.py, x86, and
# test_neon_qemu.py, AArch64 under qemu) ----


def every_grid_value(dtype: torch.dtype, batch: int) -> torch.Tensor:
    """batch x 256 x 256 x 2 (int16) or batch x 16 x 16 x 2 (int8): x takes every value of the
    dtype once per image, y too, in an unrelated order."""
    info = torch.iinfo(dtype)
    values = torch.arange(info.min, info.max + 1, dtype=torch.int32)
    side = 256 if dtype == torch.int16 else 16
    grids = []
    for n in range(batch):
        order = torch.randperm(values.numel(), generator=torch.Generator().manual_seed(n))
        grids.append(torch.stack((values, values[order]), -1).reshape(side, side, 2))
    return torch.stack(grids).to(dtype)


def near_image_grid(
    shape: tuple[int, int, int], spread: float, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """N x Ho x Wo x 2: most points inside the image, many near and past its edges, some at
    exact pixel centres and halfway between them (rounding ties for nearest)."""
    info = torch.iinfo(dtype)
    values = torch.randn((*shape, 2), generator=generator) * spread * info.max
    ties = torch.randint(-8, 9, (*shape, 2), generator=generator) * (info.max // 8)
    values = torch.where(torch.rand((*shape, 1), generator=generator) < 0.25, ties, values)
    return torch.clamp(torch.round(values), info.min, info.max).to(dtype)


IMAGE_Q = [SNORM8, QParams(0.09375, 5, -128, 127, torch.int8)]
GRID_Q = [
    SNORM16,
    QParams(1 / 1024, 0, -32768, 32767, torch.int16),  # far outside [-1, 1]
    QParams(7.3e-5, -300, -32768, 32767, torch.int16),  # a zero point, an odd scale
    QParams(1 / 127, 3, -128, 127, torch.int8),  # scalar coordinates, vector sampling
    # 2^-16 (1 + 2^-23): on the 2-pixel image, step 1's rounding decides which tap dozens of
    # grid values (d in [-128, -1]) land on
    QParams(2**-16 * (1 + 2**-23), 0, -32768, 32767, torch.int16),
]
OUTPUT_Q = [
    SNORM8,  # equal scales: the 32-bit requantization with multiplier 1
    # a power-of-two ratio with an even zero point (AVX-512 folds it into the value)
    QParams(1 / 254, -4, -128, 127, torch.int8),
    # with the 0.09375 image, ratio 3 and an odd zero point: 32-bit lanes, multiplier 3
    QParams(0.03125, 1, -128, 127, torch.int8),
    QParams(0.011, -3, -128, 127, torch.int8),  # a general ratio: the 64-bit requantization
    None,  # float32 output
]
COMBINATIONS = list(
    itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True])
)
# The conformance configurations (test_conformance.py, test_torch_kernel.py):
# (image N x C x H x W, grid Ho x Wo): 1x1 images, odd sizes, Ho/Wo unlike H/W, N > 1, C in 1..8
CONFORMANCE_SHAPES = [
    ((1, 1, 1, 1), (3, 2)),
    ((1, 3, 1, 7), (4, 5)),
    ((2, 4, 9, 13), (7, 11)),
    ((3, 8, 6, 5), (10, 3)),
    ((1, 3, 17, 2), (1, 1)),
]
CONFORMANCE_GRID_Q = [
    SNORM16,
    QParams(1 / 1024, 0, -32768, 32767, torch.int16),  # far outside [-1, 1]: up to +-32
    QParams(1 / 127, 3, -128, 127, torch.int8),  # an int8 grid with a zero point
]
CONFORMANCE_GRID_Q_IDS = ["snorm16", "coarse16", "int8"]
ONE_OF_EACH = [  # (image, grid, output) quantizations that reach each vector form between them
    (IMAGE_Q[0], GRID_Q[0], OUTPUT_Q[0]),
    (IMAGE_Q[1], GRID_Q[1], OUTPUT_Q[2]),
    (IMAGE_Q[0], GRID_Q[2], OUTPUT_Q[3]),
    (IMAGE_Q[1], GRID_Q[3], OUTPUT_Q[4]),
    (IMAGE_Q[0], GRID_Q[4], OUTPUT_Q[1]),
    (QParams(0.05, -128, -128, 127, torch.int8), GRID_Q[0], OUTPUT_Q[4]),  # zero point -128
]
CHANNELS = [1, 2, 3, 4, 5, 8, 16, 32]  # 5: AVX2 only (any count from 2), else scalar


ROW_LENGTHS = (1, 7, 8, 9, 15, 16, 17, 24, 255, 256, 257, 520)


def row_length_cases(
    generator: torch.Generator,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(output width, image, grid, the grid with other strides) for output rows of every
    length around the 8- and 16-pixel steps and the 256-pixel blocks: a 4-channel
    channels-last image 3 pixels wider than the row, a near-identity int16 grid (most taps
    inside, the right and bottom edges outside) and the same values transposed in memory."""
    for out_width in ROW_LENGTHS:
        height, width, out_height = 5, out_width + 3, 4
        image = random_image((1, 4, height, width), generator)
        image = image.contiguous(memory_format=torch.channels_last)
        ys, xs = torch.linspace(-1.02, 1.02, out_height), torch.linspace(-1.02, 1.02, out_width)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        flow = torch.stack((gx, gy), -1).unsqueeze(0)
        flow = flow + 0.01 * torch.randn(flow.shape, generator=generator)
        grid = torch.clamp(torch.round(flow * 32767), -32768, 32767).to(torch.int16)
        strided = grid.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
        yield out_width, image, grid, strided
