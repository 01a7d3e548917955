"""What a SPIR-V compute shader declares, read from its binary: entry points, local size, the
descriptor bindings with their kind and fixed byte size, push-constant blocks and
specialization constants. Enough to check a VGF custom-shader payload against the shader it
carries (model-converter and the runtimes check nothing of it)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x07230203

# opcodes
_OP_NAME = 5
_OP_ENTRY_POINT = 15
_OP_EXECUTION_MODE = 16
_OP_TYPE_INT = 21
_OP_TYPE_FLOAT = 22
_OP_TYPE_VECTOR = 23
_OP_TYPE_IMAGE = 25
_OP_TYPE_SAMPLER = 26
_OP_TYPE_SAMPLED_IMAGE = 27
_OP_TYPE_ARRAY = 28
_OP_TYPE_RUNTIME_ARRAY = 29
_OP_TYPE_STRUCT = 30
_OP_TYPE_POINTER = 32
_OP_CONSTANT = 43
_OP_SPEC_CONSTANT_TRUE = 48
_OP_SPEC_CONSTANT_FALSE = 49
_OP_SPEC_CONSTANT = 50
_OP_VARIABLE = 59
_OP_DECORATE = 71
_OP_MEMBER_DECORATE = 72
# decorations
_SPEC_ID = 1
_BLOCK = 2
_BUFFER_BLOCK = 3
_ARRAY_STRIDE = 6
_BINDING = 33
_DESCRIPTOR_SET = 34
_OFFSET = 35
# storage classes
_UNIFORM_CONSTANT = 0
_UNIFORM = 2
_PUSH_CONSTANT = 9
_STORAGE_BUFFER = 12
# execution model and mode
_GL_COMPUTE = 5
_LOCAL_SIZE = 17


class SpirvError(ValueError):
    """The bytes are not a SPIR-V module this reader understands."""


@dataclass(frozen=True)
class Binding:
    """One descriptor binding of the shader: ``descriptor_type`` as Vulkan names it
    (``VK_DESCRIPTOR_TYPE_STORAGE_BUFFER``, ...), ``fixed_bytes`` the size of the block's part
    before any runtime array (0 for a block that is one runtime array), ``runtime_stride`` the
    element stride of a trailing runtime array (0 when there is none)."""

    set: int
    binding: int
    name: str
    descriptor_type: str
    fixed_bytes: int
    runtime_stride: int


@dataclass(frozen=True)
class ShaderInterface:
    entry_points: tuple[str, ...]
    local_size: tuple[int, int, int] | None
    bindings: tuple[Binding, ...]
    push_constant_blocks: tuple[str, ...]
    specialization_ids: tuple[int, ...]

    def binding(self, set_: int, binding: int) -> Binding | None:
        for item in self.bindings:
            if (item.set, item.binding) == (set_, binding):
                return item
        return None


def _string(words: tuple[int, ...]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def reflect(code: bytes) -> ShaderInterface:
    """The interface of the SPIR-V module ``code``. Raises ``SpirvError`` for bytes that are
    not SPIR-V (wrong magic, truncated instructions)."""
    if len(code) < 20 or len(code) % 4:
        raise SpirvError(f"not a SPIR-V module: {len(code)} bytes (a module is 32-bit words)")
    words = struct.unpack(f"<{len(code) // 4}I", code)
    if words[0] != MAGIC:
        raise SpirvError(f"not a SPIR-V module: magic 0x{words[0]:08x}, expected 0x{MAGIC:08x}")
    names: dict[int, str] = {}
    entry_points: list[tuple[int, str]] = []
    local_size: dict[int, tuple[int, int, int]] = {}
    decorations: dict[int, dict[int, tuple[int, ...]]] = {}
    member_offsets: dict[int, dict[int, int]] = {}
    types: dict[int, tuple[int, tuple[int, ...]]] = {}
    constants: dict[int, int] = {}
    variables: list[tuple[int, int, int]] = []  # (pointer type, id, storage class)
    spec_ids: list[int] = []
    at = 5
    while at < len(words):
        count, opcode = words[at] >> 16, words[at] & 0xFFFF
        if count == 0 or at + count > len(words):
            raise SpirvError(f"truncated SPIR-V instruction at word {at}")
        operands = words[at + 1 : at + count]
        at += count
        if opcode == _OP_NAME:
            names[operands[0]] = _string(operands[1:])
        elif opcode == _OP_ENTRY_POINT and operands[0] == _GL_COMPUTE:
            entry_points.append((operands[1], _string(operands[2:])))
        elif opcode == _OP_EXECUTION_MODE and operands[1] == _LOCAL_SIZE:
            local_size[operands[0]] = (operands[2], operands[3], operands[4])
        elif opcode == _OP_DECORATE:
            decorations.setdefault(operands[0], {})[operands[1]] = tuple(operands[2:])
            if operands[1] == _SPEC_ID:
                spec_ids.append(operands[2])
        elif opcode == _OP_MEMBER_DECORATE and operands[2] == _OFFSET:
            member_offsets.setdefault(operands[0], {})[operands[1]] = operands[3]
        elif opcode in (
            _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_ARRAY,
            _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER, _OP_TYPE_IMAGE,
            _OP_TYPE_SAMPLER, _OP_TYPE_SAMPLED_IMAGE,
        ):  # fmt: skip
            types[operands[0]] = (opcode, tuple(operands[1:]))
        elif opcode == _OP_CONSTANT and len(operands) >= 3:
            constants[operands[1]] = operands[2]
        elif opcode in (_OP_SPEC_CONSTANT, _OP_SPEC_CONSTANT_TRUE, _OP_SPEC_CONSTANT_FALSE):
            pass
        elif opcode == _OP_VARIABLE:
            variables.append((operands[0], operands[1], operands[2]))

    def size_of(type_id: int) -> tuple[int, int]:
        """(fixed bytes, runtime-array stride) of a type laid out by its decorations."""
        kind, rest = types.get(type_id, (0, ()))
        if kind in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            return rest[0] // 8, 0
        if kind == _OP_TYPE_VECTOR:
            element, _ = size_of(rest[0])
            return element * rest[1], 0
        if kind == _OP_TYPE_ARRAY:
            stride = decorations.get(type_id, {}).get(_ARRAY_STRIDE, (0,))[0]
            return stride * constants.get(rest[1], 0), 0
        if kind == _OP_TYPE_RUNTIME_ARRAY:
            return 0, decorations.get(type_id, {}).get(_ARRAY_STRIDE, (0,))[0]
        if kind == _OP_TYPE_STRUCT:
            end, runtime = 0, 0
            offsets = member_offsets.get(type_id, {})
            for index, member in enumerate(rest):
                fixed, stride = size_of(member)
                offset = offsets.get(index, end)
                end = max(end, offset + fixed)
                runtime = stride or runtime
            return end, runtime
        return 0, 0

    bindings: list[Binding] = []
    push_constants: list[str] = []
    for pointer, variable, storage in variables:
        pointee = types.get(pointer, (0, (0, 0)))[1][1]
        name = names.get(variable) or names.get(pointee, f"%{variable}")
        if storage == _PUSH_CONSTANT:
            push_constants.append(name)
            continue
        decorated = decorations.get(variable, {})
        if _BINDING not in decorated:
            continue
        block = decorations.get(pointee, {})
        pointee_kind = types.get(pointee, (0, ()))[0]
        if storage == _STORAGE_BUFFER or (storage == _UNIFORM and _BUFFER_BLOCK in block):
            descriptor = "VK_DESCRIPTOR_TYPE_STORAGE_BUFFER"
        elif storage == _UNIFORM:
            descriptor = "VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER"
        elif storage == _UNIFORM_CONSTANT and pointee_kind == _OP_TYPE_SAMPLED_IMAGE:
            descriptor = "VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER"
        elif storage == _UNIFORM_CONSTANT and pointee_kind == _OP_TYPE_IMAGE:
            sampled = types[pointee][1][5] if len(types[pointee][1]) > 5 else 0
            descriptor = (
                "VK_DESCRIPTOR_TYPE_STORAGE_IMAGE"
                if sampled == 2
                else "VK_DESCRIPTOR_TYPE_SAMPLED_IMAGE"
            )
        else:
            descriptor = f"unknown (storage class {storage})"
        fixed, stride = size_of(pointee)
        bindings.append(
            Binding(
                decorated.get(_DESCRIPTOR_SET, (0,))[0],
                decorated[_BINDING][0],
                name,
                descriptor,
                fixed,
                stride,
            )
        )
    sizes = [local_size[i] for i, _ in entry_points if i in local_size]
    return ShaderInterface(
        entry_points=tuple(name for _, name in entry_points),
        local_size=sizes[0] if sizes else None,
        bindings=tuple(sorted(bindings, key=lambda b: (b.set, b.binding))),
        push_constant_blocks=tuple(push_constants),
        specialization_ids=tuple(sorted(spec_ids)),
    )
