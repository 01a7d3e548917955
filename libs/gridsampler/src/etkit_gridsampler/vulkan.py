"""The grid sampler's Vulkan compute kernel (shaders/grid_sample.comp), dispatched through the
``vulkan`` bindings on any Vulkan device with 64-bit shader integers (lavapipe here).

It implements the integer contract of docs/contract.md bit for bit as the CPU kernel does. The
SPIR-V is compiled from the GLSL on first use (never stored as a binary). ``dispatch`` describes
its bindings, parameter block and dispatch size as data, for running it from a scenario.
"""

from __future__ import annotations

import math
import struct
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
)
from etkit_gridsampler.cpu import check_dtypes, check_inputs, is_channels_last
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp
from etkit_gridsampler.plan import UnsupportedOpError, plan

__all__ = [
    "DeviceInfo",
    "KernelDispatch",
    "VulkanUnavailableError",
    "compile_glsl",
    "device_info",
    "dispatch",
    "grid_sample",
    "is_available",
    "shader_source",
    "spirv",
]

WORKGROUP_SIZE = 64
MAX_GROUPS_X = 65535
# The parameter block (binding 3, std430): the 16 int64 of the plan, then these.
PARAMS_FORMAT = "<16q16ifi"
PARAMS_FIELDS = (
    "x_multiplier", "x_shift", "x_offset", "x_size",
    "y_multiplier", "y_shift", "y_offset", "y_size",
    "grid_zero_point", "image_zero_point",
    "output_zero_point", "output_min", "output_max",
    "requant_multiplier", "requant_shift", "float_output",
    "batch", "channels", "height", "width",
    "out_height", "out_width", "output_channels_last", "grid_is_int8",
    "image_stride_n", "image_stride_c", "image_stride_y", "image_stride_x",
    "mode", "padding", "align_corners", "words_per_row",
    "float_output_scale", "total_elements",
)  # fmt: skip


def shader_source() -> str:
    """The GLSL source of the kernel."""
    return resources.files("etkit_gridsampler").joinpath("shaders/grid_sample.comp").read_text()


@cache
def spirv() -> bytes:
    """The kernel compiled to SPIR-V (once per process)."""
    return compile_glsl(shader_source())


def is_available() -> bool:
    """True when a Vulkan device with a compute queue and 64-bit shader integers can be used."""
    try:
        return default_device().shader_int64
    except VulkanUnavailableError:
        return False


def device_info() -> DeviceInfo:
    """Name, API version and driver of the Vulkan device the kernel runs on. Raises
    ``VulkanUnavailableError`` when there is none."""
    return default_device().info()


@dataclass(frozen=True)
class KernelDispatch:
    """How to run the kernel: what a scenario needs to dispatch it.

    ``bindings``: (set, binding, name, element type, byte size) of each storage buffer;
    ``params``: the parameter block's field values (binding 3, packed with ``PARAMS_FORMAT``);
    ``group_counts``: workgroups in x, y, z (``WORKGROUP_SIZE`` invocations each)."""

    bindings: tuple[tuple[int, int, str, str, int], ...]
    params: dict[str, int | float]
    params_format: str
    workgroup_size: tuple[int, int, int]
    group_counts: tuple[int, int, int]
    shader: str = "etkit_gridsampler/shaders/grid_sample.comp"

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


def dispatch(
    image_shape: tuple[int, int, int, int],
    grid_shape: tuple[int, int, int, int],
    op: GridSampleOp,
    *,
    channels_last: bool = False,
) -> KernelDispatch:
    """The dispatch of ``op`` on an image of ``image_shape`` (NCHW sizes; ``channels_last``: NHWC
    in memory, and so is the output) and a contiguous grid of ``grid_shape``. Raises
    ``UnsupportedOpError`` for a configuration outside the integer contract."""
    if op.is_float or op.image is None or op.grid is None:
        raise UnsupportedOpError(
            "the Vulkan kernel implements the integer contract (int8 image, int16/int8 grid); "
            "use etkit_gridsampler.cpu for float32"
        )
    batch, channels, height, width = image_shape
    _, out_height, out_width, _ = grid_shape
    constants = plan(op, height, width)
    total = batch * channels * out_height * out_width
    float_output = op.output is None
    words = total if float_output else math.ceil(total / 4)
    groups = math.ceil(words / WORKGROUP_SIZE)
    groups_x = min(groups, MAX_GROUPS_X)
    groups_y = math.ceil(groups / groups_x)
    if channels_last:
        strides = (height * width * channels, 1, width * channels, channels)
    else:
        strides = (channels * height * width, height * width, width, 1)
    grid_bytes = 1 if op.grid.dtype == torch.int8 else 2
    values: list[int | float] = [
        *constants.values,
        batch, channels, height, width,
        out_height, out_width, int(channels_last), int(grid_bytes == 1),
        *strides,
        MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        groups_x * WORKGROUP_SIZE,
        constants.float_output_scale, total,
    ]  # fmt: skip
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
        group_counts=(groups_x, groups_y, 1),
    )  # fmt: skip


def _words(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    padded = np.zeros(math.ceil(max(raw.size, 4) / 4) * 4, dtype=np.uint8)
    padded[: raw.size] = raw
    return padded.view(np.uint32)


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """The integer grid sampler on the Vulkan device: the contract and the outputs of
    ``cpu.grid_sample``, bit for bit. Raises ``VulkanUnavailableError`` without a usable device,
    ``UnsupportedOpError`` for a float op or a configuration outside the contract."""
    check_inputs(image, grid)
    if op.is_float:
        raise UnsupportedOpError(
            "the Vulkan kernel implements the integer contract; use etkit_gridsampler.cpu for "
            "float32"
        )
    output_dtype = check_dtypes(image, grid, op)
    device = default_device()
    if not device.shader_int64:
        raise VulkanUnavailableError("the Vulkan device lacks 64-bit shader integers (shaderInt64)")
    memory, _, channels_last = _image_memory(image)
    description = dispatch(
        tuple(image.shape),  # type: ignore[arg-type]
        tuple(grid.shape),  # type: ignore[arg-type]
        op,
        channels_last=channels_last,
    )
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
    )
    flat = result.view(np.float32 if output_dtype == torch.float32 else np.int8)[:total]
    n, c, h, w = image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]
    values = torch.from_numpy(flat.copy())
    if channels_last:
        return values.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return values.reshape(n, c, h, w)
