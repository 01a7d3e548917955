"""The fake-quant exact sampler (``qat``): its forward is the exported program's value bit for bit
(the program's quantize, the C++ kernel, the program's dequantize), its backward is float
``grid_sample``'s gradient at the dequantized operands with the straight-through masks, close to
the float gradient at the float operands and to the exact forward's own finite differences, and a
flow regression through it converges; on CUDA too where a GPU is present."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from gridsampler_cases import COMBINATIONS, GRID_Q, IMAGE_Q, ONE_OF_EACH, SNORM8, SNORM16
from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers quantized_decomposed)

from etkit_gridsampler import GridSampleOp, QParams, cpu, plan, qat
from etkit_gridsampler.plan import UnsupportedOpError

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]
OUTPUTS = [SNORM8, QParams(0.011, -3, -128, 127, torch.int8), None]


def program_quantize(values: torch.Tensor, q: QParams) -> torch.Tensor:
    return torch.ops.quantized_decomposed.quantize_per_tensor(
        values, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
    )


def program_dequantize(values: torch.Tensor, q: QParams) -> torch.Tensor:
    return torch.ops.quantized_decomposed.dequantize_per_tensor(
        values, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
    )


def program(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """What the exported program computes: quantize, the C++ kernel, dequantize."""
    assert op.image is not None and op.grid is not None
    out = cpu.grid_sample(program_quantize(image, op.image), program_quantize(grid, op.grid), op)
    return out if op.output is None else program_dequantize(out, op.output)


def float_operands(
    generator: torch.Generator, op: GridSampleOp, shape: tuple[int, ...] = (2, 3, 9, 13)
) -> tuple[torch.Tensor, torch.Tensor]:
    """A float image over and past its quantization's range and a grid over and past [-1, 1]."""
    assert op.image is not None
    low = (op.image.quant_min - op.image.zero_point) * op.image.scale
    high = (op.image.quant_max - op.image.zero_point) * op.image.scale
    image = low + (high - low) * (torch.rand(shape, generator=generator) * 1.2 - 0.1)
    grid = torch.rand((shape[0], 7, 11, 2), generator=generator) * 2.6 - 1.3
    return image, grid


def test_quantize_and_dequantize_are_the_programs() -> None:
    """``quantize`` / ``dequantize`` give ``quantized_decomposed``'s bits: ties (halves to even),
    values past the range, every quantization of the conformance tests; a value already
    fake-quantized with the same parameters comes back to its integer (every one in range)."""
    generator = torch.Generator().manual_seed(0)
    for q in [*IMAGE_Q, *GRID_Q, QParams(0.05, -128, -128, 127, torch.int8)]:
        info = torch.iinfo(q.dtype)
        steps = torch.arange(info.min - 3, info.max + 4, dtype=torch.float32)
        values = torch.cat((
            (steps - q.zero_point) * q.scale,
            (steps + 0.5 - q.zero_point) * q.scale,  # ties
            torch.randn(5000, generator=generator) * q.scale * info.max,
        ))  # fmt: skip
        assert torch.equal(qat.quantize(values, q), program_quantize(values, q)), q
        integers = torch.arange(info.min, info.max + 1, dtype=torch.int32).to(q.dtype)
        assert torch.equal(qat.dequantize(integers, q), program_dequantize(integers, q)), q
        inside = integers[(integers >= q.quant_min) & (integers <= q.quant_max)]
        assert torch.equal(qat.quantize(qat.dequantize(inside, q), q), inside), q


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_forward_is_the_programs_value(
    device: str, mode: str, padding: str, align_corners: bool
) -> None:
    """Float operands, and operands already fake-quantized upstream, give the program's float
    output bit for bit (6 quantization sets x 3 outputs x 2 layouts per combination), in the
    image's memory format."""
    generator = torch.Generator().manual_seed(len(mode) * 10 + len(padding) + align_corners)
    for (image_q, grid_q, _), output_q in itertools.product(ONE_OF_EACH, OUTPUTS):
        op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
        image, grid = float_operands(generator, op)
        for im in (image, image.contiguous(memory_format=torch.channels_last)):
            expected = program(im, grid, op)
            actual = qat.fake_quant_grid_sample(im.to(device), grid.to(device), op)
            assert actual.dtype == torch.float32 and actual.device.type == device
            assert torch.equal(actual.cpu(), expected), op
            assert actual.stride() == expected.stride()
            upstream = qat.dequantize(qat.quantize(im, image_q), image_q)
            grid_upstream = qat.dequantize(qat.quantize(grid, grid_q), grid_q)
            again = qat.fake_quant_grid_sample(upstream.to(device), grid_upstream.to(device), op)
            assert torch.equal(again.cpu(), expected), op


def straight_through_reference(
    image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients the module docstring promises, computed independently: float
    ``grid_sample``'s at the dequantized operands, zero where a quantization clamped (the output's
    unclamped integer from the kernel's float32 output, which is the exact value times
    ``scale_i * 2^-15``, requantized by the contract's step 5 with the C++ planner's constants)."""
    assert op.image is not None and op.grid is not None
    image_dq = program_dequantize(program_quantize(image, op.image), op.image).requires_grad_()
    grid_dq = program_dequantize(program_quantize(grid, op.grid), op.grid).requires_grad_()
    sampled = F.grid_sample(
        image_dq, grid_dq, mode=op.mode, padding_mode=op.padding_mode,
        align_corners=op.align_corners,
    )  # fmt: skip
    if op.output is not None:
        float_op = GridSampleOp(op.mode, op.padding_mode, op.align_corners, op.image, op.grid)
        sampled_q = cpu.grid_sample(
            program_quantize(image, op.image), program_quantize(grid, op.grid), float_op
        )
        constants = plan.plan(op, image.shape[2], image.shape[3])
        value = torch.round(sampled_q.double() / constants.float_output_scale).long()
        multiplier, shift = constants.values[13], constants.values[14]
        product = value * multiplier
        whole, rest, half = product >> shift, product & ((1 << shift) - 1), 1 << (shift - 1)
        up = (rest > half) | ((rest == half) & (whole % 2 == 1))
        unclamped = whole + up.long() + op.output.zero_point
        weights = weights * (
            (unclamped >= op.output.quant_min) & (unclamped <= op.output.quant_max)
        )
    grad_image, grad_grid = torch.autograd.grad(sampled, (image_dq, grid_dq), weights)

    def inside(values: torch.Tensor, q: QParams) -> torch.Tensor:
        rounded = torch.round(values * (1.0 / q.scale)) + q.zero_point
        return (rounded >= q.quant_min) & (rounded <= q.quant_max)

    return grad_image * inside(image, op.image), grad_grid * inside(grid, op.grid)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_gradients_are_float_grid_samples_with_straight_through_masks(
    device: str, mode: str, padding: str, align_corners: bool
) -> None:
    """Image and grid gradients equal (to float32 rounding of the same computation: bit for bit
    on the CPU) float ``grid_sample``'s at the dequantized operands, with zeros where the image,
    the grid or the int8 output was clamped; operands past their ranges and a narrow output
    range make every mask bite."""
    generator = torch.Generator().manual_seed(7)
    narrow = QParams(SNORM8.scale, 2, -10, 10, torch.int8)
    for (image_q, grid_q, _), output_q in itertools.product(ONE_OF_EACH, [*OUTPUTS, narrow]):
        op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
        image, grid = float_operands(generator, op)
        weights = torch.randn((2, 3, 7, 11), generator=generator)
        image_t = image.to(device).requires_grad_()
        grid_t = grid.to(device).requires_grad_()
        qat.fake_quant_grid_sample(image_t, grid_t, op).backward(weights.to(device))
        expected_image, expected_grid = straight_through_reference(image, grid, op, weights)
        assert image_t.grad is not None and grid_t.grad is not None
        if device == "cpu":
            assert torch.equal(image_t.grad, expected_image), op
            assert torch.equal(grid_t.grad, expected_grid), op
        else:  # CUDA's grid_sample backward accumulates in another order
            torch.testing.assert_close(image_t.grad.cpu(), expected_image, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(grid_t.grad.cpu(), expected_grid, rtol=1e-5, atol=1e-4)
        if output_q is narrow:
            assert (expected_image == 0).any() and (image_t.grad.cpu() == 0).any()
        if mode == "nearest":
            assert not grid_t.grad.any()


def test_gradients_close_to_float_grid_sample_at_the_float_operands() -> None:
    """Inside the quantization ranges (no mask) the straight-through gradients are float
    ``grid_sample``'s at the float operands up to the operands' quantization: relative L2
    error below 1e-3 for the image (grid quantization only moves the taps' weights by about
    2^-16; measured 1.3e-4) and below 2e-2 for the grid (the image's quantization changes
    the differences of taps the grid gradient is made of; measured 4.9e-3)."""
    generator = torch.Generator().manual_seed(11)
    worst_image = worst_grid = 0.0
    for mode, padding, align_corners in COMBINATIONS:
        op = GridSampleOp(mode, padding, align_corners, SNORM8, SNORM16, None)  # type: ignore[arg-type]
        image = torch.rand((2, 3, 9, 13), generator=generator) * 1.8 - 0.9
        grid = torch.rand((2, 7, 11, 2), generator=generator) * 1.9 - 0.95
        weights = torch.randn((2, 3, 7, 11), generator=generator)
        exact = [image.clone().requires_grad_(), grid.clone().requires_grad_()]
        floats = [image.clone().requires_grad_(), grid.clone().requires_grad_()]
        qat.fake_quant_grid_sample(exact[0], exact[1], op).backward(weights)
        F.grid_sample(
            floats[0], floats[1], mode=mode, padding_mode=padding, align_corners=align_corners
        ).backward(weights)
        grads = [(t.grad, f.grad) for t, f in zip(exact, floats, strict=True)]
        assert all(a is not None and b is not None for a, b in grads)
        (ei, fi), (eg, fg) = grads
        assert ei is not None and fi is not None and eg is not None and fg is not None
        worst_image = max(worst_image, ((ei - fi).norm() / fi.norm()).item())
        if mode == "bilinear":
            worst_grid = max(worst_grid, ((eg - fg).norm() / fg.norm()).item())
        else:
            assert not eg.any() and not fg.any()
    assert worst_image < 1e-3 and worst_grid < 2e-2, (worst_image, worst_grid)


def interior_grid(
    shape: tuple[int, int, int], size: tuple[int, int], align_corners: bool, q: QParams,
    fractions: tuple[float, float], generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """Grid values (already on the grid's quantization) whose pixel coordinates lie inside the
    image, at fractions of a pixel in ``fractions``: away from the kinks of bilinear sampling
    (whole pixels) and of the paddings (the edges)."""
    axes = []
    for extent in (size[1], size[0]):  # x: width, y: height
        cell = torch.randint(0, extent - 1, shape, generator=generator).double()
        low, high = fractions
        p = cell + low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)
        axes.append(2 * p / (extent - 1) - 1 if align_corners else (2 * p + 1) / extent - 1)
    grid = torch.stack(axes, -1).float()
    return qat.dequantize(qat.quantize(grid, q), q)


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_gradients_are_the_exact_forwards_derivative(
    mode: str, padding: str, align_corners: bool
) -> None:
    """gradcheck-style, against central differences of the exact forward itself (float32
    output, whose values carry 15 fractional bits):

    - image, along random directions of +-2 steps: the exact forward is linear in the image's
      integers but for the 2^-15-step rounding of each value and the kernel's 15-bit weights,
      so the difference is within 2^-11 image steps per output, times |weight| (measured: at
      most 0.5 % of that bound);
    - grid, per grid point and axis, steps of about 0.05 pixel between whole pixels: within
      2e-3 of the largest gradient (measured: 2.9e-4); nearest: zero both ways, away from
      rounding ties."""
    generator = torch.Generator().manual_seed(13)
    height, width = 9, 13
    fractions = (0.2, 0.8) if mode == "bilinear" else (0.1, 0.35)
    for image_q, grid_q in ((SNORM8, SNORM16), (IMAGE_Q[1], GRID_Q[2]), (SNORM8, GRID_Q[3])):
        op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, None)  # type: ignore[arg-type]
        q_image = torch.randint(-100, 101, (2, 3, height, width), generator=generator)
        image = qat.dequantize(q_image.to(torch.int8), image_q)
        grid = interior_grid((2, 7, 11), (height, width), align_corners, grid_q, fractions,
                             generator)  # fmt: skip
        weights = torch.randn((2, 3, 7, 11), generator=generator, dtype=torch.float64)
        image_t, grid_t = image.clone().requires_grad_(), grid.clone().requires_grad_()
        qat.fake_quant_grid_sample(image_t, grid_t, op).backward(weights.float())
        assert image_t.grad is not None and grid_t.grad is not None

        def forward(im: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            return qat.fake_quant_grid_sample(im, g, op).double()  # noqa: B023

        direction = torch.randint(-2, 3, image.shape, generator=generator) * image_q.scale
        central = (forward(image + direction, grid) - forward(image - direction, grid)) / 2
        finite = (central * weights).sum().item()
        analytic = (image_t.grad.double() * direction).sum().item()
        bound = 2**-11 * image_q.scale * weights.abs().sum().item()
        assert abs(finite - analytic) <= bound, (op, finite, analytic, bound)
        for axis, extent in ((0, width), (1, height)):
            pixels_per_step = grid_q.scale * (extent - 1 if align_corners else extent) / 2
            k = max(1, round(0.05 / pixels_per_step))
            delta = torch.zeros_like(grid)
            delta[..., axis] = k * grid_q.scale
            change = forward(image, grid + delta) - forward(image, grid - delta)
            finite_g = (change * weights).sum(1) / (2 * k * grid_q.scale)
            analytic_g = grid_t.grad[..., axis].double()
            if mode == "nearest":
                assert not finite_g.any() and not analytic_g.any(), op
                continue
            error = (finite_g - analytic_g).abs().max().item()
            assert error <= 2e-3 * analytic_g.abs().max().item(), (op, axis, error)


def test_a_flow_regression_converges() -> None:
    """A smooth flow (a learnable 2 x 4 x 4 field of pixel displacements, upsampled) regressed
    through the exact sampler onto frames the exact sampler warped with a known flow: the loss
    falls a thousandfold (measured 25 000-fold) and the flow comes within 0.05 pixel of the
    known one (measured 0.005)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    size = 32
    noise = torch.randn((2, 3, size + 8, size + 8), generator=generator)
    taps = torch.exp(-(torch.arange(-4.0, 5.0) ** 2) / 8)
    taps = (taps / taps.sum()).view(1, 1, 1, 9).expand(3, 1, 1, 9)
    smooth = F.conv2d(F.conv2d(noise, taps, groups=3), taps.transpose(2, 3), groups=3)
    texture = smooth / smooth.abs().max() * 0.9
    sampler = qat.ExactGridSample(
        image=SNORM8, grid=SNORM16, output=SNORM8, padding_mode="border", align_corners=True
    )
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    identity = torch.stack((xs, ys), -1)
    to_normalized = torch.tensor([2 / (size - 1), 2 / (size - 1)])

    def warp(flow: torch.Tensor) -> torch.Tensor:
        dense = F.interpolate(flow, size=(size, size), mode="bilinear", align_corners=True)
        grid = identity + dense.permute(0, 2, 3, 1) * to_normalized
        result: torch.Tensor = sampler(texture, grid.expand(texture.shape[0], -1, -1, -1))
        return result

    known = (torch.rand((1, 2, 4, 4), generator=generator) * 2 - 1) * 1.5
    with torch.no_grad():
        target = warp(known)
    flow = torch.nn.Parameter(torch.zeros(1, 2, 4, 4))
    optimizer = torch.optim.Adam([flow], lr=0.05)
    losses = []
    for _ in range(150):
        loss = F.mse_loss(warp(flow), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 1000, (losses[0], losses[-1])
    assert (flow - known).abs().max().item() < 0.05


def test_bad_input_gets_one_line_naming_it() -> None:
    image, grid = torch.zeros(1, 3, 4, 4), torch.zeros(1, 2, 2, 2)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
    cases: list[tuple[type[Exception], str, object]] = [
        (ValueError, r"^mode must be 'bilinear' or 'nearest' .* got 'bicubic'; the integer "
         r"kernel has no bicubic$", lambda: qat.ExactGridSample(
             image=SNORM8, grid=SNORM16, output=SNORM8, mode="bicubic")),
        (ValueError, r"^padding_mode must be one of", lambda: qat.ExactGridSample(
            image=SNORM8, grid=SNORM16, output=None, padding_mode="circular")),
        (ValueError, r"^grid must be the grid's QParams", lambda: qat.exact_op(image=SNORM8)),
        (UnsupportedOpError, r"^op: the exact integer sampler cannot mirror .*needs an int8 "
         r"image \(op.image.dtype\), got torch.uint8$", lambda: qat.ExactGridSample(
             image=QParams(0.01, 0, 0, 255, torch.uint8), grid=SNORM16, output=None)),
        (UnsupportedOpError, r"^op: .*image scale / output scale exceeds 32$",
         lambda: qat.ExactGridSample(image=SNORM8, grid=SNORM16,
                                     output=QParams(1e-4, 0, -128, 127, torch.int8))),
        (UnsupportedOpError, r"^op: .* on a 4096 x 4096 image: grid scale too large",
         lambda: qat.fake_quant_grid_sample(
             torch.zeros(1).expand(1, 1, 4096, 4096), grid,
             GridSampleOp(image=SNORM8, grid=QParams(1.0, 0, -32768, 32767, torch.int16)))),
        (UnsupportedOpError, r"^op: the exact integer sampler cannot mirror .*float32 \(None\)",
         lambda: qat.fake_quant_grid_sample(image, grid, GridSampleOp())),
        (ValueError, r"^grid must be N x Ho x Wo x 2 \(4-D\), got shape \(1, 2, 2\)$",
         lambda: qat.fake_quant_grid_sample(image, grid[..., 0], op)),
        (ValueError, r"^grid must be N x Ho x Wo x 2 \(4-D\), got shape \(1, 2, 2, 3\)$",
         lambda: qat.fake_quant_grid_sample(image, torch.zeros(1, 2, 2, 3), op)),
        (ValueError, r"^grid must be a floating-point tensor .* got torch.int16",
         lambda: qat.fake_quant_grid_sample(image, grid.to(torch.int16), op)),
        (ValueError, r"^image and grid must have the same batch size N",
         lambda: qat.fake_quant_grid_sample(image, grid.expand(2, -1, -1, -1), op)),
        (TypeError, r"^grid must be a torch.Tensor", lambda: qat.fake_quant_grid_sample(
            image, [[0.0, 0.0]], op)),  # type: ignore[arg-type]
    ]  # fmt: skip
    for error, pattern, call in cases:
        assert callable(call)
        with pytest.raises(error, match=pattern) as raised:
            call()
        assert "\n" not in str(raised.value)
