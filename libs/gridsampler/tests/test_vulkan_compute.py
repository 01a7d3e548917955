"""Vulkan compute from Python: a GLSL shader compiled now, dispatched through `vulkan`; the grid
sampler's kernel needs 32-bit integers only and gives the CPU kernel's bits on every edge of its
arithmetic."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
import torch

from etkit_gridsampler import GridSampleOp, QParams, cpu, plan, vulkan
from etkit_gridsampler._vulkan_compute import compile_glsl, default_device
from etkit_gridsampler.cpu import is_channels_last

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


# The grid sampler's kernel: 32-bit integers only, and the CPU kernel's bits on every edge of the
# arithmetic that the 32-bit form rewrites (64-bit products and shifts as word pairs, folded
# constants, the requantization's 64-bit path), specialized (as vulkan.grid_sample runs it) and
# not (as a scenario given only the SPIR-V and the parameter block runs it).

OP_CAPABILITY = 17
CAPABILITIES = {1: "Shader", 10: "Float64", 11: "Int64", 22: "Int16", 39: "Int8"}


def spirv_capabilities(spirv: bytes) -> set[int]:
    """The capabilities a SPIR-V module declares (OpCapability instructions)."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    assert words[0] == 0x07230203, "not SPIR-V"
    capabilities, index = set(), 5  # after the header
    while index < len(words):
        count, opcode = words[index] >> 16, words[index] & 0xFFFF
        assert count >= 1, f"malformed instruction at word {index}"
        if opcode == OP_CAPABILITY:
            capabilities.add(words[index + 1])
        index += count
    return capabilities


def test_kernel_needs_no_64_bit_integers() -> None:
    source = vulkan.shader_source()
    for word in ("int64", "uint64", "i64vec", "u64vec", "GL_EXT_shader_explicit_arithmetic_types"):
        assert word.lower() not in source.lower(), f"the kernel's GLSL uses {word}"
    capabilities = spirv_capabilities(vulkan.spirv())
    assert 11 not in capabilities, "the kernel's SPIR-V declares the Int64 capability"
    names = {CAPABILITIES.get(capability, str(capability)) for capability in capabilities}
    assert names == {"Shader"}, f"the kernel needs optional capabilities: {names}"
    # the check sees 64-bit integers where a shader has them
    int64_shader = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { uint64_t values[]; };
void main() { values[0] *= 3ul; }
"""
    assert 11 in spirv_capabilities(compile_glsl(int64_shader))


def _unspecialized(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """The kernel from ``vulkan.spirv()`` and ``KernelDispatch.params_bytes()`` alone, without
    its specialization constants: every switch read from the parameter block."""
    channels_last = is_channels_last(image)
    description = vulkan.dispatch(
        tuple(image.shape), tuple(grid.shape), op, channels_last=channels_last
    )
    memory, _, _ = vulkan._image_memory(image)
    total = int(description.params["total_elements"])
    float_output = op.output is None
    (out,) = default_device().run(
        vulkan.spirv(),
        [
            vulkan._words(memory.numpy()),
            vulkan._words(grid.contiguous().numpy()),
            np.zeros(total if float_output else -(-total // 4), np.uint32),
            vulkan._words(np.frombuffer(description.params_bytes(), np.uint8)),
        ],
        group_counts=description.group_counts,
        read_back=[2],
    )
    flat = torch.from_numpy(out.view(np.float32 if float_output else np.int8)[:total].copy())
    n, c, h, w = image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]
    if channels_last:
        return flat.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return flat.reshape(n, c, h, w)


def check_bits(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> None:
    """The Vulkan kernel, specialized and not, gives the scalar CPU kernel's bits."""
    expected = cpu.grid_sample(image, grid, op, isa="scalar")
    specialized = vulkan.grid_sample(image, grid, op)
    assert torch.equal(specialized, expected), f"Vulkan differs from the CPU kernel: {op}"
    assert torch.equal(_unspecialized(image, grid, op), expected), f"unspecialized differs: {op}"


def edge_grid(shape: tuple[int, int, int], qparams: QParams, seed: int) -> torch.Tensor:
    """Random grid values with the dtype's extremes, the zero point and its neighbours mixed in."""
    info = torch.iinfo(qparams.dtype)
    generator = torch.Generator().manual_seed(seed)
    grid = torch.randint(info.min, info.max + 1, (*shape, 2), generator=generator)
    z = qparams.zero_point
    special = torch.tensor(
        [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max, z - 1, z, z + 1]
    )
    special = special.clamp(info.min, info.max)
    flat = grid.view(-1)
    picks = torch.randint(0, flat.numel(), (flat.numel() // 3,), generator=generator)
    flat[picks] = special[torch.randint(0, special.numel(), picks.shape, generator=generator)]
    return grid.to(qparams.dtype)


COMBINATIONS = list(
    itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True])
)
SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
# every form of step 1: the plan's left shift (shift <= 0, folded into the multiplier), a right
# shift of 1..31 and of 32..62 bits (62: clamped); zero points at the dtype's extremes
GRID_CASES = {
    "snorm16, shift 7": QParams(1 / 32767, 0, -32767, 32767, torch.int16),
    "coarse16, shift 2, zero -32768": QParams(1 / 1024, -32768, -32768, 32767, torch.int16),
    "int16, shift 32, zero 32767": QParams(1e-12, 32767, -32768, 32767, torch.int16),
    "int16, shift 41": QParams(3e-15, 5, -32768, 32767, torch.int16),
    "int16, shift 62": QParams(1e-30, -7, -32768, 32767, torch.int16),
    "int8, left shift 1, zero -128": QParams(1 / 127, -128, -128, 127, torch.int8),
    "int8, left shift 6, zero 127": QParams(0.25, 127, -128, 127, torch.int8),
    "int8, shift 12": QParams(1e-6, 3, -128, 127, torch.int8),
}
# (image, output): requantization ratios from 32 (shift 40) down to below 2^-16 (shift 62),
# multipliers of 2^30 and near 2^31, zero points at the extremes, a narrow output range, float32
IMAGE_OUTPUT_CASES = {
    "snorm8 -> snorm8": (SNORM8, SNORM8),
    "ratio 32, zeros -128/127": (
        QParams(1.0, -128, -128, 127, torch.int8),
        QParams(1 / 32, 127, -128, 127, torch.int8),
    ),
    "ratio 31.99": (
        QParams(1.0, 127, -128, 127, torch.int8),
        QParams(1 / 31.99, -128, -128, 127, torch.int8),
    ),
    "ratio 1e-4, narrow": (
        QParams(1e-3, 5, -128, 127, torch.int8),
        QParams(10.0, -3, -20, 20, torch.int8),
    ),
    "ratio 1e-6, shift 62": (
        QParams(1e-6, 0, -128, 127, torch.int8),
        QParams(1.0, 0, -128, 127, torch.int8),
    ),
    "ratio 0.57, zero -7": (
        QParams(0.02, -7, -128, 127, torch.int8),
        QParams(0.035, 9, -128, 127, torch.int8),
    ),
    "float32 out": (QParams(0.02, -7, -128, 127, torch.int8), None),
    "float32 out, zero 127": (QParams(3e-7, 127, -128, 127, torch.int8), None),
}
# (N, C, H, W, channels-last): the pixel path (channels-last, C = 4 or 8, batch in z) and the word
# path (contiguous; channels-last with C not a multiple of 4), even and odd sizes, one pixel
LAYOUTS = [
    (2, 4, 5, 12, True),
    (1, 8, 6, 5, True),
    (1, 4, 7, 6, False),
    (2, 3, 4, 9, True),
    (1, 1, 1, 1, False),
    (1, 5, 3, 1, False),
]


def _image(layout: tuple[int, int, int, int, bool], seed: int) -> torch.Tensor:
    n, c, h, w, channels_last = layout
    generator = torch.Generator().manual_seed(seed)
    image = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=generator)
    return image.contiguous(memory_format=torch.channels_last) if channels_last else image


@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_every_coordinate_form_matches_the_cpu_kernel(
    mode: str, padding: str, align_corners: bool
) -> None:
    shifts = set()
    for index, grid_q in enumerate(GRID_CASES.values()):
        for turn in range(2):
            layout = LAYOUTS[(index + 3 * turn) % len(LAYOUTS)]
            cases = list(IMAGE_OUTPUT_CASES.values())
            image_q, output_q = cases[(2 * index + turn) % len(cases)]
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            if plan.unsupported_reason(op, layout[2], layout[3]) is not None:
                continue  # a coarse grid on a large axis: outside the contract
            shifts.add(plan.plan(op, layout[2], layout[3]).values[1])
            grid = edge_grid((layout[0], 4, 7), grid_q, index)
            check_bits(_image(layout, index + turn), grid, op)
    assert min(shifts) < 0 and any(1 <= s < 32 for s in shifts) and max(shifts) >= 32, shifts


@pytest.mark.parametrize(
    ("mode", "padding"), [("bilinear", "zeros"), ("bilinear", "reflection"), ("nearest", "border")]
)
@pytest.mark.parametrize("case", list(IMAGE_OUTPUT_CASES), ids=list(IMAGE_OUTPUT_CASES))
def test_every_requantization_matches_the_cpu_kernel(mode: str, padding: str, case: str) -> None:
    image_q, output_q = IMAGE_OUTPUT_CASES[case]
    grid_q = GRID_CASES["snorm16, shift 7"]
    for index, layout in enumerate(LAYOUTS):
        op = GridSampleOp(mode, padding, index % 2 == 0, image_q, grid_q, output_q)  # type: ignore[arg-type]
        check_bits(_image(layout, index), edge_grid((layout[0], 5, 11), grid_q, index), op)


def test_an_axis_of_one_pixel_with_align_corners_ignores_the_grid_scale() -> None:
    """align_corners with one pixel: the multiplier is 0 and the plan's left shift past 64 bits
    (a grid scale of 1e30); every coordinate is 0."""
    grid_q = QParams(1e30, 0, -32768, 32767, torch.int16)
    for mode, padding in itertools.product(
        ["bilinear", "nearest"], ["zeros", "border", "reflection"]
    ):
        op = GridSampleOp(mode, padding, True, SNORM8, grid_q, SNORM8)  # type: ignore[arg-type]
        image = _image((1, 4, 1, 1, True), 0)
        check_bits(image, edge_grid((1, 3, 5), grid_q, 0), op)


def test_large_images_match_the_cpu_kernel() -> None:
    """Axes of about 2^21 and 2^23 pixels: coordinates and tap indices far past 16 bits."""
    generator = torch.Generator().manual_seed(9)
    grid_q = GRID_CASES["snorm16, shift 7"]
    wide = torch.randint(-128, 128, (1, 4, 3, 2**21 + 3), dtype=torch.int8, generator=generator)
    wide = wide.contiguous(memory_format=torch.channels_last)  # 24 MiB, the pixel path
    tall = torch.randint(-128, 128, (1, 1, 2**23 + 12345, 1), dtype=torch.int8, generator=generator)
    for image in (wide, tall):
        for mode, padding, align_corners in COMBINATIONS:
            op = GridSampleOp(mode, padding, align_corners, SNORM8, grid_q, SNORM8)  # type: ignore[arg-type]
            check_bits(image, edge_grid((1, 6, 9), grid_q, 1), op)


# The kernel's own functions on values no image of a test's size reaches: its source, with a test
# entry point in place of its main, on rows of 32-bit words (binding 0); binding 1 holds the row
# count, binding 2 receives the results.


def run_kernel_functions(
    body: str,
    rows: np.ndarray,
    outputs: int,
    specialization: tuple[tuple[int, int], ...] = (),
) -> np.ndarray:
    count, width = rows.shape
    source = vulkan.shader_source().replace("void main() {", "void kernel_main() {")
    source += f"""
void main() {{
  uint row = gl_GlobalInvocationID.x;
  if (row >= grid_words[0]) {{
    return;
  }}
  uint i = row * {width}u, o = row * {outputs}u;
{body}
}}
"""
    (out,) = default_device().run(
        compile_glsl(source),
        [
            np.ascontiguousarray(rows, np.uint32).reshape(-1),
            np.array([count], np.uint32),
            np.zeros(count * outputs, np.uint32),
            np.zeros(64, np.uint32),
        ],
        group_counts=(-(-count // 64), 1, 1),
        read_back=[2],
        specialization=specialization,
    )
    return out.reshape(count, outputs)


def test_division_by_reciprocal_is_exact_below_2_31() -> None:
    """divide(j, magic, shift) with vulkan._reciprocal's constants is floor(j / d) for every
    dividend and divisor below 2^31, at their extremes and around every multiple's edge."""
    rng = np.random.default_rng(0)
    top = 2**31 - 1
    divisors = {1, 2, 3, 4, 5, 7, 12, 540, 960, 1080, 1920, 4095, 4096, 4097, 65535, 65536}
    divisors |= {2**k + e for k in range(17, 31) for e in (-1, 0, 1)} | {top - 1, top}
    divisors |= {int(d) for d in rng.integers(1, top, 40)} | set(range(1, 300))
    rows = []
    for d in sorted(divisors):
        magic, shift = vulkan._reciprocal(d)
        assert magic < 2**32
        last = top // d * d
        dividends = {0, 1, d - 1, d, d + 1, top, top - 1, last, last - 1, 2**30, 2**30 - 1}
        dividends |= {int(j) for j in rng.integers(0, top + 1, 8)}
        for j in sorted(x for x in dividends if 0 <= x <= top):
            # the formula, in Python
            assert ((j * magic) >> (31 + shift)) == j // d, (j, d)
            rows.append((j, magic, shift, j // d))
    table = np.array(rows, np.int64)
    out = run_kernel_functions(
        "  output_words[o] = divide(image_words[i], image_words[i + 1u], image_words[i + 2u]);",
        table[:, :3].astype(np.uint32),
        1,
    )
    np.testing.assert_array_equal(out[:, 0], table[:, 3].astype(np.uint32))


def _wrap(value: int) -> int:
    """``value`` as a C++ int64 holds it (two's complement, modulo 2^64)."""
    value &= 2**64 - 1
    return value - 2**64 if value >= 2**63 else value


def _words_of(value: int) -> tuple[int, int]:
    return value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF


def test_unnormalize_matches_the_plan_on_extreme_multipliers_and_shifts() -> None:
    """Step 1 as csrc/quantized_steps.h computes it in int64 (products and sums wrapping modulo
    2^64), against vulkan._axis_words's folding and the shader's 32-bit words: multipliers up to
    2^63, every shift from a left shift of 40 bits to a right shift of 62, both grid dtypes,
    zero points and grid values at their extremes."""
    rng = np.random.default_rng(1)
    rows, expected = [], []
    multipliers = [
        0,
        1,
        3,
        2**24 - 1,
        2**31,
        2**32 - 1,
        2**32,
        2**33 + 5,
        2**49 - 1,
        2**62,
        2**63 - 1,
    ]
    multipliers += [int(m) for m in rng.integers(0, 2**63, 20, dtype=np.int64)]
    for dtype_min, dtype_max, bias in ((-32768, 32767, 2**15), (-128, 127, 2**7)):
        values = [dtype_min, dtype_min + 1, -1, 0, 1, dtype_max - 1, dtype_max]
        for multiplier in multipliers:
            for shift in (-40, -31, -7, -1, 0, 1, 2, 7, 16, 31, 32, 33, 45, 61, 62):
                zero = int(
                    rng.choice([dtype_min, 0, dtype_max, int(rng.integers(dtype_min, dtype_max))])
                )
                size = int(rng.choice([1, 2, 960, 2**24, 2**31 - 1]))
                offset = (size - 1) << 31
                words = vulkan._axis_words(multiplier, shift, offset, size, zero, bias)
                for q in [*values, int(rng.integers(dtype_min, dtype_max + 1))]:
                    product = _wrap((q - zero) * multiplier)
                    if shift > 0:
                        scaled = _wrap(product + (1 << (shift - 1))) >> shift
                    else:
                        scaled = _wrap(product * (1 << -shift))
                    rows.append((q + bias, *words[:7]))
                    expected.append(_words_of(_wrap(scaled + offset)))
    out = run_kernel_functions(
        """  int hi;
  uint lo;
  unnormalize(image_words[i], image_words[i + 1u], image_words[i + 2u], image_words[i + 3u],
              image_words[i + 4u], image_words[i + 5u], image_words[i + 6u], image_words[i + 7u],
              hi, lo);
  output_words[o] = lo;
  output_words[o + 1u] = uint(hi);""",
        np.array(rows, np.uint64).astype(np.uint32),
        2,
    )
    np.testing.assert_array_equal(out, np.array(expected, np.uint64).astype(np.uint32))


def _apply_padding(coord: int, size: int, padding: int, align_corners: bool) -> int:
    """csrc/quantized_steps.h's apply_padding, with its int64 arithmetic (std::abs of -2^63 and
    2 * span past 2^63 wrapping, % truncating toward zero)."""
    one = 2**32

    def clip(value: int) -> int:
        return min(max(value, 0), (size - 1) * one)

    def reflect(value: int, low: int, span: int) -> int:
        difference = _wrap(value - low)
        magnitude = difference if difference >= 0 or difference == -(2**63) else -difference
        modulus = _wrap(2 * span)
        folded = abs(magnitude) % abs(modulus) * (1 if magnitude >= 0 else -1)
        if folded > span:
            folded = _wrap(2 * span - folded)
        return _wrap(folded + low)

    if padding == 0:
        return coord
    if padding == 1:
        return clip(coord)
    if align_corners:
        return 0 if size == 1 else clip(reflect(coord, 0, (size - 1) * one))
    return clip(reflect(coord, -one // 2, size * one))


@pytest.mark.parametrize(
    ("padding", "align_corners"), [(0, False), (1, False), (2, False), (2, True)]
)
def test_padding_matches_the_plan_on_extreme_coordinates(padding: int, align_corners: bool) -> None:
    """Step 2 on coordinates over the whole 64-bit range (-2^63 included) and axes of 1 to
    2^31 - 1 pixels (2^30 and more: the C++ 2 * span wraps), around every fold's edges."""
    rng = np.random.default_rng(2)
    one = 2**32
    rows, expected = [], []
    for size in (1, 2, 3, 7, 960, 4096, 2**24, 2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1):
        span = (size - 1 if align_corners else size) * one
        low = 0 if align_corners else -one // 2
        coords = {-(2**63), -(2**63) + 1, 2**63 - 1, 0, 1, -1, one, -one, one // 2, -one // 2}
        for k in (1, 2, 3, 5, 2**20 + 1):
            for edge in (k * span + low, -k * span + low, (size - 1) * one):
                coords |= {_wrap(edge + e) for e in (-one // 2, -1, 0, 1, one // 2)}
        coords |= {int(c) for c in rng.integers(-(2**63), 2**63 - 1, 40, dtype=np.int64)}
        coords |= {int(c) for c in rng.integers(-(2**40), 2**40, 40, dtype=np.int64)}
        for coord in sorted(coords):
            rows.append((*_words_of(coord), size))
            expected.append(_words_of(_apply_padding(coord, size, padding, align_corners)))
    out = run_kernel_functions(
        """  uint lo = image_words[i];
  int hi = int(image_words[i + 1u]);
  apply_padding(hi, lo, int(image_words[i + 2u]));
  output_words[o] = lo;
  output_words[o + 1u] = uint(hi);""",
        np.array(rows, np.uint64).astype(np.uint32),
        2,
        specialization=((2, padding), (3, int(align_corners))),
    )
    np.testing.assert_array_equal(out, np.array(expected, np.uint64).astype(np.uint32))
