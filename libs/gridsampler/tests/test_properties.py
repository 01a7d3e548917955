"""Property tests: for any shapes, quantization parameters and options inside the contract, the
CPU kernel is within its bound of the reference and the Vulkan kernel gives the same bits; for
any float32 operands, NaN and infinities included, the float kernel gives PyTorch's results."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gridsampler_cases import check_against_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etkit_gridsampler import GridSampleOp, QParams, cpu
from etkit_gridsampler.plan import unsupported_reason


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, GridSampleOp]:
    # 4 channels often: the vectorized CPU kernels take 4-channel channels-last images
    n, c = draw(st.integers(1, 2)), draw(st.just(4) | st.integers(1, 9))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    ho, wo = draw(st.integers(1, 8)), draw(st.integers(1, 40))
    grid_dtype = draw(st.sampled_from([torch.int16, torch.int8]))
    grid_scale = draw(
        st.sampled_from([1 / 32767, 1 / 4096, 1 / 1000, 2**-12])
        if grid_dtype == torch.int16
        else st.sampled_from([1 / 127, 1 / 64, 0.03])
    )
    info = torch.iinfo(grid_dtype)
    grid_q = QParams(grid_scale, draw(st.integers(-8, 8)), info.min, info.max, grid_dtype)
    image_q = QParams(draw(st.floats(1e-3, 1.0)), draw(st.integers(-30, 30)), -128, 127, torch.int8)
    output_q = draw(
        st.none()
        | st.builds(
            QParams,
            st.floats(image_q.scale / 16, image_q.scale * 4),
            st.integers(-30, 30),
            st.just(-128),
            st.just(127),
            st.just(torch.int8),
        )
    )
    op = GridSampleOp(
        draw(st.sampled_from(["bilinear", "nearest"])),
        draw(st.sampled_from(["zeros", "border", "reflection"])),
        draw(st.booleans()),
        image_q,
        grid_q,
        output_q,
    )
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    image = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=generator)
    if draw(st.booleans()):
        image = image.contiguous(memory_format=torch.channels_last)
    grid = torch.randint(
        info.min, info.max + 1, (n, ho, wo, 2), dtype=grid_dtype, generator=generator
    )
    return image, grid, op


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_cpu_within_bound_of_reference_and_vulkan_identical(
    case: tuple[torch.Tensor, torch.Tensor, GridSampleOp],
) -> None:
    image, grid, op = case
    assert unsupported_reason(op, image.shape[2], image.shape[3]) is None
    check_against_reference(image, grid, op)


# Float32 values a grid or an image may hold: ordinary ones and the ones PyTorch treats apart.
_SPECIAL = [float("nan"), float("inf"), float("-inf"), 3e38, -3e38, 1e10, -(2.0**31), 1e7]


@st.composite
def float_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, GridSampleOp]:
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    ho, wo = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    grid = torch.rand(n, ho, wo, 2, generator=generator) * 3 - 1.5
    image = torch.randn(n, c, h, w, generator=generator)
    for tensor, count in ((grid, draw(st.integers(0, 6))), (image, draw(st.integers(0, 3)))):
        flat = tensor.view(-1)
        for _ in range(count):
            index = draw(st.integers(0, flat.numel() - 1))
            flat[index] = draw(st.sampled_from(_SPECIAL))
    if draw(st.booleans()):
        image = image.contiguous(memory_format=torch.channels_last)
    op = GridSampleOp(
        draw(st.sampled_from(["bilinear", "nearest"])),
        draw(st.sampled_from(["zeros", "border", "reflection"])),
        draw(st.booleans()),
    )
    return image, grid, op


@settings(max_examples=80, deadline=None)
@given(float_cases())
def test_float_kernel_has_pytorchs_nan_and_inf(
    case: tuple[torch.Tensor, torch.Tensor, GridSampleOp],
) -> None:
    """Any shapes, NaN/inf/huge values anywhere in the grid and the image: the same NaN, +inf and
    -inf elements as PyTorch, the other values within 1e-5."""
    image, grid, op = case
    expected = F.grid_sample(
        image, grid, mode=op.mode, padding_mode=op.padding_mode, align_corners=op.align_corners
    )
    actual = cpu.grid_sample(image, grid, op)
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(test(actual), test(expected)), f"{test.__name__}: {op}"
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, equal_nan=True)
