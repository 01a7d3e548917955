"""Property tests: for any shapes, quantization parameters and options inside the contract, the
CPU kernel is within its bound of the reference and the Vulkan kernel gives the same bits."""

from __future__ import annotations

import torch
from gridsampler_cases import check_against_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etkit_gridsampler import GridSampleOp, QParams
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
