"""Reading a ``.pte`` file's bytes into a checked, typed description of its methods.

ExecuTorch's own deserializer (``executorch.exir._serialize._program.deserialize_pte_binary``)
parses the flatbuffer and puts the segments (delegate data, constants, mutable data) back in
place; this module first checks what that deserializer assumes (the schema identifier, the
extended header's sizes against the file's length) and afterwards everything the interpreter
relies on (every index in range, dim orders that are permutations, planned tensors inside their
memory arenas), so that a bad file raises ``PteFormatError`` with a reason instead of a
traceback from inside the flatbuffer library.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import torch

# ExecuTorch has no public reader of .pte bytes: its serializer's deserializer, its extended
# header and its generated flatbuffer class are what its own tools use.
from executorch.exir import schema
from executorch.exir._serialize._program import _get_extended_header, deserialize_pte_binary
from executorch.exir._serialize.generated.executorch_flatbuffer.Program import (
    Program as FlatProgram,
)
from executorch.exir.schema import TensorDataLocation, TensorShapeDynamism

from etkit_pterunner.errors import PteFormatError

# ExecuTorch's ScalarType codes (schema/scalar_type.fbs, c10's numbering) and the torch dtypes
# the runner can hold a tensor of. Quantized (QINT8, ...) and bit types have no plain dtype.
SCALAR_TYPES: Final[dict[int, tuple[str, torch.dtype | None]]] = {
    0: ("BYTE", torch.uint8),
    1: ("CHAR", torch.int8),
    2: ("SHORT", torch.int16),
    3: ("INT", torch.int32),
    4: ("LONG", torch.int64),
    5: ("HALF", torch.float16),
    6: ("FLOAT", torch.float32),
    7: ("DOUBLE", torch.float64),
    11: ("BOOL", torch.bool),
    12: ("QINT8", None),
    13: ("QUINT8", None),
    14: ("QINT32", None),
    15: ("BFLOAT16", torch.bfloat16),
    16: ("QUINT4X2", None),
    17: ("QUINT2X4", None),
    22: ("BITS16", None),
    23: ("FLOAT8E5M2", torch.float8_e5m2),
    24: ("FLOAT8E4M3FN", torch.float8_e4m3fn),
    25: ("FLOAT8E5M2FNUZ", torch.float8_e5m2fnuz),
    26: ("FLOAT8E4M3FNUZ", torch.float8_e4m3fnuz),
    27: ("UINT16", torch.uint16),
    28: ("UINT32", torch.uint32),
    29: ("UINT64", torch.uint64),
}
DTYPE_OF_CODE: Final[dict[int, torch.dtype]] = {
    code: dtype for code, (_, dtype) in SCALAR_TYPES.items() if dtype is not None
}

TensorStorage = Literal["planned", "constant", "mutable", "unplanned", "external"]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def strides_for(sizes: tuple[int, ...], dim_order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a dense tensor of ``sizes`` laid out in ``dim_order``, the
    outermost dimension first, as ExecuTorch's ``dim_order_to_stride`` computes them."""
    strides = [0] * len(sizes)
    running = 1
    for dim in reversed(dim_order):
        strides[dim] = running
        running *= max(sizes[dim], 1)
    return tuple(strides)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor value of a method: where it lives and how it is laid out.

    ``storage``: ``planned`` (in a memory arena the program plans: ``memory_id``,
    ``memory_offset``), ``constant`` (data in the program: ``constant_index``), ``mutable``
    (planned, with an initial value in the program), ``unplanned`` (memory given at run time:
    inputs of programs that do not plan them, outputs of dynamic kernels) or ``external`` (data
    in a separate ``.ptd`` file, which the runner does not read)."""

    index: int
    scalar_type: str
    dtype: torch.dtype | None
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    storage: TensorStorage
    memory_id: int | None = None
    memory_offset: int | None = None
    constant_index: int | None = None
    dynamic: bool = False
    external_key: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        itemsize = self.dtype.itemsize if self.dtype is not None else 1
        return self.numel * itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        return strides_for(self.sizes, self.dim_order)

    @property
    def channels_last(self) -> bool:
        return self.dim_order == (0, 2, 3, 1)

    def describe(self) -> str:
        """``int8 [1, 4, 32, 48] dim order (0, 2, 3, 1)``; a dynamic tensor's sizes are its
        bound: ``int8 [1, 4, 32, 48] (dynamic, at most) dim order (0, 2, 3, 1)``."""
        dtype = dtype_name(self.dtype) if self.dtype is not None else self.scalar_type
        bound = " (dynamic, at most)" if self.dynamic else ""
        return f"{dtype} {list(self.sizes)}{bound} dim order {self.dim_order}"


ScalarKind = Literal["none", "int", "double", "bool", "string"]
ListKind = Literal["int", "double", "bool", "tensor", "optional_tensor"]


@dataclass(frozen=True)
class ScalarInfo:
    """A non-tensor value of a method: its kind and the value the program stores."""

    index: int
    kind: ScalarKind
    value: int | float | bool | str | None

    def describe(self) -> str:
        return f"{self.kind} {self.value!r}"


@dataclass(frozen=True)
class ListInfo:
    """A list value. Int, tensor and optional-tensor lists hold value indices (``items``;
    -1 for None in an optional-tensor list), double and bool lists hold their values."""

    index: int
    kind: ListKind
    items: tuple[int | float | bool, ...]

    def describe(self) -> str:
        return f"{self.kind} list of {len(self.items)}"


ValueInfo = TensorInfo | ScalarInfo | ListInfo


@dataclass(frozen=True)
class DelegateInfo:
    """One delegate of a method: its backend id, its processed bytes (the blob the backend
    compiled), its compile specs and the instructions that call it."""

    method: str
    index: int
    backend_id: str
    processed: bytes = field(repr=False)
    compile_specs: tuple[tuple[str, bytes], ...]
    instructions: tuple[int, ...]

    @property
    def size(self) -> int:
        """Size of the processed bytes."""
        return len(self.processed)


InstructionKind = Literal["kernel", "delegate", "move", "jump_false", "free"]


@dataclass(frozen=True)
class Instruction:
    """One instruction of a method's chain, flattened: ``kind`` and its fields."""

    position: int
    kind: InstructionKind
    args: tuple[int, ...] = ()
    operator: int = -1
    delegate: int = -1
    move_from: int = -1
    move_to: int = -1
    condition: int = -1
    destination: int = -1
    value: int = -1


@dataclass(frozen=True)
class MethodInfo:
    """A method (an execution plan) of the program."""

    name: str
    values: tuple[ValueInfo, ...] = field(repr=False)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: tuple[str, ...]
    delegates: tuple[DelegateInfo, ...]
    chains: tuple[tuple[Instruction, ...], ...] = field(repr=False)
    buffer_sizes: tuple[int, ...]
    constants: tuple[bytes, ...] = field(repr=False)
    mutable_data: tuple[bytes, ...] = field(repr=False)

    @property
    def input_infos(self) -> tuple[ValueInfo, ...]:
        return tuple(self.values[i] for i in self.inputs)

    @property
    def output_infos(self) -> tuple[ValueInfo, ...]:
        return tuple(self.values[i] for i in self.outputs)

    def where(self, chain: int, position: int) -> str:
        """``instruction 4`` (or ``chain 1 instruction 4`` when the method has several)."""
        if len(self.chains) == 1:
            return f"instruction {position}"
        return f"chain {chain} instruction {position}"


def operator_name(name: str, overload: str) -> str:
    """``aten::add.out``; a default overload is written ``aten::sym_numel.default``."""
    return f"{name}.{overload or 'default'}"


_IDENTIFIER_PATTERN: Final = re.compile(rb"ET[0-9]{2}")


def _check_header(data: bytes, source: str) -> None:
    if len(data) < 8:
        raise PteFormatError(
            f"{source}: {len(data)} bytes, too short to be an ExecuTorch program (.pte)"
        )
    if len(data) < 40 and data[8:12] == b"eh00"[: len(data[8:12])]:
        raise PteFormatError(
            f"{source}: truncated: {len(data)} bytes, shorter than an ExecuTorch program's "
            "headers (40 bytes)"
        )
    if not FlatProgram.ProgramBufferHasIdentifier(data, 0):
        identifier = data[4:8]
        if _IDENTIFIER_PATTERN.fullmatch(identifier):
            raise PteFormatError(
                f"{source}: an ExecuTorch program of schema version {identifier.decode()}; this "
                "runner reads ET12 (executorch 1.5): export the program again with the "
                "executorch this environment has"
            )
        raise PteFormatError(
            f"{source}: not an ExecuTorch program (.pte): no ET12 identifier at byte 4 "
            f"(found {identifier!r})"
        )
    header = _get_extended_header(data)
    if header is None:
        return
    if header.program_size > len(data):
        raise PteFormatError(
            f"{source}: truncated: its header says the program takes {header.program_size} "
            f"bytes, the file has {len(data)}"
        )
    end = header.segment_base_offset + header.segment_data_size
    if header.segment_base_offset and end > len(data):
        raise PteFormatError(
            f"{source}: truncated: its segments end at byte {end}, the file has {len(data)} bytes"
        )
    root = int.from_bytes(data[0:4], "little")
    if not 8 <= root < header.program_size:
        raise PteFormatError(f"{source}: corrupt: root table offset {root} outside the program")


def deserialize(data: bytes, source: str) -> Any:
    """The ``PTEFile`` of ``data`` (program with segments restored), or ``PteFormatError``."""
    _check_header(data, source)
    try:
        return deserialize_pte_binary(data)
    except Exception as error:  # the flatbuffer library raises anything on corrupt data
        reason = f"{type(error).__name__}: {error}".strip()
        raise PteFormatError(
            f"{source}: truncated or corrupt ExecuTorch program: the flatbuffer does not "
            f"parse ({reason[:300]})"
        ) from None


class _Checker:
    """Raises ``PteFormatError`` naming the method and the item that is out of range."""

    def __init__(self, source: str, method: str) -> None:
        self.prefix = f"{source}: corrupt program: method '{method}'"

    def fail(self, message: str) -> PteFormatError:
        return PteFormatError(f"{self.prefix}: {message}")

    def index(self, value: int, limit: int, what: str) -> int:
        if not 0 <= value < limit:
            raise self.fail(f"{what} {value} is out of range (0..{limit - 1})")
        return value


def _tensor_info(
    index: int, tensor: Any, buffer_sizes: tuple[int, ...], constants: int, check: _Checker
) -> TensorInfo:
    code = int(tensor.scalar_type)
    name, dtype = SCALAR_TYPES.get(code, (f"scalar type {code}", None))
    sizes = tuple(int(s) for s in tensor.sizes)
    dim_order = tuple(int(d) for d in tensor.dim_order)
    what = f"value {index}"
    if any(s < 0 for s in sizes):
        raise check.fail(f"{what} has negative sizes {list(sizes)}")
    if sorted(dim_order) != list(range(len(sizes))):
        raise check.fail(
            f"{what} has dim order {list(dim_order)}, not a permutation of its "
            f"{len(sizes)} dimensions"
        )
    dynamic = tensor.shape_dynamism != TensorShapeDynamism.STATIC
    common = (index, name, dtype, sizes, dim_order)
    extra = tensor.extra_tensor_info
    if extra is not None and extra.location == TensorDataLocation.EXTERNAL:
        key = str(extra.fully_qualified_name)
        return TensorInfo(*common, "external", dynamic=dynamic, external_key=key)
    allocation = tensor.allocation_info
    buffer_index = int(tensor.data_buffer_idx)
    if allocation is None:
        if buffer_index > 0:
            check.index(buffer_index, constants, f"{what}'s constant buffer")
            return TensorInfo(*common, "constant", constant_index=buffer_index, dynamic=dynamic)
        return TensorInfo(*common, "unplanned", dynamic=dynamic)
    memory_id = check.index(int(allocation.memory_id), len(buffer_sizes), f"{what}'s memory id")
    offset = int(allocation.memory_offset_low) + (int(allocation.memory_offset_high) << 32)
    info = TensorInfo(
        *common,
        "mutable" if buffer_index > 0 else "planned",
        memory_id=memory_id,
        memory_offset=offset,
        constant_index=buffer_index if buffer_index > 0 else None,
        dynamic=dynamic,
    )
    if offset + info.nbytes > buffer_sizes[memory_id]:
        raise check.fail(
            f"{what} ({info.nbytes} bytes at offset {offset}) lies outside memory arena "
            f"{memory_id} ({buffer_sizes[memory_id]} bytes)"
        )
    return info


def _value_info(
    index: int, evalue: Any, buffer_sizes: tuple[int, ...], constants: int, check: _Checker
) -> ValueInfo:
    val = evalue.val
    if isinstance(val, schema.Tensor):
        return _tensor_info(index, val, buffer_sizes, constants, check)
    if isinstance(val, schema.Null):
        return ScalarInfo(index, "none", None)
    if isinstance(val, schema.Int):
        return ScalarInfo(index, "int", int(val.int_val))
    if isinstance(val, schema.Double):
        return ScalarInfo(index, "double", float(val.double_val))
    if isinstance(val, schema.Bool):
        return ScalarInfo(index, "bool", bool(val.bool_val))
    if isinstance(val, schema.String):
        return ScalarInfo(index, "string", str(val.string_val))
    if isinstance(val, schema.IntList):
        return ListInfo(index, "int", tuple(int(i) for i in val.items))
    if isinstance(val, schema.DoubleList):
        return ListInfo(index, "double", tuple(float(i) for i in val.items))
    if isinstance(val, schema.BoolList):
        return ListInfo(index, "bool", tuple(bool(i) for i in val.items))
    if isinstance(val, schema.TensorList):
        return ListInfo(index, "tensor", tuple(int(i) for i in val.items))
    if isinstance(val, schema.OptionalTensorList):
        return ListInfo(index, "optional_tensor", tuple(int(i) for i in val.items))
    raise check.fail(f"value {index} has a kind the schema does not define ({type(val).__name__})")


def _check_list_items(values: list[ValueInfo], check: _Checker) -> None:
    for info in values:
        if not isinstance(info, ListInfo) or info.kind in ("double", "bool"):
            continue
        for item in info.items:
            assert isinstance(item, int)
            if info.kind == "optional_tensor" and item == -1:
                continue
            check.index(item, len(values), f"value {info.index}'s list item")
            target = values[item]
            wanted = ScalarInfo if info.kind == "int" else TensorInfo
            if not isinstance(target, wanted):
                raise check.fail(
                    f"value {info.index} is an {info.kind} list, but its item {item} is "
                    f"{type(target).__name__}"
                )


def _instruction(
    position: int, instruction: Any, plan: Any, values: int, check: _Checker
) -> Instruction:
    args = instruction.instr_args
    where = f"instruction {position}"
    if isinstance(args, schema.KernelCall):
        check.index(int(args.op_index), len(plan.operators), f"{where}'s operator index")
        items = tuple(check.index(int(a), values, f"{where}'s argument") for a in args.args)
        return Instruction(position, "kernel", items, operator=int(args.op_index))
    if isinstance(args, schema.DelegateCall):
        check.index(int(args.delegate_index), len(plan.delegates), f"{where}'s delegate index")
        items = tuple(check.index(int(a), values, f"{where}'s argument") for a in args.args)
        return Instruction(position, "delegate", items, delegate=int(args.delegate_index))
    if isinstance(args, schema.MoveCall):
        source = check.index(int(args.move_from), values, f"{where}'s move source")
        target = check.index(int(args.move_to), values, f"{where}'s move destination")
        return Instruction(position, "move", move_from=source, move_to=target)
    if isinstance(args, schema.JumpFalseCall):
        condition = check.index(int(args.cond_value_index), values, f"{where}'s condition")
        destination = int(args.destination_instruction)
        return Instruction(position, "jump_false", condition=condition, destination=destination)
    if isinstance(args, schema.FreeCall):
        index = check.index(int(args.value_index), values, f"{where}'s value")
        return Instruction(position, "free", value=index)
    raise check.fail(f"{where} has a kind the schema does not define ({type(args).__name__})")


def read_methods(pte: Any, source: str) -> tuple[MethodInfo, ...]:
    """Every execution plan of a deserialized ``PTEFile``, checked."""
    program = pte.program
    constants = tuple(bytes(buffer.storage) for buffer in program.constant_buffer)
    mutable = tuple(bytes(buffer.storage) for buffer in (pte.mutable_data or ()))
    delegate_data = [bytes(d.data) for d in program.backend_delegate_data]
    methods = []
    for plan in program.execution_plan:
        name = str(plan.name)
        check = _Checker(source, name)
        buffer_sizes = tuple(int(s) for s in plan.non_const_buffer_sizes)
        values: list[ValueInfo] = [
            _value_info(i, v, buffer_sizes, len(constants), check)
            for i, v in enumerate(plan.values)
        ]
        _check_list_items(values, check)
        inputs = tuple(check.index(int(i), len(values), "input value") for i in plan.inputs)
        outputs = tuple(check.index(int(i), len(values), "output value") for i in plan.outputs)
        chains = []
        for chain in plan.chains:
            instructions = tuple(
                _instruction(k, instruction, plan, len(values), check)
                for k, instruction in enumerate(chain.instructions)
            )
            for item in instructions:
                if item.kind == "jump_false" and not 0 <= item.destination <= len(instructions):
                    raise check.fail(
                        f"instruction {item.position} jumps to {item.destination}, outside its "
                        f"chain of {len(instructions)}"
                    )
            chains.append(instructions)
        calls: dict[int, list[int]] = {}
        for instructions in chains:
            for item in instructions:
                if item.kind == "delegate":
                    calls.setdefault(item.delegate, []).append(item.position)
        delegates = []
        for k, delegate in enumerate(plan.delegates):
            reference = delegate.processed
            if int(reference.location) != 0:  # INLINE after the segments are restored
                raise check.fail(f"delegate {k}'s data is in a segment the file does not have")
            data_index = check.index(
                int(reference.index), len(delegate_data), f"delegate {k}'s data index"
            )
            delegates.append(
                DelegateInfo(
                    method=name,
                    index=k,
                    backend_id=str(delegate.id),
                    processed=delegate_data[data_index],
                    compile_specs=tuple(
                        (str(spec.key), bytes(spec.value)) for spec in delegate.compile_specs
                    ),
                    instructions=tuple(calls.get(k, ())),
                )
            )
        methods.append(
            MethodInfo(
                name=name,
                values=tuple(values),
                inputs=inputs,
                outputs=outputs,
                operators=tuple(operator_name(op.name, op.overload) for op in plan.operators),
                delegates=tuple(delegates),
                chains=tuple(chains),
                buffer_sizes=buffer_sizes,
                constants=constants,
                mutable_data=mutable,
            )
        )
    return tuple(methods)
