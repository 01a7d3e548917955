"""The grid sampler's Vulkan compute kernel (shaders/grid_sample.comp), dispatched through the
``vulkan`` bindings on any Vulkan device with a compute queue (lavapipe here).

It implements the integer contract of docs/contract.md bit for bit as the CPU kernel does, in
32-bit integer arithmetic only: it needs no 64-bit shader integers (``shaderInt64``), which many
mobile GPUs lack. The SPIR-V is compiled from the GLSL on first use (never stored as a binary).
``dispatch`` describes its bindings, parameter block and dispatch size as data, for running it
from a scenario.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import torch

from etkit_gridsampler._vulkan_compute import (
    DeviceInfo,
    VulkanUnavailableError,
    compile_glsl,
    default_device,
    find_glsl_compiler,
)
from etkit_gridsampler.cpu import check_dtypes, check_op, is_channels_last
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp
from etkit_gridsampler.plan import UnsupportedOpError, plan

__all__ = [
    "DeviceInfo",
    "KernelDispatch",
    "VulkanUnavailableError",
    "compile_glsl",
    "device_info",
    "dispatch",
    "find_glsl_compiler",
    "grid_sample",
    "is_available",
    "shader_source",
    "spirv",
]

WORKGROUP_SIZE = 64
MAX_GROUPS_X = 65535
# The shader indexes the image, the grid and the output with 32-bit signed integers, and the
# parameter block holds their sizes and strides as such: none may have more elements than this.
MAX_ELEMENTS = 2**31 - 1
# The parameter block (binding 3, std430): 32-bit words only, in this order. The plan's 64-bit
# values travel as (lo, hi) word pairs; ``dispatch`` derives the per-axis constants of step 1
# from the plan (see ``_axis_words``) and the reciprocals of the output's sizes (``_reciprocal``).
PARAMS_FIELDS = (
    "x_multiplier_lo", "x_multiplier_hi", "x_addend_lo", "x_addend_hi",
    "x_shift", "x_offset_lo", "x_offset_hi", "x_size",
    "y_multiplier_lo", "y_multiplier_hi", "y_addend_lo", "y_addend_hi",
    "y_shift", "y_offset_lo", "y_offset_hi", "y_size",
    "image_zero_point", "image_zero_word", "output_zero_point", "output_min", "output_max",
    "requant_multiplier", "requant_shift_high", "float_output", "float_output_scale",
    "batch", "channels", "height", "width",
    "out_height", "out_width", "output_channels_last", "grid_is_int8",
    "image_stride_n", "image_stride_c", "image_stride_y", "image_stride_x",
    "mode", "padding", "align_corners",
    "pixel_path", "invocations", "invocations_per_row", "total_elements",
    "out_width_magic", "out_height_magic", "channels_magic",
    "out_width_shift", "out_height_shift", "channels_shift",
)  # fmt: skip
PARAMS_FORMAT = "<" + "IIIIIIIi" * 2 + "iIiiiiiif" + "i" * 19 + "IIIIII"
# The shader's specialization constants, by constant id: each defaults to -1 (read the switch
# from the parameter block), so the SPIR-V runs any configuration unspecialized; ``dispatch``
# gives the values of its configuration (the same as the parameter block's), with which a
# pipeline compiles only that configuration (much faster where a driver runs both sides of a
# branch, as lavapipe does).
SPECIALIZATION_CONSTANTS = (
    "pixel_path", "mode", "padding", "align_corners", "float_output", "grid_is_int8",
    "coord_shift", "requant_shift_high", "channel_quads",
)  # fmt: skip
_WORD = 2**32
_QWORD = 2**64


def _reciprocal(divisor: int) -> tuple[int, int]:
    """(magic, shift) for the shader's ``divide``: ``floor(j / divisor) = floor(j * magic /
    2^(31 + shift))`` for every ``j < 2^31``, with ``shift = ceil(log2(divisor))`` and ``magic =
    ceil(2^(31 + shift) / divisor) < 2^32`` (Granlund and Montgomery): ``j * (magic * divisor -
    2^(31 + shift)) < 2^31 * divisor <= 2^(31 + shift)``, so the product moves ``j / divisor``
    by less than ``1 / divisor``, never across an integer."""
    if not 1 <= divisor < 2**31:
        raise ValueError(f"divisor must be in [1, 2^31), got {divisor}")
    shift = (divisor - 1).bit_length()
    magic = -(-(1 << (31 + shift)) // divisor)
    return magic, shift


def _axis_words(
    multiplier: int, shift: int, offset: int, size: int, grid_zero_point: int, grid_bias: int
) -> tuple[int, ...]:
    """Step 1 of one axis as the shader computes it: ``P = ((u * m + a) >> s) + offset`` modulo
    2^64 with ``u = q + grid_bias`` (unsigned: ``grid_bias`` is 2^15 for int16 grids, 2^7 for
    int8). The plan's ``shift_round((q - zero) * multiplier, shift) + offset`` gives the same 64
    bits: ``(q - zero) * multiplier + 2^(shift - 1) = u * m + a`` modulo 2^64 with ``m =
    multiplier``, ``a = 2^(shift - 1) - (grid_bias + zero) * m``; a left shift (``shift <= 0``:
    ``product * 2^-shift``) is folded into ``m = multiplier * 2^-shift`` with ``s = 0``. Returns
    the (lo, hi) words of m and a, s, the (lo, hi) words of the offset, the size."""
    if shift > 0:
        m, s, rounding = multiplier % _QWORD, shift, 1 << (shift - 1)
    else:
        m, s, rounding = (multiplier << -shift) % _QWORD, 0, 0
    addend = (rounding - (grid_bias + grid_zero_point) * m) % _QWORD
    offset %= _QWORD
    return (
        m % _WORD, m // _WORD, addend % _WORD, addend // _WORD,
        s, offset % _WORD, offset // _WORD, size,
    )  # fmt: skip


def shader_source() -> str:
    """The GLSL source of the kernel."""
    return resources.files("etkit_gridsampler").joinpath("shaders/grid_sample.comp").read_text()


@cache
def spirv() -> bytes:
    """The kernel compiled to SPIR-V (once per process)."""
    return compile_glsl(shader_source())


def is_available() -> bool:
    """True when a Vulkan device with a compute queue can be used (the kernel needs no optional
    feature: 32-bit integers only)."""
    try:
        default_device()
    except VulkanUnavailableError:
        return False
    return True


def device_info() -> DeviceInfo:
    """Name, API version and driver of the Vulkan device the kernel runs on. Raises
    ``VulkanUnavailableError`` when there is none."""
    return default_device().info()


@dataclass(frozen=True)
class KernelDispatch:
    """How to run the kernel: what a scenario needs to dispatch it.

    ``bindings``: (set, binding, name, element type, byte size) of each storage buffer;
    ``params``: the parameter block's field values (binding 3: 32-bit words, ``PARAMS_FIELDS``
    packed with ``PARAMS_FORMAT``; ``params_bytes()`` packs them);
    ``group_counts``: workgroups in x, y, z (``WORKGROUP_SIZE`` invocations each); the shader
    reads the invocation index as ``y * invocations_per_row + x`` and skips those past
    ``invocations``: with ``pixel_path`` (channels-last, C a multiple of 4) the pixels of one
    image, z being the batch index; otherwise the output's 32-bit words, z = 1;
    ``specialization_constants``: (constant id, name, value) of the shader's specialization
    constants for this configuration (``SPECIALIZATION_CONSTANTS``); optional (the SPIR-V runs
    unspecialized too, with the same results), a pipeline specialized with them is faster."""

    bindings: tuple[tuple[int, int, str, str, int], ...]
    params: dict[str, int | float]
    params_format: str
    workgroup_size: tuple[int, int, int]
    group_counts: tuple[int, int, int]
    shader: str = "etkit_gridsampler/shaders/grid_sample.comp"
    specialization_constants: tuple[tuple[int, str, int], ...] = ()

    def params_bytes(self) -> bytes:
        """The parameter block, as the shader reads it."""
        return struct.pack(self.params_format, *(self.params[name] for name in PARAMS_FIELDS))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return asdict(self)


def _image_memory(image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], bool]:
    """The image's bytes in memory order, its strides (elements) and whether it is NHWC."""
    if is_channels_last(image):
        return image.permute(0, 2, 3, 1).reshape(-1), tuple(image.stride()), True
    contiguous = image.contiguous()
    return contiguous.reshape(-1), tuple(contiguous.stride()), False


def _shape(value: object, name: str, layout: str) -> tuple[int, int, int, int]:
    """``value`` as four sizes of at least 1, or ``TypeError``/``ValueError`` naming ``name``."""
    message = f"{name} must be a sequence of 4 ints ({layout}), got {value!r}"
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 4:
        raise TypeError(message)
    sizes: list[int] = []
    for size in value:
        if isinstance(size, bool):
            raise TypeError(message)
        try:
            sizes.append(operator.index(size))
        except TypeError:
            raise TypeError(message) from None
    if min(sizes) < 1:
        raise ValueError(f"{name} must have every size at least 1 ({layout}), got {tuple(sizes)}")
    return sizes[0], sizes[1], sizes[2], sizes[3]


def _check_limits(
    image_shape: tuple[int, int, int, int], grid_shape: tuple[int, int, int, int]
) -> None:
    batch, channels, height, width = image_shape
    _, out_height, out_width, _ = grid_shape
    counts = (
        ("image", "N x C x H x W", batch * channels * height * width, image_shape),
        ("grid", "N x Ho x Wo x 2", batch * out_height * out_width * 2, grid_shape),
        ("output", "N x C x Ho x Wo", batch * channels * out_height * out_width, None),
    )
    for name, layout, count, shape in counts:
        if count > MAX_ELEMENTS:
            of = f" {shape}" if shape is not None else ""
            raise ValueError(
                f"the {name}{of} has {layout} = {count} elements, more than the Vulkan kernel's "
                f"limit of 2^31 - 1 = {MAX_ELEMENTS} (it indexes with 32-bit signed integers); "
                "split the batch or tile the image and grid into smaller calls, or use "
                "etkit_gridsampler.cpu"
            )


def dispatch(
    image_shape: Sequence[int],
    grid_shape: Sequence[int],
    op: GridSampleOp,
    *,
    channels_last: bool = False,
) -> KernelDispatch:
    """The dispatch of ``op`` on an image of ``image_shape`` (NCHW sizes; ``channels_last``: NHWC
    in memory, and so is the output) and a contiguous grid of ``grid_shape`` (N x Ho x Wo x 2).
    Raises ``TypeError``/``ValueError`` naming the argument for shapes that do not fit (the
    same N, a last grid size of 2, every size at least 1, at most 2^31 - 1 elements in the
    image, the grid and the output), ``UnsupportedOpError`` for a configuration outside the
    integer contract."""
    check_op(op)
    if op.is_float or op.image is None or op.grid is None:
        raise UnsupportedOpError(
            "the Vulkan kernel implements the integer contract (int8 image, int16/int8 grid); "
            "use etkit_gridsampler.cpu for float32"
        )
    image_sizes = _shape(image_shape, "image_shape", "N x C x H x W")
    grid_sizes = _shape(grid_shape, "grid_shape", "N x Ho x Wo x 2")
    if grid_sizes[3] != 2:
        raise ValueError(f"grid_shape must be N x Ho x Wo x 2 ((x, y) last), got {grid_sizes}")
    if grid_sizes[0] != image_sizes[0]:
        raise ValueError(
            f"image_shape and grid_shape must have the same batch size N, got image N = "
            f"{image_sizes[0]} ({image_sizes}) and grid N = {grid_sizes[0]} ({grid_sizes})"
        )
    _check_limits(image_sizes, grid_sizes)
    batch, channels, height, width = image_sizes
    _, out_height, out_width, _ = grid_sizes
    constants = plan(op, height, width)
    (x_multiplier, x_shift, x_offset, x_size, y_multiplier, y_shift, y_offset, y_size,
     grid_zero_point, image_zero_point, output_zero_point, output_min, output_max,
     requant_multiplier, requant_shift, _) = constants.values  # fmt: skip
    total = batch * channels * out_height * out_width
    float_output = op.output is None
    if float_output:
        requant_multiplier, requant_shift = 0, 33
    elif not 33 <= requant_shift <= 62:  # the plan's ratio <= 32 keeps it in 39 .. 62
        raise UnsupportedOpError(
            f"the Vulkan kernel requantizes with a shift of 33 to 62 bits, got {requant_shift}"
        )
    words = total if float_output else math.ceil(total / 4)
    # RGBA-like channels-last layouts: one invocation per output pixel, all its channels; the
    # batch index is the workgroup's z (at most 65535, Vulkan's least maxComputeWorkGroupCount)
    pixel_path = channels_last and channels % 4 == 0 and batch <= MAX_GROUPS_X
    invocations = out_height * out_width if pixel_path else words
    groups = math.ceil(invocations / WORKGROUP_SIZE)
    groups_x = min(groups, MAX_GROUPS_X)
    groups_y = math.ceil(groups / groups_x)
    if channels_last:
        strides = (height * width * channels, 1, width * channels, channels)
    else:
        strides = (channels * height * width, height * width, width, 1)
    grid_bytes = 1 if op.grid.dtype == torch.int8 else 2
    grid_bias = 2 ** (8 * grid_bytes - 1)
    width_magic, width_shift = _reciprocal(out_width)
    height_magic, height_shift = _reciprocal(out_height)
    channels_magic, channels_shift = _reciprocal(channels)
    values: list[int | float] = [
        *_axis_words(x_multiplier, x_shift, x_offset, x_size, grid_zero_point, grid_bias),
        *_axis_words(y_multiplier, y_shift, y_offset, y_size, grid_zero_point, grid_bias),
        image_zero_point, (image_zero_point & 0xFF) * 0x01010101,
        output_zero_point, output_min, output_max,
        requant_multiplier, requant_shift - 32, int(float_output), constants.float_output_scale,
        batch, channels, height, width,
        out_height, out_width, int(channels_last), int(grid_bytes == 1),
        *strides,
        MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        int(pixel_path), invocations, groups_x * WORKGROUP_SIZE, total,
        width_magic, height_magic, channels_magic,
        width_shift, height_shift, channels_shift,
    ]  # fmt: skip
    x_words, y_words = values[:8], values[8:16]
    specialization = {
        "pixel_path": int(pixel_path),
        "mode": MODE_CODES[op.mode],
        "padding": PADDING_CODES[op.padding_mode],
        "align_corners": int(op.align_corners),
        "float_output": int(float_output),
        "grid_is_int8": int(grid_bytes == 1),
        "coord_shift": int(x_words[4]) if x_words[4] == y_words[4] else -1,
        "requant_shift_high": requant_shift - 32,
        "channel_quads": channels // 4 if pixel_path else -1,
    }
    return KernelDispatch(
        bindings=(
            (0, 0, "image", "int8", batch * channels * height * width),
            (0, 1, "grid", f"int{8 * grid_bytes}", batch * out_height * out_width * 2 * grid_bytes),
            (0, 2, "output", "float32" if float_output else "int8", total * (1 + 3 * float_output)),
            (0, 3, "params", "struct", struct.calcsize(PARAMS_FORMAT)),
        ),
        params=dict(zip(PARAMS_FIELDS, values, strict=True)),
        params_format=PARAMS_FORMAT,
        workgroup_size=(WORKGROUP_SIZE, 1, 1),
        group_counts=(groups_x, groups_y, batch if pixel_path else 1),
        specialization_constants=tuple(
            (constant_id, name, specialization[name])
            for constant_id, name in enumerate(SPECIALIZATION_CONSTANTS)
        ),
    )  # fmt: skip


def _words(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    padded = np.zeros(math.ceil(max(raw.size, 4) / 4) * 4, dtype=np.uint8)
    padded[: raw.size] = raw
    return padded.view(np.uint32)


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """The integer grid sampler on the Vulkan device: the contract and the outputs of
    ``cpu.grid_sample``, bit for bit. Checks its operands first, as ``cpu.grid_sample`` does
    (``cpu.check_inputs``: ``TypeError``, ``ValueError``), and the Vulkan kernel's size limits
    (``dispatch``). Raises ``VulkanUnavailableError`` without a usable device,
    ``UnsupportedOpError`` for a float op or a configuration outside the contract."""
    check_op(op)
    if op.is_float:
        raise UnsupportedOpError(
            "the Vulkan kernel implements the integer contract; use etkit_gridsampler.cpu for "
            "float32"
        )
    output_dtype = check_dtypes(image, grid, op)
    # Sizes before any copy: the dispatch refuses what the kernel cannot index.
    channels_last = is_channels_last(image)
    description = dispatch(tuple(image.shape), tuple(grid.shape), op, channels_last=channels_last)
    device = default_device()
    for _, _, name, _, size in description.bindings:
        if size > device.max_storage_buffer_bytes:
            raise ValueError(
                f"the {name} buffer needs {size} bytes, more than this Vulkan device's "
                f"maxStorageBufferRange of {device.max_storage_buffer_bytes} bytes; split the "
                "batch or tile the image and grid into smaller calls, or use etkit_gridsampler.cpu"
            )
    memory, _, _ = _image_memory(image.resolve_neg())
    grid = grid.resolve_neg()
    total = int(description.params["total_elements"])
    out_words = np.zeros(
        total if output_dtype == torch.float32 else math.ceil(total / 4), np.uint32
    )
    params = np.frombuffer(description.params_bytes(), dtype=np.uint8).copy()
    (result,) = device.run(
        spirv(),
        [
            _words(memory.numpy()),
            _words(grid.contiguous().numpy()),
            out_words,
            _words(params),
        ],
        group_counts=description.group_counts,
        read_back=[2],
        specialization=[(cid, value) for cid, _, value in description.specialization_constants],
    )
    flat = result.view(np.float32 if output_dtype == torch.float32 else np.int8)[:total]
    n, c, h, w = image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]
    values = torch.from_numpy(flat.copy())
    if channels_last:
        return values.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return values.reshape(n, c, h, w)
