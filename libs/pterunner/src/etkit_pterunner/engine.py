"""The interpreter: a method's values table and its chains of instructions, executed in order.

Memory is what the program plans: one byte arena per planned buffer
(``non_const_buffer_sizes``), each planned tensor a view at its offset with the strides of its
dim order. Tensors therefore alias exactly as in ExecuTorch's runtime: a view the emitter elided
(a static ``view_copy`` becomes no instruction, its output planned at its input's offset) reads
its input's memory, and a buffer the planner reuses is overwritten when the runtime overwrites
it. Constants come from the program's constant buffers; inputs are copied into their planned
tensors, laid out in the program's dim order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import torch

from etkit_pterunner.delegates import DelegateCall, DelegateRegistry, Registered
from etkit_pterunner.errors import ExecutionError, ProgramInputError, UnsupportedProgramError
from etkit_pterunner.kernels import Kernel, resolve
from etkit_pterunner.model import (
    DelegateInfo,
    Instruction,
    ListInfo,
    MethodInfo,
    ScalarInfo,
    TensorInfo,
    dtype_name,
    strides_for,
)

# A guard against a program whose jumps never end.
MAX_STEPS_PER_INSTRUCTION: Final = 100_000

ValueSource = Literal["input", "constant", "instruction", "alias"]


@dataclass(frozen=True)
class ValueRecord:
    """A value as it was right after the instruction that produced it (``source``
    ``"instruction"``), as given (``"input"``), as stored in the program (``"constant"``), or,
    for a tensor no instruction writes (a view the emitter elided, which aliases another
    value's memory), as it was when first read, ``instruction`` then being the last instruction
    that wrote that memory (``"alias"``)."""

    index: int
    value: Any
    source: ValueSource
    instruction: int | None = None
    chain: int = 0


@dataclass(frozen=True)
class DelegateCallRecord:
    """One delegate call of a run: where, which delegate, what ran it and how long it took
    (``started``: seconds from the start of the run), the value indices of its inputs and
    outputs, and with ``keep_delegate_io`` copies of the tensors it read and wrote (in the
    program's layout)."""

    instruction: int
    delegate: int
    backend_id: str
    implementation: str
    seconds: float
    chain: int = 0
    input_indices: tuple[int, ...] = ()
    output_indices: tuple[int, ...] = ()
    inputs: tuple[torch.Tensor, ...] | None = None
    outputs: tuple[torch.Tensor, ...] | None = None
    started: float = 0.0


@dataclass(frozen=True)
class KernelCallRecord:
    """One kernel call of a run (``started``: seconds from the start of the run)."""

    instruction: int
    operator: str
    seconds: float
    chain: int = 0
    started: float = 0.0


@dataclass
class RunResult:
    """What ``PteProgram.run`` returns: the method's outputs (tensors in the program's layout;
    scalars as Python values), timings, warnings about the program met while running it, and
    with ``keep_values`` every value the run produced."""

    method: str
    outputs: list[Any]
    seconds: float
    delegate_calls: list[DelegateCallRecord] = field(default_factory=list)
    kernel_calls: list[KernelCallRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    values: dict[int, ValueRecord] | None = None

    @property
    def delegate_seconds(self) -> float:
        return sum(call.seconds for call in self.delegate_calls)

    @property
    def kernel_seconds(self) -> float:
        return sum(call.seconds for call in self.kernel_calls)


@dataclass
class Step:
    """An instruction with what executes it."""

    instruction: Instruction
    kernel: Kernel | None = None
    delegate: DelegateInfo | None = None
    backend: Registered | None = None
    num_inputs: int = 0


@dataclass
class MethodPlan:
    method: MethodInfo
    chains: list[list[Step]]
    issues: list[str]


def _tensor_arg(method: MethodInfo, index: int) -> TensorInfo | None:
    info = method.values[index]
    return info if isinstance(info, TensorInfo) else None


def _written_by_kernels(method: MethodInfo, steps: list[Step]) -> set[int]:
    """Value indices some kernel (its out arguments) or move of ``steps`` writes."""
    written: set[int] = set()
    frame = _StaticFrame(method)
    for step in steps:
        if step.kernel is not None:
            written.update(step.kernel.written(frame, step.instruction.args))
        elif step.instruction.kind == "move":
            written.add(step.instruction.move_to)
    return written


def _guess_num_inputs(method: MethodInfo, step: Step, defined: set[int]) -> int | None:
    """For a backend the runner does not know: the delegate's outputs are the trailing
    tensor arguments that no kernel, move or earlier delegate writes and that are neither
    method inputs nor constants (the emitter appends a delegate's outputs after its inputs)."""
    args = step.instruction.args
    count = 0
    for index in reversed(args):
        info = _tensor_arg(method, index)
        if info is None or info.storage == "constant" or index in defined:
            break
        count += 1
    if count == 0 or count == len(args):
        return None
    return len(args) - count


def _tensor_issue(method: MethodInfo, info: TensorInfo) -> str | None:
    """Why the runner cannot hold the tensor value ``info``, if it cannot."""
    what = f"value {info.index} ({info.describe()})"
    if info.dtype is None:
        return f"{what}: scalar type {info.scalar_type} has no PyTorch dtype the runner can hold"
    if info.storage == "external":
        return (
            f"{what}: its data is in an external .ptd file (key '{info.external_key}'), which "
            "the runner does not read"
        )
    if info.memory_offset is not None and info.memory_offset % info.dtype.itemsize:
        return (
            f"{what}: planned at offset {info.memory_offset}, not a multiple of its element "
            f"size {info.dtype.itemsize}"
        )
    if info.storage in ("constant", "mutable"):
        assert info.constant_index is not None
        buffers = method.constants if info.storage == "constant" else method.mutable_data
        kind = "constant buffer" if info.storage == "constant" else "mutable data buffer"
        if info.constant_index >= len(buffers):
            return f"{what}: its {kind} {info.constant_index} is not in the program"
        if len(buffers[info.constant_index]) < info.nbytes:
            return (
                f"{what}: needs {info.nbytes} bytes, its {kind} holds "
                f"{len(buffers[info.constant_index])}"
            )
    return None


def plan_method(method: MethodInfo, registry: DelegateRegistry) -> MethodPlan:
    """Resolves every instruction's kernel or delegate implementation and checks what the
    interpreter needs, collecting every problem as one line in ``issues``."""
    issues: list[str] = []
    for info in method.values:
        issue = _tensor_issue(method, info) if isinstance(info, TensorInfo) else None
        if issue is not None:
            issues.append(issue)
    for position, index in enumerate(method.inputs):
        if isinstance(method.values[index], ListInfo):
            issues.append(f"input {position}: a list input, which the runner does not take")
    chains: list[list[Step]] = []
    for chain_index, instructions in enumerate(method.chains):
        steps = [Step(instruction) for instruction in instructions]
        for step in steps:
            item = step.instruction
            where = method.where(chain_index, item.position)
            if item.kind == "kernel":
                name = method.operators[item.operator]
                kernel = resolve(name)
                if isinstance(kernel, str):
                    issues.append(f"{where}: operator {name} is not supported: {kernel}")
                    continue
                reason = kernel.check(item.args)
                if reason is not None:
                    issues.append(f"{where}: operator {name}: {reason}")
                    continue
                step.kernel = kernel
        defined = set(method.inputs) | _written_by_kernels(method, steps)
        for step in steps:
            item = step.instruction
            if item.kind != "delegate":
                continue
            where = method.where(chain_index, item.position)
            delegate = method.delegates[item.delegate]
            step.delegate = delegate
            name = f"{where}: delegate {delegate.index} (backend '{delegate.backend_id}')"
            entry = registry.get(delegate.backend_id)
            if entry is None:
                issues.append(
                    f"{name}: no implementation is registered for backend "
                    f"'{delegate.backend_id}' (registered: {', '.join(registry.backend_ids)}); "
                    "register a Python function with program.register_delegate"
                    f"('{delegate.backend_id}', fn)"
                )
                continue
            step.backend = entry
            for index in item.args:
                if _tensor_arg(method, index) is None:
                    issues.append(
                        f"{name}: argument value {index} is a "
                        f"{type(method.values[index]).__name__}; the runner passes tensors only"
                    )
            num_inputs = _num_inputs(method, step, entry, defined, issues, name)
            if num_inputs is not None:
                step.num_inputs = num_inputs
                defined.update(item.args[num_inputs:])
        chains.append(steps)
    return MethodPlan(method, chains, issues)


def _num_inputs(
    method: MethodInfo,
    step: Step,
    entry: Registered,
    defined: set[int],
    issues: list[str],
    name: str,
) -> int | None:
    delegate = step.delegate
    assert delegate is not None
    args = step.instruction.args
    count: int | None = None
    if entry.num_outputs is not None:
        count = len(args) - entry.num_outputs
        how = f"registered with num_outputs={entry.num_outputs}"
    else:
        try:
            count = entry.backend.num_inputs(delegate)
        except Exception as error:
            issues.append(f"{name}: cannot read its processed bytes: {error}")
            return None
        how = "its processed bytes declare"
    if count is None:
        count = _guess_num_inputs(method, step, defined)
        if count is None:
            issues.append(
                f"{name}: cannot tell its inputs from its outputs among arguments "
                f"{list(args)}; register the implementation with num_outputs="
            )
            return None
        how = "guessed from the values earlier instructions write"
    assert count is not None
    if not 0 <= count < len(args):
        issues.append(
            f"{name}: {len(args)} arguments, but {how} {count} inputs and at least 1 output"
        )
        return None
    return count


class _StaticFrame:
    """A frame over the program's declared values, for static questions (which values a
    kernel writes) before anything runs."""

    def __init__(self, method: MethodInfo) -> None:
        self.method = method

    def get(self, index: int) -> Any:
        info = self.method.values[index]
        return info.value if isinstance(info, ScalarInfo) else None

    def tensor(self, index: int) -> torch.Tensor:
        raise NotImplementedError

    def set(self, index: int, value: Any) -> None:
        raise NotImplementedError

    def tensor_layout(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        info = self.method.values[index]
        return (info.sizes, info.dim_order) if isinstance(info, TensorInfo) else None

    def list_items(self, index: int) -> tuple[int, ...] | None:
        info = self.method.values[index]
        if isinstance(info, ListInfo) and info.kind in ("tensor", "optional_tensor"):
            return tuple(int(i) for i in info.items)
        return None

    def is_dynamic(self, index: int) -> bool:
        info = self.method.values[index]
        return isinstance(info, TensorInfo) and info.dynamic

    def resized(self, index: int, shape: Sequence[int]) -> torch.Tensor:
        raise NotImplementedError


def _planned_view(
    arena: torch.Tensor, offset: int, info: TensorInfo, sizes: tuple[int, ...] | None = None
) -> torch.Tensor:
    assert info.dtype is not None
    shape = info.sizes if sizes is None else sizes
    nbytes = math.prod(shape) * info.dtype.itemsize
    flat = arena[offset : offset + nbytes].view(info.dtype)
    return flat.as_strided(shape, strides_for(shape, info.dim_order))


def _from_bytes(data: bytes, info: TensorInfo) -> torch.Tensor:
    assert info.dtype is not None
    raw = torch.frombuffer(bytearray(data[: info.nbytes]) or bytearray(1), dtype=torch.uint8)
    return _planned_view(raw, 0, info)


class Frame:
    """The values of one run of a method."""

    def __init__(self, method: MethodInfo) -> None:
        self.method = method
        self.arenas = [torch.zeros(size, dtype=torch.uint8) for size in method.buffer_sizes]
        self.values: list[Any] = []
        for info in method.values:
            if isinstance(info, TensorInfo):
                self.values.append(self._materialize(info))
            elif isinstance(info, ScalarInfo):
                self.values.append(info.value)
            else:
                self.values.append(info)

    def _materialize(self, info: TensorInfo) -> torch.Tensor | None:
        """The tensor of ``info`` (``plan_method`` has checked that the runner can hold it)."""
        if info.dtype is None or info.storage == "external":
            return None
        if info.storage == "constant":
            assert info.constant_index is not None
            return _from_bytes(self.method.constants[info.constant_index], info)
        if info.storage in ("planned", "mutable"):
            assert info.memory_id is not None and info.memory_offset is not None
            tensor = _planned_view(self.arenas[info.memory_id], info.memory_offset, info)
            if info.storage == "mutable":  # its initial state
                assert info.constant_index is not None
                tensor.copy_(_from_bytes(self.method.mutable_data[info.constant_index], info))
            return tensor
        return torch.empty_strided(info.sizes, info.strides, dtype=info.dtype)

    def get(self, index: int) -> Any:
        value = self.values[index]
        if not isinstance(value, ListInfo):
            return value
        if value.kind in ("double", "bool"):
            return list(value.items)
        return [None if item == -1 else self.get(int(item)) for item in value.items]

    def tensor(self, index: int) -> torch.Tensor:
        value = self.values[index]
        if not isinstance(value, torch.Tensor):
            raise ExecutionError(f"value {index} should be a tensor, holds {type(value).__name__}")
        return value

    def set(self, index: int, value: Any) -> None:
        self.values[index] = value

    def tensor_layout(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        info = self.method.values[index]
        return (info.sizes, info.dim_order) if isinstance(info, TensorInfo) else None

    def list_items(self, index: int) -> tuple[int, ...] | None:
        value = self.values[index]
        if isinstance(value, ListInfo) and value.kind in ("tensor", "optional_tensor"):
            return tuple(int(i) for i in value.items)
        return None

    def is_dynamic(self, index: int) -> bool:
        info = self.method.values[index]
        return isinstance(info, TensorInfo) and info.dynamic

    def resized(self, index: int, shape: Sequence[int]) -> torch.Tensor:
        info = self.method.values[index]
        assert isinstance(info, TensorInfo)
        sizes = tuple(int(s) for s in shape)
        if not info.dynamic:
            raise RuntimeError(
                f"value {index} came out with shape {list(sizes)}, but the program planned it "
                f"static at {list(info.sizes)}"
            )
        if len(sizes) != len(info.sizes) or any(
            s > b for s, b in zip(sizes, info.sizes, strict=True)
        ):
            raise RuntimeError(
                f"value {index} came out with shape {list(sizes)}, past its planned bound "
                f"{list(info.sizes)}"
            )
        if info.memory_id is not None and info.memory_offset is not None:
            tensor = _planned_view(self.arenas[info.memory_id], info.memory_offset, info, sizes)
        else:
            tensor = torch.empty_strided(
                sizes, strides_for(sizes, info.dim_order), dtype=info.dtype
            )
        self.values[index] = tensor
        return tensor

    def tensor_indices(self, indices: Sequence[int]) -> list[int]:
        """``indices`` with tensor lists replaced by their items: the tensors they name."""
        flat: list[int] = []
        for index in indices:
            items = self.list_items(index)
            if items is not None:
                flat += [i for i in items if i >= 0]
            elif isinstance(self.values[index], torch.Tensor):
                flat.append(index)
        return flat


def _layout_note(position: int, given: torch.Tensor, info: TensorInfo) -> str | None:
    """A note when a given input's layout differs from the one the program declares."""
    if given.numel() <= 1:
        return None
    planned = strides_for(tuple(given.shape), info.dim_order)
    for size, actual, wanted in zip(given.shape, given.stride(), planned, strict=True):
        if size > 1 and actual != wanted:
            return (
                f"input {position} was given with strides {given.stride()}, the program lays "
                f"it out in dim order {info.dim_order}: the runner copied it into that layout; "
                "executorch.runtime takes the given memory as it is, so give it "
                f"{'channels-last' if info.channels_last else 'in that dim order'} there"
            )
    return None


def _set_inputs(frame: Frame, inputs: Sequence[Any], warnings: list[str]) -> None:
    method = frame.method
    infos = method.input_infos
    if len(inputs) != len(infos):
        wanted = "; ".join(f"{k}: {info.describe()}" for k, info in enumerate(infos))
        raise ProgramInputError(
            f"method '{method.name}' takes {len(infos)} inputs ({wanted or 'none'}), got "
            f"{len(inputs)}"
        )
    for position, (given, info) in enumerate(zip(inputs, infos, strict=True)):
        index = method.inputs[position]
        if isinstance(info, ScalarInfo):
            kinds = {"int": int, "double": float, "bool": bool, "string": str}
            wanted_type = kinds.get(info.kind)
            ok = wanted_type is not None and isinstance(given, wanted_type)
            if info.kind == "int" and isinstance(given, bool):
                ok = False
            if info.kind == "double" and isinstance(given, int) and not isinstance(given, bool):
                ok, given = True, float(given)
            if not ok:
                raise ProgramInputError(
                    f"input {position}: the method takes a {info.kind} (value {index}), got "
                    f"{type(given).__name__} {given!r}"
                )
            frame.set(index, given)
            continue
        assert isinstance(info, TensorInfo) and info.dtype is not None
        if not isinstance(given, torch.Tensor):
            raise ProgramInputError(
                f"input {position}: the method takes a tensor {info.describe()}, got "
                f"{type(given).__name__}"
            )
        if given.dtype != info.dtype:
            raise ProgramInputError(
                f"input {position}: the method takes {dtype_name(info.dtype)} "
                f"{list(info.sizes)}, got {dtype_name(given.dtype)} {list(given.shape)}"
            )
        shape = tuple(given.shape)
        fits = shape == info.sizes or (
            info.dynamic
            and len(shape) == len(info.sizes)
            and all(0 <= s <= b for s, b in zip(shape, info.sizes, strict=True))
        )
        if not fits:
            bound = " (dynamic: at most these sizes)" if info.dynamic else ""
            raise ProgramInputError(
                f"input {position}: the method takes shape {list(info.sizes)}{bound} "
                f"({info.describe()}), got {list(shape)}"
            )
        if given.device.type != "cpu" or given.layout != torch.strided:
            raise ProgramInputError(
                f"input {position}: give a dense CPU tensor, got one on {given.device} with "
                f"layout {given.layout}"
            )
        note = _layout_note(position, given, info)
        if note is not None:
            warnings.append(note)
        target = frame.tensor(index)
        if shape != info.sizes:  # a smaller dynamic input: the same memory, its own sizes
            target = frame.resized(index, shape)
        target.copy_(given.detach())


class _Recorder:
    """``keep_values``: snapshots of every value a run produces."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self.records: dict[int, ValueRecord] = {}
        self.writes: list[tuple[int, int, int, int, int]] = []  # chain, position, arena, range

    def snapshot(self, index: int) -> Any:
        value = self.frame.values[index]
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, ListInfo):
            return self.frame.get(index)
        return value

    def record(
        self, index: int, source: ValueSource, chain: int = 0, instruction: int | None = None
    ) -> None:
        self.records[index] = ValueRecord(
            index, self.snapshot(index), source, instruction=instruction, chain=chain
        )

    def wrote(self, chain: int, position: int, indices: Sequence[int]) -> None:
        for index in indices:
            self.record(index, "instruction", chain, position)
            info = self.frame.method.values[index]
            if isinstance(info, TensorInfo) and info.memory_id is not None:
                assert info.memory_offset is not None
                start = info.memory_offset
                self.writes.append((chain, position, info.memory_id, start, start + info.nbytes))

    def read(self, indices: Sequence[int]) -> None:
        """Snapshots the tensors among ``indices`` no record has yet: constants, and views the
        emitter elided (found by the last write to their memory)."""
        for index in self.frame.tensor_indices(indices):
            if index in self.records:
                continue
            info = self.frame.method.values[index]
            if not isinstance(info, TensorInfo):
                continue
            if info.storage == "constant":
                self.record(index, "constant")
                continue
            producer: tuple[int, int] | None = None
            if info.memory_id is not None and info.memory_offset is not None:
                start, end = info.memory_offset, info.memory_offset + info.nbytes
                for chain, position, arena, low, high in reversed(self.writes):
                    if arena == info.memory_id and low < end and start < high:
                        producer = (chain, position)
                        break
            self.records[index] = ValueRecord(
                index,
                self.snapshot(index),
                "alias",
                instruction=None if producer is None else producer[1],
                chain=0 if producer is None else producer[0],
            )


def execute(
    plan: MethodPlan,
    inputs: Sequence[Any],
    *,
    keep_values: bool = False,
    keep_delegate_io: bool = False,
) -> RunResult:
    """Runs a checked plan on ``inputs``."""
    with torch.no_grad():
        return _execute(plan, inputs, keep_values, keep_delegate_io)


def _execute(
    plan: MethodPlan, inputs: Sequence[Any], keep_values: bool, keep_delegate_io: bool
) -> RunResult:
    method = plan.method
    if plan.issues:
        raise UnsupportedProgramError(method.name, plan.issues)
    start = time.perf_counter()
    frame = Frame(method)
    warnings: list[str] = []
    _set_inputs(frame, inputs, warnings)
    recorder = _Recorder(frame) if keep_values else None
    if recorder is not None:
        for index in method.inputs:
            recorder.record(index, "input")
    result = RunResult(method.name, [], 0.0, warnings=warnings)
    for chain_index, steps in enumerate(plan.chains):
        _run_chain(frame, chain_index, steps, result, recorder, keep_delegate_io, start)
    outputs = []
    for index in method.outputs:
        if recorder is not None:
            recorder.read([index])
        value = frame.get(index)
        outputs.append(value.clone() if isinstance(value, torch.Tensor) else value)
    result.outputs = outputs
    result.values = recorder.records if recorder is not None else None
    result.warnings = list(dict.fromkeys(warnings))
    result.seconds = time.perf_counter() - start
    return result


def _run_chain(
    frame: Frame,
    chain: int,
    steps: list[Step],
    result: RunResult,
    recorder: _Recorder | None,
    keep_delegate_io: bool,
    run_start: float,
) -> None:
    method = frame.method
    budget = MAX_STEPS_PER_INSTRUCTION * max(len(steps), 1)
    counter = 0
    pc = 0
    while pc < len(steps):
        counter += 1
        if counter > budget:
            raise ExecutionError(
                f"method '{method.name}' ran {budget} instructions without ending (a jump loop)"
            )
        step = steps[pc]
        item = step.instruction
        where = method.where(chain, item.position)
        pc += 1
        if item.kind == "kernel":
            kernel = step.kernel
            assert kernel is not None
            written = kernel.written(frame, item.args)
            if recorder is not None:
                recorder.read([i for i in item.args if i not in written])
            began = time.perf_counter()
            try:
                kernel(frame, item.args)
            except Exception as error:
                raise ExecutionError(
                    f"{where}: operator {kernel.name} failed: {type(error).__name__}: {error}"
                ) from error
            result.kernel_calls.append(
                KernelCallRecord(
                    item.position,
                    kernel.name,
                    time.perf_counter() - began,
                    chain,
                    started=began - run_start,
                )
            )
            if recorder is not None:
                recorder.wrote(chain, item.position, kernel.written(frame, item.args))
        elif item.kind == "delegate":
            _call_delegate(frame, chain, step, where, result, recorder, keep_delegate_io, run_start)
        elif item.kind == "move":
            frame.set(item.move_to, frame.values[item.move_from])
            if recorder is not None:
                recorder.wrote(chain, item.position, [item.move_to])
        elif item.kind == "jump_false":
            condition = frame.get(item.condition)
            if isinstance(condition, torch.Tensor):
                condition = bool(condition.item())
            if not condition:
                pc = item.destination
        # "free": ExecuTorch releases a dynamically allocated tensor; nothing to do here.


def _call_delegate(
    frame: Frame,
    chain: int,
    step: Step,
    where: str,
    result: RunResult,
    recorder: _Recorder | None,
    keep_delegate_io: bool,
    run_start: float,
) -> None:
    delegate, entry = step.delegate, step.backend
    assert delegate is not None and entry is not None
    args = step.instruction.args
    split = step.num_inputs
    infos = [frame.method.values[i] for i in args]
    tensor_infos = [info for info in infos if isinstance(info, TensorInfo)]
    call = DelegateCall(
        delegate=delegate,
        where=where,
        inputs=[frame.tensor(i) for i in args[:split]],
        outputs=[frame.tensor(i) for i in args[split:]],
        input_infos=tensor_infos[:split],
        output_infos=tensor_infos[split:],
        resizer=frame.resized,
    )
    if recorder is not None:
        recorder.read(args[:split])
    kept_inputs = tuple(t.clone() for t in call.inputs) if keep_delegate_io else None
    began = time.perf_counter()
    try:
        implementation = entry.backend.execute(call)
    except ExecutionError:
        raise
    except Exception as error:
        raise call.fail(f"{type(error).__name__}: {error}") from error
    seconds = time.perf_counter() - began
    result.warnings.extend(call.warnings)
    result.delegate_calls.append(
        DelegateCallRecord(
            step.instruction.position,
            delegate.index,
            delegate.backend_id,
            implementation,
            seconds,
            chain,
            input_indices=tuple(args[:split]),
            output_indices=tuple(args[split:]),
            inputs=kept_inputs,
            outputs=tuple(t.clone() for t in call.outputs) if keep_delegate_io else None,
            started=began - run_start,
        )
    )
    if recorder is not None:
        recorder.wrote(chain, step.instruction.position, list(args[split:]))
