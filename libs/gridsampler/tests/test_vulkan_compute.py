"""Vulkan compute from Python: a GLSL shader compiled now, dispatched through `vulkan`."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from etkit_gridsampler import vulkan
from etkit_gridsampler._vulkan_compute import compile_glsl, default_device

SHADER = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { int a[]; };
layout(set = 0, binding = 1) readonly buffer B { int b[]; };
layout(set = 0, binding = 2) writeonly buffer Out { int result[]; };
layout(push_constant) uniform Params { int count; int offset; } params;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= uint(params.count)) return;
    result[i] = a[i] * b[i] + params.offset * int(i) + SHIFT;
}
"""


def test_device_is_available_and_described() -> None:
    assert vulkan.is_available()
    info = vulkan.device_info()
    assert info.name and info.api_version.startswith("1.")


def test_shader_compiled_at_test_time_gives_exact_results() -> None:
    spirv = compile_glsl(SHADER, {"SHIFT": 3})
    assert spirv[:4] == struct.pack("<I", 0x07230203)  # the SPIR-V magic number
    rng = np.random.default_rng(0)
    count = 1000  # not a multiple of the workgroup size: the bounds check matters
    a = rng.integers(-30000, 30000, count, dtype=np.int32)
    b = rng.integers(-30000, 30000, count, dtype=np.int32)
    out = np.zeros(count, dtype=np.int32)
    (result,) = default_device().run(
        spirv,
        [a, b, out],
        group_counts=((count + 63) // 64, 1, 1),
        push_constants=struct.pack("<ii", count, -7),
        read_back=[2],
    )
    expected = (a.astype(np.int64) * b - 7 * np.arange(count) + 3).astype(np.int32)
    np.testing.assert_array_equal(result, expected)


def test_compile_error_is_reported() -> None:
    with pytest.raises(RuntimeError, match="GLSL compilation failed"):
        compile_glsl("#version 450\nvoid main() { undefined_name = 1; }\n")


def test_grid_sampler_dispatch_is_described_by_data() -> None:
    """What a scenario needs: bindings with their sizes, the parameter block, the group counts;
    dispatching from that description alone gives the kernel's output."""
    import json

    import torch

    from etkit_gridsampler import GridSampleOp, QParams
    from etkit_gridsampler.vulkan import dispatch, grid_sample, spirv

    op = GridSampleOp(
        "bilinear",
        "border",
        False,
        QParams(1 / 127, 0, -127, 127, torch.int8),
        QParams(1 / 32767, 0, -32767, 32767, torch.int16),
        QParams(1 / 127, 0, -127, 127, torch.int8),
    )
    generator = torch.Generator().manual_seed(5)
    image = torch.randint(-127, 128, (1, 3, 9, 10), dtype=torch.int8, generator=generator)
    grid = torch.randint(-32767, 32768, (1, 6, 7, 2), dtype=torch.int16, generator=generator)
    description = dispatch((1, 3, 9, 10), (1, 6, 7, 2), op)
    json.dumps(description.to_json())  # serializable for a scenario file
    sizes = {name: size for _, _, name, _, size in description.bindings}
    assert sizes == {"image": 270, "grid": 168, "output": 126, "params": 200}
    assert len(description.params_bytes()) == sizes["params"]

    def words(array: np.ndarray) -> np.ndarray:
        raw = np.zeros(-(-max(array.nbytes, 4) // 4) * 4, np.uint8)
        raw[: array.nbytes] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        return raw.view(np.uint32)

    (out,) = default_device().run(
        spirv(),
        [
            words(image.numpy()),
            words(grid.numpy()),
            np.zeros(-(-sizes["output"] // 4), np.uint32),
            words(np.frombuffer(description.params_bytes(), np.uint8)),
        ],
        group_counts=description.group_counts,
        read_back=[2],
    )
    expected = grid_sample(image, grid, op)
    actual = torch.from_numpy(out.view(np.int8)[: sizes["output"]].copy()).reshape(1, 3, 6, 7)
    assert torch.equal(actual, expected)


def test_buffers_and_groups_past_the_device_limits_are_refused_before_allocation() -> None:
    device = default_device()
    spirv = compile_glsl(SHADER, {"SHIFT": 0})
    small = np.zeros(4, np.int32)
    # as large as the limit allows plus one byte, with no memory behind it
    huge = np.broadcast_to(np.zeros(1, np.uint8), (device.max_storage_buffer_bytes + 1,))
    with pytest.raises(ValueError, match=r"buffer 1 has \d+ bytes, more than this Vulkan device's"):
        device.run(spirv, [small, huge, small], group_counts=(1, 1, 1))
    with pytest.raises(TypeError, match=r"buffer 2 must be a numpy\.ndarray, got list"):
        device.run(spirv, [small, small, [0, 0]], group_counts=(1, 1, 1))  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"read_back must list buffer indices below 3, got \[3\]"):
        device.run(spirv, [small, small, small], group_counts=(1, 1, 1), read_back=[3])
    with pytest.raises(TypeError, match=r"source must be the GLSL text \(a str\), got bytes"):
        compile_glsl(SHADER.encode())  # type: ignore[arg-type]
    too_many = device.max_group_counts[1] + 1
    with pytest.raises(ValueError, match=rf"group count {too_many} along y .*WorkGroupCount"):
        device.run(spirv, [small, small, small], group_counts=(1, too_many, 1))


def test_grid_sample_past_the_buffer_limit_names_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from etkit_gridsampler import GridSampleOp, QParams

    op = GridSampleOp(
        "nearest",
        "zeros",
        False,
        QParams(1 / 127, 0, -127, 127, torch.int8),
        QParams(1 / 32767, 0, -32767, 32767, torch.int16),
        None,
    )
    image = torch.zeros(1, 4, 16, 16, dtype=torch.int8)
    grid = torch.zeros(1, 8, 8, 2, dtype=torch.int16)
    monkeypatch.setattr(default_device(), "max_storage_buffer_bytes", 512)
    with pytest.raises(ValueError, match=r"the image buffer needs 1024 bytes, more than .* 512"):
        vulkan.grid_sample(image, grid, op)
    monkeypatch.setattr(default_device(), "max_storage_buffer_bytes", 1000)
    with pytest.raises(ValueError, match=r"the output buffer needs 1024 bytes, more than .* 1000"):
        vulkan.grid_sample(image[:, :, :8, :8], grid, op)  # float32 output: 4 bytes an element
