"""The C++ kernel on float32 operands follows torch.nn.functional.grid_sample."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from etkit_gridsampler import GridSampleOp, cpu

COMBINATIONS = list(
    itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True])
)


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_pytorch(mode: str, padding: str, align_corners: bool, channels_last: bool) -> None:
    generator = torch.Generator().manual_seed(7)
    image = torch.randn(2, 3, 7, 9, generator=generator)
    # far outside [-1, 1] too, to exercise every padding mode
    grid = torch.rand(2, 5, 6, 2, generator=generator) * 3.2 - 1.6
    if channels_last:
        image = image.contiguous(memory_format=torch.channels_last)
    op = GridSampleOp(mode=mode, padding_mode=padding, align_corners=align_corners)  # type: ignore[arg-type]
    expected = F.grid_sample(
        image, grid, mode=mode, padding_mode=padding, align_corners=align_corners
    )
    actual = cpu.grid_sample(image, grid, op)
    assert actual.shape == (2, 3, 5, 6)
    assert actual.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_one_pixel_image() -> None:
    image = torch.tensor([[[[0.25]]]])
    grid = torch.tensor([[[[-1.0, -1.0], [0.3, 0.9], [5.0, -7.0]]]])
    for padding in ("zeros", "border", "reflection"):
        for align in (False, True):
            op = GridSampleOp("bilinear", padding, align)  # type: ignore[arg-type]
            expected = F.grid_sample(image, grid, padding_mode=padding, align_corners=align)
            torch.testing.assert_close(
                cpu.grid_sample(image, grid, op), expected, atol=1e-6, rtol=0
            )


def test_bad_shapes_raise_value_error() -> None:
    op = GridSampleOp()
    with pytest.raises(ValueError, match="image must be N x C x H x W"):
        cpu.grid_sample(torch.zeros(3, 4, 4), torch.zeros(1, 2, 2, 2), op)
    with pytest.raises(ValueError, match="grid must be N x Ho x Wo x 2"):
        cpu.grid_sample(torch.zeros(1, 3, 4, 4), torch.zeros(1, 2, 2, 3), op)
    with pytest.raises(ValueError, match="same batch size"):
        cpu.grid_sample(torch.zeros(2, 3, 4, 4), torch.zeros(1, 2, 2, 2), op)
    with pytest.raises(ValueError, match="float32"):
        cpu.grid_sample(torch.zeros(1, 3, 4, 4, dtype=torch.float64), torch.zeros(1, 2, 2, 2), op)
