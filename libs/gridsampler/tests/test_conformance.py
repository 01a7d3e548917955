"""Conformance of the integer kernels: every mode x padding x align_corners combination, across
shapes and grids that stress the edges, against the reference; CPU and Vulkan bit-identical."""

from __future__ import annotations

import pytest
import torch
from gridsampler_cases import (
    COMBINATIONS,
    CONFORMANCE_GRID_Q,
    CONFORMANCE_GRID_Q_IDS,
    CONFORMANCE_SHAPES,
    SNORM8,
    SNORM16,
    check_against_reference,
    random_grid,
    random_image,
)

from etkit_gridsampler import GridSampleOp, QParams, cpu, vulkan
from etkit_gridsampler.plan import UnsupportedOpError


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
@pytest.mark.parametrize("grid_q", CONFORMANCE_GRID_Q, ids=CONFORMANCE_GRID_Q_IDS)
def test_combination_across_shapes(
    mode: str, padding: str, align_corners: bool, grid_q: QParams
) -> None:
    generator = torch.Generator().manual_seed(hash((mode, padding, align_corners)) % 1000)
    for image_shape, (out_h, out_w) in CONFORMANCE_SHAPES:
        image = random_image(image_shape, generator)
        grid = random_grid((image_shape[0], out_h, out_w), grid_q.dtype, generator)
        for output_q in (SNORM8, QParams(0.011, -3, -128, 127, torch.int8), None):
            op = GridSampleOp(mode, padding, align_corners, SNORM8, grid_q, output_q)  # type: ignore[arg-type]
            check_against_reference(image, grid, op)
            check_against_reference(image.contiguous(memory_format=torch.channels_last), grid, op)


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_extreme_grid_values(mode: str, padding: str, align_corners: bool) -> None:
    """Grids at +-32767 and -32768, and at the corners and centres of pixels."""
    values = torch.tensor([-32768, -32767, -32766, -1, 0, 1, 16383, 16384, 32766, 32767])
    gx, gy = torch.meshgrid(values, values, indexing="ij")
    grid = torch.stack((gx, gy), -1).unsqueeze(0).to(torch.int16)
    for size in ((1, 4, 1, 1), (1, 4, 2, 3), (1, 4, 8, 8), (1, 2, 5, 16)):
        image = random_image(size, torch.Generator().manual_seed(1))
        for image_q in (SNORM8, QParams(0.02, 5, -128, 127, torch.int8)):
            op = GridSampleOp(mode, padding, align_corners, image_q, SNORM16, SNORM8)  # type: ignore[arg-type]
            check_against_reference(image, grid, op)


def test_identity_grid_reproduces_the_image() -> None:
    """align_corners=True with the pixel-centre grid samples every pixel exactly."""
    height, width = 5, 7
    ys = torch.tensor([round((2 * i / (height - 1) - 1) * 32767) for i in range(height)])
    xs = torch.tensor([round((2 * i / (width - 1) - 1) * 32767) for i in range(width)])
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack((gx, gy), -1).unsqueeze(0).to(torch.int16)
    image = random_image((1, 4, height, width), torch.Generator().manual_seed(2))
    for mode in ("bilinear", "nearest"):
        op = GridSampleOp(mode, "zeros", True, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
        assert torch.equal(cpu.grid_sample(image, grid, op), image.clamp(-127, 127))


def test_many_channels_and_large_sizes() -> None:
    generator = torch.Generator().manual_seed(3)
    wide = random_image((1, 64, 3, 5), generator)
    op = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)
    check_against_reference(wide, random_grid((1, 4, 6), torch.int16, generator), op)
    tall = random_image((1, 1, 4096, 2), generator)
    check_against_reference(tall, random_grid((1, 4096, 1), torch.int16, generator), op)
    long = random_image((1, 2, 1, 4096), generator)
    check_against_reference(long, random_grid((1, 1, 4096), torch.int16, generator), op)


def test_threads_do_not_change_the_result() -> None:
    generator = torch.Generator().manual_seed(4)
    image = random_image((2, 4, 64, 96), generator)
    grid = random_grid((2, 300, 280), torch.int16, generator)
    op = GridSampleOp("bilinear", "reflection", False, SNORM8, SNORM16, SNORM8)
    assert torch.equal(
        cpu.grid_sample(image, grid, op, num_threads=1),
        cpu.grid_sample(image, grid, op, num_threads=3),
    )


def test_outside_the_contract_is_refused_with_the_reason() -> None:
    image = torch.zeros(1, 1, 4096, 4096, dtype=torch.int8)
    grid = torch.zeros(1, 1, 1, 2, dtype=torch.int16)
    coarse = QParams(1.0, 0, -32768, 32767, torch.int16)
    with pytest.raises(UnsupportedOpError, match="exceed 2"):
        cpu.grid_sample(image, grid, GridSampleOp(image=SNORM8, grid=coarse, output=SNORM8))
    tiny_output = QParams(1e-4, 0, -128, 127, torch.int8)
    with pytest.raises(UnsupportedOpError, match="exceeds 32"):
        cpu.grid_sample(image, grid, GridSampleOp(image=SNORM8, grid=SNORM16, output=tiny_output))
    float_grid = torch.zeros(1, 1, 1, 2)
    with pytest.raises(UnsupportedOpError, match="int16 or int8 grid"):
        cpu.grid_sample(image, float_grid, GridSampleOp(image=SNORM8, output=SNORM8))
    with pytest.raises(ValueError, match=r"quantizes the image to torch\.int8"):
        cpu.grid_sample(image.float(), grid, GridSampleOp(image=SNORM8, grid=SNORM16))
    if vulkan.is_available():
        with pytest.raises(UnsupportedOpError, match="integer contract"):
            vulkan.grid_sample(image.float(), float_grid, GridSampleOp())
