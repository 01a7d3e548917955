"""The integer contract in torch tensor ops (``torch_kernel``) against the C++ kernel: the same
bits (values and strides) over the conformance configurations, every grid value, random cases
(odd sizes, 1 to 16 channels, batches, grids far outside [-1, 1], extreme quantizations) and the
C++ planner's constants and refusals; on CUDA too where a GPU is present."""

from __future__ import annotations

import itertools
import math
import random
import re

import pytest
import torch
from gridsampler_cases import (
    COMBINATIONS,
    CONFORMANCE_GRID_Q,
    CONFORMANCE_SHAPES,
    GRID_Q,
    IMAGE_Q,
    ONE_OF_EACH,
    OUTPUT_Q,
    SNORM8,
    SNORM16,
    every_grid_value,
    near_image_grid,
    random_grid,
    random_image,
    row_length_cases,
)

from etkit_gridsampler import GridSampleOp, QParams, cpu, plan, torch_kernel
from etkit_gridsampler.plan import UnsupportedOpError

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]


def assert_same_bits(
    image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp, device: str = "cpu"
) -> None:
    """``torch_kernel.grid_sample`` on ``device`` gives the C++ kernel's values and strides, and
    so does the step-by-step ``grid_sample_steps`` (on the CPU)."""
    expected = cpu.grid_sample(image, grid, op)
    actual = torch_kernel.grid_sample(image.to(device), grid.to(device), op)
    assert actual.device.type == device
    actual = actual.cpu()
    assert actual.dtype == expected.dtype, op
    if not torch.equal(actual, expected):
        differ = (actual != expected).sum().item()
        raise AssertionError(f"{differ} of {expected.numel()} values differ: {op}, "
                             f"image {tuple(image.shape)} {image.stride()}")  # fmt: skip
    assert actual.stride() == expected.stride(), op
    if device == "cpu" and grid.shape[1] * grid.shape[2] <= 4096:
        assert torch.equal(torch_kernel.grid_sample_steps(image, grid, op), expected), op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_conformance_configurations(
    device: str, mode: str, padding: str, align_corners: bool
) -> None:
    """test_conformance.py's combinations across shapes: 5 shapes x 3 grid quantizations x 3
    outputs x 2 layouts per mode, padding and align_corners (90 each, 1080 in all), its extreme
    grid values (4 sizes x 2 image quantizations: 8 each, 96 in all) and its identity grid."""
    generator = torch.Generator().manual_seed(COMBINATIONS.index((mode, padding, align_corners)))
    outputs = (SNORM8, QParams(0.011, -3, -128, 127, torch.int8), None)
    for grid_q, (image_shape, (out_h, out_w)) in itertools.product(
        CONFORMANCE_GRID_Q, CONFORMANCE_SHAPES
    ):
        image = random_image(image_shape, generator)
        grid = random_grid((image_shape[0], out_h, out_w), grid_q.dtype, generator)
        for output_q in outputs:
            op = GridSampleOp(mode, padding, align_corners, SNORM8, grid_q, output_q)  # type: ignore[arg-type]
            assert_same_bits(image, grid, op, device)
            channels_last = image.contiguous(memory_format=torch.channels_last)
            assert_same_bits(channels_last, grid, op, device)
    values = torch.tensor([-32768, -32767, -32766, -1, 0, 1, 16383, 16384, 32766, 32767])
    gx, gy = torch.meshgrid(values, values, indexing="ij")
    extreme = torch.stack((gx, gy), -1).unsqueeze(0).to(torch.int16)
    for size in ((1, 4, 1, 1), (1, 4, 2, 3), (1, 4, 8, 8), (1, 2, 5, 16)):
        image = random_image(size, torch.Generator().manual_seed(1))
        for image_q in (SNORM8, QParams(0.02, 5, -128, 127, torch.int8)):
            op = GridSampleOp(mode, padding, align_corners, image_q, SNORM16, SNORM8)  # type: ignore[arg-type]
            assert_same_bits(image, extreme, op, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_every_grid_value(device: str, mode: str, padding: str, align_corners: bool) -> None:
    """Every int16 (and int8) grid value along both axes, with the six quantization sets that
    reach each of the kernels' forms between them (a grid far outside [-1, 1], a grid zero
    point, an int8 grid, a scale at which step 1's rounding decides the tap, zero point -128,
    each requantization form, float output), on a 2 x 2 and a 9 x 13 image, 4 channels in both
    layouts: 6 x 2 x 2 = 24 configurations of 65536 (int8 grids: 256) samples each."""
    for height, width in ((2, 2), (9, 13)):
        generator = torch.Generator().manual_seed(height * 100 + width)
        image = random_image((1, 4, height, width), generator)
        for (image_q, grid_q, output_q), layout in itertools.product(
            ONE_OF_EACH, (torch.contiguous_format, torch.channels_last)
        ):
            grid = every_grid_value(grid_q.dtype, 1)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            assert_same_bits(image.contiguous(memory_format=layout), grid, op, device)


def test_quantization_product_and_row_lengths() -> None:
    """Every image x grid x output quantization of the vectorized kernels' tests (2 x 5 x 5 = 50)
    over near-image grids in all 12 combinations (600 configurations), and the output rows of
    every length around the vector steps with a grid that is not contiguous (12 x 2 x 2)."""
    generator = torch.Generator().manual_seed(21)
    image = random_image((2, 3, 11, 7), generator)
    for index, ((mode, padding, align_corners), (image_q, grid_q, output_q)) in enumerate(
        itertools.product(COMBINATIONS, itertools.product(IMAGE_Q, GRID_Q, OUTPUT_Q))
    ):
        grid = near_image_grid((2, 9, 10), 0.8, generator, grid_q.dtype)
        op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
        layout = torch.channels_last if index % 2 else torch.contiguous_format
        assert_same_bits(image.contiguous(memory_format=layout), grid, op)
    for _width, image, grid, strided in row_length_cases(generator):
        for padding, g in itertools.product(("zeros", "border"), (grid, strided)):
            op = GridSampleOp("bilinear", padding, False, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
            assert_same_bits(image, g, op)


def test_large_sizes_and_many_channels() -> None:
    """A 4096-pixel axis each way (as test_conformance.py), 64 channels."""
    generator = torch.Generator().manual_seed(3)
    op = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)
    wide = random_image((1, 64, 3, 5), generator)
    assert_same_bits(wide, random_grid((1, 4, 6), torch.int16, generator), op)
    tall = random_image((1, 1, 4096, 2), generator)
    assert_same_bits(tall, random_grid((1, 4096, 1), torch.int16, generator), op)
    long = random_image((1, 2, 1, 4096), generator)
    for mode, padding in itertools.product(("bilinear", "nearest"), ("zeros", "reflection")):
        op = GridSampleOp(mode, padding, True, SNORM8, GRID_Q[1], None)  # type: ignore[arg-type]
        assert_same_bits(long, random_grid((1, 1, 4096), torch.int16, generator), op)


# ---- random cases ----

EXTREME_IMAGE_Q = [
    QParams(1e-4, -128, -128, 127, torch.int8),
    QParams(10.0, 127, -128, 127, torch.int8),
    QParams(0.02, 0, -10, 10, torch.int8),
]


def random_op(rng: random.Random) -> GridSampleOp:
    """An op with random quantizations, often extreme: image scales from 1e-4 to 10 and zero
    points anywhere, grid scales from 2^-30 to coordinates hundreds of images out with large
    zero points, output ratios from 1/1000 to exactly 32 and narrow output ranges."""
    mode, padding, align_corners = rng.choice(COMBINATIONS)
    if rng.random() < 0.2:
        image_q = rng.choice(EXTREME_IMAGE_Q)
    else:
        low = rng.choice((-128, -127, -100))
        high = rng.choice((127, 100))
        image_q = QParams(10 ** rng.uniform(-4, 1), rng.randint(low, high), low, high, torch.int8)
    if rng.random() < 0.7:
        info = torch.iinfo(torch.int16)
        scale = 2.0 ** rng.uniform(-30, -6) if rng.random() < 0.3 else 10 ** rng.uniform(-5, -2)
        zero = rng.choice((0, 0, rng.randint(-2000, 2000), info.min, info.max))
        grid_q = QParams(scale, zero, info.min, info.max, torch.int16)
    else:
        info = torch.iinfo(torch.int8)
        zero = rng.choice((0, rng.randint(-30, 30), info.min, info.max))
        grid_q = QParams(10 ** rng.uniform(-3, 0.5), zero, info.min, info.max, torch.int8)
    output_q: QParams | None = None
    if rng.random() < 0.75:
        ratio = rng.choice((1.0, 2.0, 3.0, 32.0, 1 / 1000, 10 ** rng.uniform(-3, 1.5)))
        low, high = rng.choice(((-128, 127), (-127, 127), (-10, 10), (0, 127)))
        output_q = QParams(image_q.scale / ratio, rng.randint(low, high), low, high, torch.int8)
    return GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]


def random_case(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, GridSampleOp]:
    op = random_op(rng)
    n = rng.choice((1, 2))
    channels = rng.choice((1, 3, 4, 16, 2, 5))
    height = rng.choice((1, 2, rng.randint(1, 41)))
    width = rng.choice((1, 3, rng.randint(1, 41)))
    out_h, out_w = rng.randint(1, 17), rng.randint(1, 23)
    generator = torch.Generator().manual_seed(rng.randint(0, 2**31))
    image = random_image((n, channels, height, width), generator)
    if rng.random() < 0.5:
        image = image.contiguous(memory_format=torch.channels_last)
    assert op.grid is not None
    if rng.random() < 0.5:
        grid = random_grid((n, out_h, out_w), op.grid.dtype, generator)
    else:
        grid = near_image_grid((n, out_h, out_w), rng.uniform(0.1, 3), generator, op.grid.dtype)
    if rng.random() < 0.3:
        grid = grid.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, other strides
    return image, grid, op


RANDOM_CASES = 500


@pytest.mark.parametrize("device", DEVICES)
def test_random_cases(device: str) -> None:
    """500 random cases: the same bits where the contract holds; where it does not, the same
    refusal as the C++ planner's."""
    rng = random.Random(37)
    compared = refused = 0
    for _ in range(RANDOM_CASES):
        image, grid, op = random_case(rng)
        reason = plan.unsupported_reason(op, image.shape[2], image.shape[3])
        if reason is None:
            assert_same_bits(image, grid, op, device)
            compared += 1
        else:
            with pytest.raises(UnsupportedOpError, match=re.escape(reason)):
                torch_kernel.grid_sample(image.to(device), grid.to(device), op)
            refused += 1
    assert compared >= 400, (compared, refused)


@pytest.mark.parametrize("device", DEVICES)
def test_extreme_quantizations(device: str) -> None:
    """Limits of the contract: the largest grid scale the 2^24 coordinate bound allows (and one
    past it, refused), a ratio of exactly 32 (and past it, refused), a ratio of 1/1000 (step 5
    in 64-bit lanes), grid zero points at the dtype's ends, a one-pixel image."""
    generator = torch.Generator().manual_seed(8)
    image = random_image((2, 3, 5, 7), generator)
    # both ends of int16, the middle and random values, x and y in unrelated orders
    values = torch.cat((
        torch.arange(-32768, -32512), torch.arange(-300, 300), torch.arange(32512, 32768),
        torch.randint(-32768, 32768, (600,), generator=generator),
    ))  # fmt: skip
    grid = torch.stack(
        [torch.stack((values, values[torch.randperm(1712, generator=generator)]), -1)
         for _ in range(2)]
    ).view(2, 8, 214, 2).to(torch.int16)  # fmt: skip
    image_q = QParams(0.05, -128, -128, 127, torch.int8)
    # |p| < 2^24 with d up to 32768: scale * 7 / 2 * 32768 + 7 / 2 < 2^24
    largest = (2**24 - 16) * 2 / 7 / 32768
    for scale, zero in ((largest, 0), (1e-7, -32768), (3e-3, 32767), (2.0**-30, 5)):
        grid_q = QParams(scale, zero, -32768, 32767, torch.int16)
        for mode, padding, align_corners in COMBINATIONS:
            for output_q in (QParams(0.05 / 32, 127, -128, 127, torch.int8),
                             QParams(50.0, -7, -10, 10, torch.int8), None):  # fmt: skip
                op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
                assert_same_bits(image, grid, op, device)
                assert_same_bits(image[:, :, :1, :1], grid, op, device)
    too_coarse = QParams(largest * 1.01, 0, -32768, 32767, torch.int16)
    op = GridSampleOp("bilinear", "zeros", False, image_q, too_coarse, None)
    with pytest.raises(UnsupportedOpError, match="exceed 2\\^24"):
        torch_kernel.grid_sample(image.to(device), grid.to(device), op)
    past_32 = QParams(0.05 / 32.01, 0, -128, 127, torch.int8)
    op = GridSampleOp("bilinear", "zeros", False, image_q, SNORM16, past_32)
    with pytest.raises(UnsupportedOpError, match="exceeds 32"):
        torch_kernel.grid_sample(image.to(device), grid.to(device), op)


def test_plan_constants_are_the_cpp_planners() -> None:
    """``integer_plan`` derives every constant as the C++ ``plan_quantized`` does (the 16
    values and the float output scale), and refuses what it refuses, with its reason, over 2000
    random ops and sizes up to 2^23 pixels."""
    rng = random.Random(5)
    agreed = refused = 0
    for _ in range(2000):
        op = random_op(rng)
        height = rng.choice((1, 2, rng.randint(1, 5000), 4096, 2 ** rng.randint(10, 23)))
        width = rng.choice((1, 3, rng.randint(1, 5000), 2 ** rng.randint(10, 23) + 1))
        try:
            expected = plan.plan(op, height, width)
        except UnsupportedOpError as error:
            with pytest.raises(UnsupportedOpError) as raised:
                torch_kernel.integer_plan(op, height, width)
            assert str(raised.value) == str(error), op
            refused += 1
            continue
        actual = torch_kernel.integer_plan(op, height, width)
        assert actual.values == expected.values, (op, height, width)
        assert actual.float_output_scale == expected.float_output_scale, op
        agreed += 1
    assert agreed > 1000 and refused > 50, (agreed, refused)


def test_requantization_forms_are_exact_at_ties() -> None:
    """Step 5's 32-bit and 64-bit forms against the contract's int64 formula on every value of a
    bilinear sample (|value| < 2^23, ties included) for ratios of each form."""
    values = torch.arange(-(2**23) + 1, 2**23, 9973, dtype=torch.int64)
    values = torch.cat((values, torch.arange(-(2**15), 2**15, dtype=torch.int64)))
    for image_q, ratio, zero in itertools.product(
        (SNORM8, IMAGE_Q[1], QParams(0.05, -128, -128, 127, torch.int8)),
        (1.0, 2.0, 3.0, 0.5, 32.0, 1 / 1000, math.pi),
        (0, -4, 1, 127),
    ):
        output_q = QParams(image_q.scale / ratio, zero, -128, 127, torch.int8)
        op = GridSampleOp("bilinear", "zeros", False, image_q, SNORM16, output_q)
        p = torch_kernel.integer_plan(op, 2, 2)
        raw = (values + image_q.zero_point * 2**15).to(torch.int32)
        actual, mask = torch_kernel._requantize_raw(raw, p, True)
        q = (
            torch_kernel._shift_round_half_even(values * p.requant_multiplier, p.requant_shift)
            + p.output_zero_point
        )
        assert torch.equal(actual, q.clamp(-128, 127).to(torch.int8)), (ratio, zero)
        assert mask is not None and torch.equal(mask, (q >= -128) & (q <= 127))


def test_the_grid_checks_name_the_argument() -> None:
    image = random_image((1, 4, 3, 3), torch.Generator().manual_seed(0))
    grid = torch.zeros(1, 2, 2, 2, dtype=torch.int16)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
    with pytest.raises(
        ValueError, match=r"^grid must be torch.int16 \(op.grid.dtype\), got torch.int8"
    ):
        torch_kernel.grid_sample(image, grid.to(torch.int8), op)
    with pytest.raises(
        ValueError, match=r"^grid must be N x Ho x Wo x 2 \(4-D\), got shape \(1, 2, 2, 3\)"
    ):
        torch_kernel.grid_sample(image, torch.zeros(1, 2, 2, 3, dtype=torch.int16), op)
    with pytest.raises(
        ValueError, match=r"^image must be torch.int8 \(op.image.dtype\), got torch.float32"
    ):
        torch_kernel.grid_sample(image.float(), grid, op)
    with pytest.raises(ValueError, match="the same batch size N"):
        torch_kernel.grid_sample(image, grid.expand(2, -1, -1, -1), op)
    with pytest.raises(
        UnsupportedOpError, match=r"^op: the exact integer sampler cannot mirror .*float32"
    ):
        torch_kernel.grid_sample(image, grid, GridSampleOp())
    with pytest.raises(TypeError, match=r"^op must be an etkit_gridsampler\.GridSampleOp"):
        torch_kernel.grid_sample(image, grid, "bilinear")  # type: ignore[arg-type]
