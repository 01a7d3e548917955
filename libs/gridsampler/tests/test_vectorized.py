"""The vectorized CPU kernels (AVX2, AVX-512) against the scalar one: the same bits over every
int16 grid value, every padding and align_corners setting, the requantization forms, float
output, image sizes at the vector paths' edges and pixels that fall back to the scalar steps."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from gridsampler_cases import SNORM8, SNORM16, random_image

from etkit_gridsampler import GridSampleOp, QParams, cpu

VECTOR_ISAS = [isa for isa in ("avx2", "avx512") if isa in cpu.available_isas()]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_available_isas_match_the_cpu() -> None:
    """The kernels this CPU can run are offered, so the tests below do run them."""
    flags = cpu_flags()
    expected = ["scalar"]
    if {"avx2", "fma"} <= flags:
        expected.append("avx2")
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi", "avx512_vnni"} <= flags:
            expected.append("avx512")
    assert cpu.available_isas() == tuple(expected)


def test_unknown_or_missing_isa_is_refused() -> None:
    image = random_image((1, 4, 2, 2), torch.Generator().manual_seed(0))
    grid = torch.zeros(1, 1, 1, 2, dtype=torch.int16)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
    with pytest.raises(ValueError, match="isa must be 'auto' or one of"):
        cpu.grid_sample(image, grid, op, isa="neon")  # type: ignore[arg-type]


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


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
@pytest.mark.parametrize(
    ("padding", "align_corners"),
    list(itertools.product(["zeros", "border", "reflection"], [False, True])),
)
def test_same_bits_as_scalar_over_every_grid_value(padding: str, align_corners: bool) -> None:
    for height, width in ((2, 2), (9, 13), (37, 61)):
        generator = torch.Generator().manual_seed(height * 1000 + width)
        image = random_image((2, 4, height, width), generator)
        image = image.contiguous(memory_format=torch.channels_last)
        for image_q, grid_q, output_q in itertools.product(IMAGE_Q, GRID_Q, OUTPUT_Q):
            grid = every_grid_value(grid_q.dtype, 2)
            op = GridSampleOp("bilinear", padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            expected = cpu.grid_sample(image, grid, op, isa="scalar")
            for isa in VECTOR_ISAS:
                actual = cpu.grid_sample(image, grid, op, isa=isa)  # type: ignore[arg-type]
                assert torch.equal(actual, expected), f"{isa}: {op}, {height}x{width}"


@pytest.mark.parametrize("isa", VECTOR_ISAS)
def test_same_bits_as_scalar_on_row_lengths_and_strided_grids(isa: str) -> None:
    """Output rows of every length around the 8- and 16-pixel steps and the 256-pixel blocks, a
    near-identity grid (most pixels on the vector path, the right and bottom edges falling back),
    and a grid that is not contiguous."""
    generator = torch.Generator().manual_seed(3)
    for out_width in (1, 7, 8, 9, 15, 16, 17, 24, 255, 256, 257, 520):
        height, width, out_height = 5, out_width + 3, 4
        image = random_image((1, 4, height, width), generator)
        image = image.contiguous(memory_format=torch.channels_last)
        ys, xs = torch.linspace(-1.02, 1.02, out_height), torch.linspace(-1.02, 1.02, out_width)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        flow = torch.stack((gx, gy), -1).unsqueeze(0)
        flow = flow + 0.01 * torch.randn(flow.shape, generator=generator)
        grid = torch.clamp(torch.round(flow * 32767), -32768, 32767).to(torch.int16)
        strided = grid.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
        for padding, output_q in itertools.product(["zeros", "border"], OUTPUT_Q):
            op = GridSampleOp("bilinear", padding, False, SNORM8, SNORM16, output_q)  # type: ignore[arg-type]
            expected = cpu.grid_sample(image, grid, op, isa="scalar")
            for g in (grid, strided):
                actual = cpu.grid_sample(image, g, op, isa=isa)  # type: ignore[arg-type]
                assert torch.equal(actual, expected), f"{isa}, width {out_width}: {op}"


@pytest.mark.parametrize("isa", VECTOR_ISAS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_same_bits_as_scalar_where_coordinates_need_float64(isa: str, align_corners: bool) -> None:
    """AVX-512 computes steps 1 and 2 in 64-bit integer lanes where the grid's reduced
    multiplier fits 32 bits and the coordinates stay within 2^15 pixels, else in float64. A
    4096-pixel row with a grid reaching 32 widths out (scale 1/1024), and an odd 24-bit scale
    across it with align_corners, take the float64 form."""
    generator = torch.Generator().manual_seed(11)
    image = random_image((1, 4, 3, 4096), generator).contiguous(memory_format=torch.channels_last)
    grid = every_grid_value(torch.int16, 1)
    grid_qs = [QParams(1 / 1024, 0, -32768, 32767, torch.int16), GRID_Q[2]]
    for grid_q, padding, output_q in itertools.product(grid_qs, ["zeros", "border"], OUTPUT_Q):
        op = GridSampleOp("bilinear", padding, align_corners, SNORM8, grid_q, output_q)  # type: ignore[arg-type]
        expected = cpu.grid_sample(image, grid, op, isa="scalar")
        actual = cpu.grid_sample(image, grid, op, isa=isa)  # type: ignore[arg-type]
        assert torch.equal(actual, expected), f"{isa}: {op}"
