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
