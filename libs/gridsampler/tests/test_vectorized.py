"""The vectorized CPU kernels (AVX2, AVX-512) against the scalar one: the same bits over every
int16 grid value, every padding and align_corners setting, both modes, every channel count and
layout the vectorized passes serve, the requantization forms, float output, image sizes at the
vector paths' edges, pixels that fall back to the scalar steps, runs across batch elements and
images that end at an unreadable page."""

from __future__ import annotations

import ctypes
import itertools
import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from gridsampler_cases import (
    CHANNELS,
    COMBINATIONS,
    GRID_Q,
    IMAGE_Q,
    ONE_OF_EACH,
    OUTPUT_Q,
    SNORM8,
    SNORM16,
    every_grid_value,
    near_image_grid,
    random_image,
    row_length_cases,
)

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
    with pytest.raises(ValueError, match=r"isa must be 'auto' or one of .* got 'sse9'"):
        cpu.grid_sample(image, grid, op, isa="sse9")  # type: ignore[arg-type]


# The image sizes the every-grid-value tests sample (each costs the same: one output per grid
# value); 9 x 13 runs on demand in the monorepo's run (pytest -m extended).
EVERY_VALUE_SIZES = [(2, 2), (37, 61), pytest.param((9, 13), marks=pytest.mark.extended)]


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
@pytest.mark.parametrize("size", EVERY_VALUE_SIZES)
@pytest.mark.parametrize(
    ("padding", "align_corners"),
    list(itertools.product(["zeros", "border", "reflection"], [False, True])),
)
def test_same_bits_as_scalar_over_every_grid_value(
    padding: str, align_corners: bool, size: tuple[int, int]
) -> None:
    for height, width in (size,):
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
    for out_width, image, grid, strided in row_length_cases(generator):
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


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
@pytest.mark.parametrize("size", EVERY_VALUE_SIZES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_every_mode_same_bits_as_scalar_over_every_grid_value(
    mode: str, padding: str, align_corners: bool, size: tuple[int, int]
) -> None:
    """Steps 1 to 3 (the same for every channel count) in each of their vector forms: integer,
    float64, exact 64-bit (reflection), the nearest integer form and int8 tables, over every
    grid value, on a planar one-channel image (where every pixel, inside the image or not,
    stays on the vector path), and for nearest also a 4-channel channels-last one (bilinear's
    is the test above's)."""
    layouts = (0, 1) if mode == "nearest" else (0,)
    for (height, width), channels_last in itertools.product((size,), layouts):
        generator = torch.Generator().manual_seed(height * 100 + width)
        image = random_image((1, 4 if channels_last else 1, height, width), generator)
        if channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        for image_q, grid_q, output_q in itertools.product(IMAGE_Q, GRID_Q, OUTPUT_Q[::2]):
            grid = every_grid_value(grid_q.dtype, 1)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            expected = cpu.grid_sample(image, grid, op, isa="scalar")
            for isa in VECTOR_ISAS:
                actual = cpu.grid_sample(image, grid, op, isa=isa)  # type: ignore[arg-type]
                assert torch.equal(actual, expected), f"{isa}: {op}, {tuple(image.shape)}"


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
@pytest.mark.parametrize("channels", CHANNELS)
def test_every_channel_count_and_layout_same_bits_as_scalar(channels: int) -> None:
    """Steps 4 and 5 of each channel count in both layouts, both modes, every padding: images
    from 2 x 2 up, outputs whose rows end anywhere in a vector, grids that are not (x, y) pairs,
    taps outside the image and each requantization form."""
    generator = torch.Generator().manual_seed(channels)
    sizes = [(2, 2), (3, 5), (7, 2), (11, 23)]
    for index, (mode, padding, align_corners) in enumerate(COMBINATIONS):
        height, width = sizes[index % len(sizes)]
        image = random_image((2, channels, height, width), generator)
        for image_q, grid_q, output_q in ONE_OF_EACH:
            grid = near_image_grid((2, 5, 37), 0.7, generator, grid_q.dtype)
            strided = grid.transpose(1, 2).contiguous().transpose(1, 2)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            for layout, g in itertools.product(
                (torch.contiguous_format, torch.channels_last), (grid, strided)
            ):
                im = image.contiguous(memory_format=layout)
                expected = cpu.grid_sample(im, g, op, isa="scalar")
                for isa in VECTOR_ISAS:
                    actual = cpu.grid_sample(im, g, op, isa=isa)  # type: ignore[arg-type]
                    assert torch.equal(actual, expected), f"{isa}: {op}, {tuple(im.stride())}"


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_runs_across_batch_elements_same_bits_as_scalar(mode: str) -> None:
    """A correlation lookup: many small images, 9 x 9 samples of each around a point, which the
    kernel runs many batch elements at a time; also split over threads."""
    generator = torch.Generator().manual_seed(5)
    for channels, (height, width) in itertools.product((1, 2, 4), ((2, 3), (5, 7), (23, 31))):
        batch = 67
        image = random_image((batch, channels, height, width), generator)
        centre = torch.rand((batch, 1, 1, 2), generator=generator) * 2 - 1
        steps = torch.linspace(-4, 4, 9)
        dy, dx = torch.meshgrid(steps, steps, indexing="ij")
        offsets = torch.stack((dx * 2 / width, dy * 2 / height), -1)
        grid = torch.clamp(torch.round((centre + offsets) * 32767), -32768, 32767).to(torch.int16)
        for padding, layout in itertools.product(
            ("zeros", "border"), (torch.contiguous_format, torch.channels_last)
        ):
            im = image.contiguous(memory_format=layout)
            op = GridSampleOp(mode, padding, True, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
            expected = cpu.grid_sample(im, grid, op, isa="scalar")
            for isa, threads in itertools.product(VECTOR_ISAS, (1, 2)):
                actual = cpu.grid_sample(im, grid, op, isa=isa, num_threads=threads)  # type: ignore[arg-type]
                assert torch.equal(actual, expected), f"{isa}, {threads} threads: {op}"


@contextmanager
def image_between_unreadable_pages(
    shape: tuple[int, int, int, int], layout: torch.memory_format, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """An int8 image whose first byte follows an unreadable page and whose last byte precedes
    one: a kernel that reads a byte outside it crashes the test."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    size = shape[0] * shape[1] * shape[2] * shape[3]
    body = (size + page - 1) // page * page
    total = body + 2 * page
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    base = libc.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.mprotect(base, page, 0) == 0
        assert libc.mprotect(base + page + body, page, 0) == 0
        # the image's last byte ends the readable pages (and for images of a page or less, its
        # first byte starts them: the body is one page then)
        start = base + page + body - size
        buffer = (ctypes.c_int8 * size).from_address(start)
        flat = torch.frombuffer(buffer, dtype=torch.int8)
        values = random_image(shape, generator).contiguous(memory_format=layout)
        permuted = values.permute(0, 2, 3, 1) if layout == torch.channels_last else values
        flat.copy_(permuted.reshape(-1))
        view = flat.view(permuted.shape)
        yield view.permute(0, 3, 1, 2) if layout == torch.channels_last else view
    finally:
        libc.munmap(base, total)


@pytest.mark.skipif(not VECTOR_ISAS, reason="this CPU has no vectorized kernel")
def test_reads_nothing_outside_the_image() -> None:
    """The gathers read whole words: near the image's last byte they clamp their addresses, and
    taps left of a row are read from the row and shifted. An image between two unreadable pages,
    sampled at and past every edge, in every mode, layout and channel count, in one block and in
    runs across batch elements."""
    generator = torch.Generator().manual_seed(9)
    for channels, (height, width), layout in itertools.product(
        (1, 2, 3, 4, 8, 16),
        ((1, 2), (2, 2), (3, 5), (4, 1)),
        (torch.contiguous_format, torch.channels_last),
    ):
        shape = (3, channels, height, width)
        with image_between_unreadable_pages(shape, layout, generator) as image:
            copy = image.clone(memory_format=layout)
            grid = near_image_grid((3, 4, 21), 1.2, generator, torch.int16)
            for mode, padding in itertools.product(("bilinear", "nearest"), ("zeros", "border")):
                op = GridSampleOp(mode, padding, False, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
                expected = cpu.grid_sample(copy, grid, op, isa="scalar")
                for isa in VECTOR_ISAS:
                    actual = cpu.grid_sample(image, grid, op, isa=isa)  # type: ignore[arg-type]
                    assert torch.equal(actual, expected), f"{isa}: {op}, {shape}"
