"""etkit's grid sampler as a VGF compute segment: the JSON payload of a TOSA ``CUSTOM`` op in
the ``com.arm.VulkanCustomShader`` domain, carrying etkit's own SPIR-V (shaders/grid_sample.comp),
and the check of a payload against the shader it carries.

model-converter reads, per payload: ``entry_point``, ``workgroup_sizes`` (the dispatch's
workgroup COUNTS), ``shader_language``, ``shader_code`` (base64 SPIR-V) and, per input/output
``N``, ``input_N_binding``, ``_descriptorset``, ``_vkdescriptortype``, ``_vkformat``. It has no
key for push constants or specialization constants (an unknown key is dropped without a word)
and nothing checks the shader against the declared bindings: a mismatch gives wrong output, not
an error. So every payload is checked here (``validate``) before it is emitted.

The parameter block (50 32-bit words, ``vulkan.PARAMS_FIELDS``) travels one of two ways:

- ``"tensor"``: a constant int32 tensor, the CUSTOM op's third input, bound as a storage buffer
  at binding 3 (model-converter computes it in a small GRAPH segment before the compute one);
  one SPIR-V for every call site;
- ``"baked"``: the block compiled into the shader as a constant (binding 3 removed), one SPIR-V
  per call site; the driver folds the configuration's switches and constants.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal

import torch

from etkit_gridsampler import vulkan
from etkit_gridsampler.op import GridSampleOp
from etkit_gridsampler.vgf_shader.spirv import SpirvError, reflect

DOMAIN: Final = "com.arm.VulkanCustomShader"
OPERATOR_NAME: Final = "etkit.grid_sample"
ParamsMode = Literal["tensor", "baked"]
PARAMS_MODES: Final = ("tensor", "baked")
# Measured on lavapipe (bench/one_vgf_bench.py): bench/results/one_vgf.md.
DEFAULT_PARAMS_MODE: Final[ParamsMode] = "baked"

_VK_FORMATS: Final[dict[torch.dtype, str]] = {
    torch.int8: "VK_FORMAT_R8_SINT",
    torch.int16: "VK_FORMAT_R16_SINT",
    torch.int32: "VK_FORMAT_R32_SINT",
}
_STORAGE_BUFFER: Final = "VK_DESCRIPTOR_TYPE_STORAGE_BUFFER"
# Keys model-converter 0.11 reads; anything else would be dropped silently.
_TOP_KEYS: Final = frozenset({"entry_point", "workgroup_sizes", "shader_language", "shader_code"})
_PORT_KEYS: Final = frozenset(
    {"binding", "descriptorset", "vkdescriptortype", "vkformat", "sampler", "type"}
)
_PARAMS_BINDING: Final = (
    "layout(set = 0, binding = 3) readonly buffer ParamBlock { Params params; };"
)


class PayloadError(ValueError):
    """A payload that does not match the shader it carries or the tensors it binds."""


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the CUSTOM op binds: its shape (as TOSA sees it) and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SamplerSegment:
    """One grid sampler as a compute segment: the payload, the tensors it binds (inputs:
    image NHWC, grid, and in ``"tensor"`` mode the parameter block; one output NHWC) and the
    parameter block's words (for the constant tensor)."""

    payload: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    params_words: tuple[int, ...]
    params_mode: ParamsMode

    def implementation_attrs(self) -> list[int]:
        """The payload as TOSA ``CUSTOM`` implementation attributes (UTF-8 JSON bytes)."""
        return list(json.dumps(self.payload, sort_keys=True).encode("utf-8"))


def byte_size_reason(
    image_shape: Sequence[int], grid_shape: Sequence[int], grid_dtype: torch.dtype
) -> str | None:
    """Why a compute segment cannot bind these tensors exactly (the shader reads and writes
    32-bit words and the VGF runtime sizes each buffer to its tensor), or ``None``."""
    n, c, h, w = image_shape
    _, ho, wo, _ = grid_shape
    grid_bytes = 1 if grid_dtype == torch.int8 else 2
    sizes = (
        ("image", n * c * h * w),
        ("grid", n * ho * wo * 2 * grid_bytes),
        ("output", n * c * ho * wo),
    )
    bad = [f"{name} {size} bytes" for name, size in sizes if size % 4]
    if bad:
        return (
            "a VGF compute segment binds buffers of exactly their tensor's size and the shader "
            f"works in 32-bit words: {', '.join(bad)} (not a multiple of 4)"
        )
    return None


def padded_channels(
    image_shape: Sequence[int], grid_shape: Sequence[int], grid_dtype: torch.dtype
) -> int | None:
    """The channel count a compute segment samples these tensors with: the image's own when
    every buffer is whole 32-bit words (``byte_size_reason``), else the next multiple of 4
    (the graph segment pads the image's channels with zeros and slices the output back: each
    pixel is then whole words, and channels are sampled independently, so the kept ones are
    the same integers); ``None`` when padding channels does not help (an int8 grid of an odd
    size)."""
    n, c, h, w = image_shape
    if byte_size_reason(image_shape, grid_shape, grid_dtype) is None:
        return int(c)
    padded = -(-int(c) // 4) * 4
    if byte_size_reason((n, padded, h, w), grid_shape, grid_dtype) is None:
        return padded
    return None


def _glsl_constant(kind: str, value: int | float) -> str:
    if kind == "I":
        return f"{int(value) & 0xFFFFFFFF}u"
    if kind == "i":
        return f"int(0x{int(value) & 0xFFFFFFFF:08x}u)"
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"a baked parameter must be finite, got {number}")
    return f"{number:.9e}"  # nine significant digits give the float32 back exactly


def baked_source(params: Mapping[str, int | float]) -> str:
    """etkit's shader with the parameter block compiled in as a constant (no binding 3)."""
    source = vulkan.shader_source()
    if source.count(_PARAMS_BINDING) != 1:
        raise RuntimeError(
            "etkit_gridsampler/shaders/grid_sample.comp no longer declares its parameter block "
            f"as {_PARAMS_BINDING!r}; update vgf_shader.payload.baked_source"
        )
    expanded = _expanded_format()
    values = ", ".join(
        _glsl_constant(kind, params[name])
        for kind, name in zip(expanded, vulkan.PARAMS_FIELDS, strict=True)
    )
    return source.replace(_PARAMS_BINDING, f"const Params params = Params({values});")


def _expanded_format() -> str:
    """``PARAMS_FORMAT`` with repeat counts expanded, one letter per field."""
    letters = ""
    for count, letter in re.findall(r"(\d*)([IiIf])", vulkan.PARAMS_FORMAT.lstrip("<")):
        letters += letter * (int(count) if count else 1)
    return letters


@lru_cache(maxsize=256)
def _baked_spirv(params: tuple[tuple[str, int | float], ...]) -> bytes:
    return vulkan.compile_glsl(baked_source(dict(params)))


def shader_code(segment_params: Mapping[str, int | float], mode: ParamsMode) -> bytes:
    """The SPIR-V a segment carries."""
    if mode == "tensor":
        return vulkan.spirv()
    return _baked_spirv(tuple(segment_params.items()))


def build_segment(
    op: GridSampleOp,
    image_shape: Sequence[int],
    grid_shape: Sequence[int],
    *,
    params_mode: ParamsMode = DEFAULT_PARAMS_MODE,
) -> SamplerSegment:
    """The compute segment of ``op`` on an NCHW-sized image (held NHWC in memory, as the VGF
    passes it) and an N x Ho x Wo x 2 grid, checked (``validate``) before it is returned.
    Raises ``UnsupportedOpError`` outside the integer contract, ``PayloadError`` for tensors a
    segment cannot bind exactly (byte sizes not a multiple of 4) or a float output."""
    if params_mode not in PARAMS_MODES:
        raise ValueError(f"params_mode must be one of {PARAMS_MODES}, got {params_mode!r}")
    if op.output is None or op.image is None or op.grid is None:
        raise PayloadError("a VGF compute segment takes int8 image -> int8 output samplers")
    n, c, h, w = (int(v) for v in image_shape)
    _, ho, wo, _ = (int(v) for v in grid_shape)
    reason = byte_size_reason((n, c, h, w), (n, ho, wo, 2), op.grid.dtype)
    if reason is not None:
        raise PayloadError(reason)
    kernel = vulkan.dispatch((n, c, h, w), (n, ho, wo, 2), op, channels_last=True)
    words = struct.unpack(f"<{len(kernel.params_bytes()) // 4}i", kernel.params_bytes())
    code = shader_code(kernel.params, params_mode)
    image = TensorSpec((n, h, w, c), torch.int8)
    grid = TensorSpec((n, ho, wo, 2), op.grid.dtype)
    output = TensorSpec((n, ho, wo, c), torch.int8)
    inputs = [image, grid]
    payload: dict[str, Any] = {
        "entry_point": "main",
        "workgroup_sizes": list(kernel.group_counts),
        "shader_language": "SPIR-V",
        "shader_code": base64.b64encode(code).decode("ascii"),
    }
    ports = [("input_0", image, 0), ("input_1", grid, 1), ("output_0", output, 2)]
    if params_mode == "tensor":
        params = TensorSpec((len(words),), torch.int32)
        inputs.append(params)
        ports.append(("input_2", params, 3))
    for port, spec, binding in ports:
        payload.update(
            {
                f"{port}_type": "Tensor",
                f"{port}_binding": binding,
                f"{port}_descriptorset": 0,
                f"{port}_vkdescriptortype": _STORAGE_BUFFER,
                f"{port}_vkformat": _VK_FORMATS[spec.dtype],
            }
        )
    segment = SamplerSegment(payload, tuple(inputs), output, tuple(words), params_mode)
    validate(segment.payload, segment.inputs, (segment.output,), kernel=kernel)
    return segment


def validate(
    payload: Mapping[str, Any],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    kernel: vulkan.KernelDispatch | None = None,
) -> None:
    """Checks a custom-shader payload against the SPIR-V it carries and the tensors it binds:
    only keys model-converter reads; SPIR-V with the named entry point and no push constants;
    every shader binding declared by exactly one input/output and every declared one present
    in the shader, with the same descriptor type; a format that is the tensor's dtype; buffer
    byte sizes that are multiples of the shader's word and at least its fixed block; the
    dispatch's group counts (with ``kernel``: those of etkit's kernel, and its buffers at
    least the kernel's sizes). Raises ``PayloadError`` listing every mismatch."""
    problems: list[str] = []
    ports: dict[str, TensorSpec] = {f"input_{i}": t for i, t in enumerate(inputs)}
    ports.update({f"output_{i}": t for i, t in enumerate(outputs)})
    for key in payload:
        port, _, field = key.rpartition("_")
        port = key.rsplit("_", 1)[0] if field in _PORT_KEYS else ""
        if key in _TOP_KEYS or (port in ports and key[len(port) + 1 :] in _PORT_KEYS):
            continue
        problems.append(f"key {key!r} is not one model-converter reads (it would be dropped)")
    if payload.get("shader_language") != "SPIR-V":
        problems.append(f"shader_language {payload.get('shader_language')!r} is not 'SPIR-V'")
    try:
        code = base64.b64decode(str(payload.get("shader_code", "")), validate=True)
        interface = reflect(code)
    except (ValueError, SpirvError) as error:
        raise PayloadError(f"shader_code is not base64 SPIR-V: {error}") from error
    if payload.get("entry_point") not in interface.entry_points:
        problems.append(
            f"entry_point {payload.get('entry_point')!r} is not a compute entry point of the "
            f"shader ({', '.join(interface.entry_points) or 'none'})"
        )
    if interface.push_constant_blocks:
        problems.append(
            "the shader declares push constants "
            f"({', '.join(interface.push_constant_blocks)}), which a payload cannot carry"
        )
    groups = payload.get("workgroup_sizes")
    if not (
        isinstance(groups, list)
        and len(groups) == 3
        and all(isinstance(g, int) and 1 <= g <= 65535 for g in groups)
    ):
        problems.append(f"workgroup_sizes {groups!r} must be three group counts in 1..65535")
    elif kernel is not None and tuple(groups) != kernel.group_counts:
        problems.append(
            f"workgroup_sizes {groups} are not the kernel's group counts {kernel.group_counts}"
        )
    declared: dict[tuple[int, int], str] = {}
    for port, spec in ports.items():
        binding = payload.get(f"{port}_binding")
        set_ = payload.get(f"{port}_descriptorset")
        if not isinstance(binding, int) or not isinstance(set_, int):
            problems.append(f"{port} has no binding/descriptorset")
            continue
        if (set_, binding) in declared:
            problems.append(f"{port} and {declared[(set_, binding)]} share binding {binding}")
        declared[(set_, binding)] = port
        shader_binding = interface.binding(set_, binding)
        if shader_binding is None:
            problems.append(
                f"{port} is bound at set {set_} binding {binding}, which the shader lacks"
            )
            continue
        descriptor = payload.get(f"{port}_vkdescriptortype")
        if descriptor != shader_binding.descriptor_type:
            problems.append(
                f"{port} declares {descriptor} but the shader's binding {binding} "
                f"({shader_binding.name}) is {shader_binding.descriptor_type}"
            )
        vk_format = payload.get(f"{port}_vkformat")
        if vk_format != _VK_FORMATS.get(spec.dtype):
            problems.append(
                f"{port} declares {vk_format} for a {spec.dtype} tensor "
                f"(expected {_VK_FORMATS.get(spec.dtype)})"
            )
        word = shader_binding.runtime_stride or 4
        if spec.nbytes % word:
            problems.append(
                f"{port} is {spec.nbytes} bytes, not a multiple of the shader's {word}-byte "
                f"elements at binding {binding}: the runtime sizes the buffer exactly"
            )
        if spec.nbytes < shader_binding.fixed_bytes:
            problems.append(
                f"{port} is {spec.nbytes} bytes, less than the {shader_binding.fixed_bytes} "
                f"bytes of the shader's {shader_binding.name} block"
            )
        if kernel is not None:
            for set_k, binding_k, name, _, size in kernel.bindings:
                if (set_k, binding_k) == (set_, binding) and spec.nbytes < size:
                    problems.append(
                        f"{port} is {spec.nbytes} bytes, less than the kernel's {size}-byte "
                        f"{name} buffer"
                    )
    for item in interface.bindings:
        if (item.set, item.binding) not in declared:
            problems.append(
                f"the shader's binding {item.binding} ({item.name}, set {item.set}) is bound "
                "by no input or output"
            )
    if problems:
        raise PayloadError(
            "custom-shader payload does not match its shader: " + "; ".join(problems)
        )
