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


# Grid coordinates that are not numbers, infinite, huge (some overflow float32 when unnormalized,
# some pass int32 as pixel indices), at the int32 edges, and ordinary ones, each paired with each
# as (x, y).
SPECIAL_COORDINATES = [
    *(float("nan"), float("inf"), float("-inf")),
    *(3e38, -3e38, 1e30, -1e30, 1e10, -1e10, 2.0**31, -(2.0**31), 1e7, -1e7),
    *(0.0, -1.0, 1.0, 0.5, -0.999, 1.0000001, 100.5, -100.5),
]
IMAGE_SIZES = [(1, 1), (1, 6), (5, 1), (3, 5)]


def _special_grid(batch: int) -> torch.Tensor:
    pairs = torch.tensor(list(itertools.product(SPECIAL_COORDINATES, repeat=2)))
    side = len(SPECIAL_COORDINATES)
    return pairs.reshape(1, side, side, 2).expand(batch, -1, -1, -1).contiguous()


def _special_image(height: int, width: int, *, specials: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(height * 10 + width)
    image = torch.randn(2, 3, height, width, generator=generator)
    if specials:  # NaN and infinities in some pixels of some channels
        image[0, 0, 0, 0] = float("inf")
        image[0, 1, -1, -1] = float("nan")
        image[1, 2, height // 2, width // 2] = float("-inf")
        image[1, 0, 0, -1] = float("nan")
    return image


def _assert_same_classes(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """NaN where PyTorch has NaN, +inf and -inf where it has them, finite elsewhere."""
    for name, test in (
        ("NaN", torch.isnan),
        ("+inf", torch.isposinf),
        ("-inf", torch.isneginf),
    ):
        differs = test(actual) != test(expected)
        assert not differs.any(), f"{what}: {int(differs.sum())} elements differ in being {name}"


def _bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    both_nan = torch.isnan(actual) & torch.isnan(expected)
    same = actual.contiguous().view(torch.int32) == expected.contiguous().view(torch.int32)
    return bool((same | both_nan).all())


# PyTorch's vectorized float32 kernel (AVX2, AVX-512) fuses multiply-adds exactly where etkit's
# kernel does; on other builds only the NaN/inf classes and 1e-5 are promised.
PYTORCH_X86 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_nan_inf_and_huge_grids_and_images_match_pytorch(
    mode: str, padding: str, align_corners: bool
) -> None:
    """Every pair of special coordinates, on 1 x 1, single-row, single-column and small images,
    with and without NaN/inf pixels, contiguous and channels-last: the same NaN/inf/finite
    classes as PyTorch, the same values (bit for bit on x86 PyTorch)."""
    op = GridSampleOp(mode=mode, padding_mode=padding, align_corners=align_corners)  # type: ignore[arg-type]
    grid = _special_grid(2)
    for (height, width), specials, channels_last in itertools.product(
        IMAGE_SIZES, [False, True], [False, True]
    ):
        image = _special_image(height, width, specials=specials)
        if channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        what = f"{op}, image {height} x {width}, specials={specials}, NHWC={channels_last}"
        expected = F.grid_sample(
            image, grid, mode=mode, padding_mode=padding, align_corners=align_corners
        )
        actual = cpu.grid_sample(image, grid, op)
        _assert_same_classes(actual, expected, what)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, equal_nan=True, msg=what)
        if PYTORCH_X86:
            assert _bits_equal(actual, expected), what


def test_every_nan_inf_class_occurs() -> None:
    """The special grids reach every outcome: NaN from a NaN/inf coordinate with zeros padding,
    a finite sample for one with border or reflection padding, and 0 outside the image."""
    image = torch.ones(1, 1, 3, 5)
    grid = torch.tensor([[[[float("nan"), 0.0], [float("inf"), 0.0], [1e10, 0.0], [3e38, 0.0]]]])
    zeros = cpu.grid_sample(image, grid, GridSampleOp("bilinear", "zeros"))
    assert torch.isnan(zeros[0, 0, 0, 0]) and torch.isnan(zeros[0, 0, 0, 1])
    assert zeros[0, 0, 0, 2] == 0  # finite and far outside: no tap, finite weights
    assert torch.isnan(zeros[0, 0, 0, 3])  # 3e38 * 2.5 overflows float32 to inf
    for padding in ("border", "reflection"):
        sampled = cpu.grid_sample(image, grid, GridSampleOp("bilinear", padding))  # type: ignore[arg-type]
        assert torch.equal(sampled, torch.ones_like(sampled)), padding
    nearest = cpu.grid_sample(image, grid, GridSampleOp("nearest", "zeros"))
    assert torch.equal(nearest, torch.zeros_like(nearest))
    inf_pixel = torch.tensor([[[[1.0, float("inf")]]]])
    on_first = torch.tensor([[[[-1.0, 0.0]]]])  # weight 0 on the infinite pixel: 0 * inf
    assert torch.isnan(cpu.grid_sample(inf_pixel, on_first, GridSampleOp(align_corners=True)))


def test_strided_grid_matches_pytorch() -> None:
    """A grid that is a view (x and y planes apart), with special values: the same results."""
    planes = _special_grid(1).permute(0, 3, 1, 2).contiguous()  # N x 2 x Ho x Wo
    grid = planes.permute(0, 2, 3, 1)
    image = _special_image(3, 5, specials=True)[:1]
    for mode, padding, align_corners in COMBINATIONS:
        op = GridSampleOp(mode=mode, padding_mode=padding, align_corners=align_corners)  # type: ignore[arg-type]
        expected = F.grid_sample(
            image, grid, mode=mode, padding_mode=padding, align_corners=align_corners
        )
        actual = cpu.grid_sample(image, grid, op)
        _assert_same_classes(actual, expected, str(op))
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, equal_nan=True)


def test_pytorch_opinfo_samples() -> None:
    """PyTorch's own OpInfo samples of grid_sample (float32, 4-D): bilinear and nearest match,
    bicubic is refused when the op is made."""
    common = pytest.importorskip("torch.testing._internal.common_methods_invocations")
    (info,) = [entry for entry in common.op_db if entry.name == "nn.functional.grid_sample"]
    checked = 0
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=False):
        image, (grid,), kwargs = sample.input, sample.args, sample.kwargs
        if image.dim() != 4:
            continue
        if kwargs["mode"] == "bicubic":
            with pytest.raises(ValueError, match="mode must be one of"):
                GridSampleOp(kwargs["mode"], kwargs["padding_mode"], kwargs["align_corners"])
            continue
        op = GridSampleOp(kwargs["mode"], kwargs["padding_mode"], kwargs["align_corners"])
        expected = F.grid_sample(image, grid, **kwargs)
        actual = cpu.grid_sample(image, grid, op)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, equal_nan=True)
        if PYTORCH_X86:
            assert _bits_equal(actual, expected), kwargs
        checked += 1
    assert checked == 12
