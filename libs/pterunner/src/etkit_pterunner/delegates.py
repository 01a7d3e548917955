"""Delegate calls: a registry of implementations keyed by backend id.

A registry starts empty. What runs a backend id is a ``Backend``: an object that says how many
of a delegate call's arguments are its inputs (read from the delegate's processed bytes, where
its format says) and computes a call's outputs from its inputs. A plain Python function
``fn(processed: bytes, compile_specs: list[CompileSpec], inputs: list[torch.Tensor]) ->
list[torch.Tensor]`` can be registered for any backend id, replacing what was registered
before; its outputs must have the shapes and dtypes of the program's output tensors (a dynamic
output, one the program plans at its upper bound, may come out smaller: it takes the sizes the
function gives it, as ``resize_tensor`` does in ExecuTorch's runtime).

How many of a call's arguments are inputs, in this order: the ``num_outputs`` given when a
function was registered; what the backend reads from the processed bytes (a function that
replaces a ``Backend`` keeps that backend's reading); else the trailing tensor arguments that
no earlier instruction writes are taken as the outputs (the emitter appends a delegate's
outputs after its inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec

from etkit_pterunner.errors import ExecutionError
from etkit_pterunner.model import DelegateInfo, TensorInfo, dtype_name

DelegateFn = Callable[[bytes, list[Any], list[torch.Tensor]], Sequence[torch.Tensor] | torch.Tensor]


Resizer = Callable[[int, Sequence[int]], torch.Tensor]


@dataclass
class DelegateCall:
    """One call of a delegate: its inputs (with the sizes they have in this run: a dynamic
    tensor's may be below its planned bound) and the output tensors to fill (in the program's
    planned memory, laid out as ``output_infos`` say), and where it is. A dynamic output is
    given its sizes with ``resize_output``."""

    delegate: DelegateInfo
    where: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_infos: list[TensorInfo]
    output_infos: list[TensorInfo]
    warnings: list[str] = field(default_factory=list)
    resizer: Resizer | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.where}: delegate {self.delegate.index} ({self.delegate.backend_id})"

    def fail(self, message: str) -> ExecutionError:
        return ExecutionError(f"{self.name}: {message}")

    def resize_output(self, position: int, shape: Sequence[int]) -> torch.Tensor:
        """Output ``position`` with ``shape``: ExecuTorch's ``resize_tensor`` for a delegate.
        A dynamic output (``output_infos[position].dynamic``) takes any shape of its rank within
        its planned bound, in its planned memory and dim order; ``call.outputs[position]``
        becomes the resized tensor, which is returned. A static output takes only its own
        shape. Raises ``ExecutionError`` otherwise."""
        sizes = tuple(int(s) for s in shape)
        current = self.outputs[position]
        if sizes == tuple(current.shape):
            return current
        info = self.output_infos[position]
        if not info.dynamic or self.resizer is None:
            raise self.fail(
                f"output {position} (value {info.index}, {info.describe()}) is static; it cannot "
                f"take shape {list(sizes)}"
            )
        try:
            resized = self.resizer(info.index, sizes)
        except RuntimeError as error:
            raise self.fail(f"output {position}: {error}") from None
        self.outputs[position] = resized
        return resized


@runtime_checkable
class Backend(Protocol):
    """What runs the delegates of one backend id."""

    def num_inputs(self, delegate: DelegateInfo) -> int | None:
        """How many of a call's arguments are inputs, read from ``delegate.processed``; None
        when the format does not say (the runner then tells inputs from outputs by which
        values earlier instructions write). An exception is reported as the delegate's
        problem, before anything runs."""

    def execute(self, call: DelegateCall) -> str:
        """Computes ``call.outputs`` (in place) from ``call.inputs``; returns what ran it, in
        words (``DelegateCallRecord.implementation``)."""


def describe_tensor(tensor: torch.Tensor) -> str:
    """``int8 [1, 4, 8, 8]``: a tensor's dtype and shape, as the runner's messages name them."""
    return f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"


class PythonDelegate:
    """A registered Python function; ``reads_inputs`` is the backend it replaced, whose
    reading of the processed bytes still says how many arguments are inputs."""

    def __init__(self, fn: DelegateFn, reads_inputs: Backend | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a delegate implementation must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.label = getattr(fn, "__qualname__", None) or type(fn).__name__
        self.reads_inputs = reads_inputs

    def num_inputs(self, delegate: DelegateInfo) -> int | None:
        return None if self.reads_inputs is None else self.reads_inputs.num_inputs(delegate)

    def execute(self, call: DelegateCall) -> str:
        specs = [CompileSpec(key, value) for key, value in call.delegate.compile_specs]
        result = self.fn(call.delegate.processed, specs, [t.clone() for t in call.inputs])
        outputs = [result] if isinstance(result, torch.Tensor) else list(result)
        if len(outputs) != len(call.outputs):
            raise call.fail(
                f"the Python function {self.label} returned {len(outputs)} outputs, the "
                f"program has {len(call.outputs)}"
            )
        for k, (value, target, info) in enumerate(
            zip(outputs, call.outputs, call.output_infos, strict=True)
        ):
            if not isinstance(value, torch.Tensor):
                raise call.fail(
                    f"the Python function {self.label} returned a {type(value).__name__} as "
                    f"output {k}; return torch.Tensor outputs"
                )
            if value.shape != target.shape and info.dynamic and value.dim() == target.dim():
                target = call.resize_output(k, value.shape)
            if value.shape != target.shape or value.dtype != target.dtype:
                raise call.fail(
                    f"the Python function {self.label} returned {describe_tensor(value)} as "
                    f"output {k}, the program's value {info.index} is {info.describe()}"
                )
            target.copy_(value)
        return f"Python function {self.label}"


@dataclass
class Registered:
    """A registry entry: the implementation, the output count given at registration, and
    what it is, in words."""

    backend: Backend
    num_outputs: int | None
    label: str


def _check_backend_id(backend_id: object) -> None:
    if not isinstance(backend_id, str) or not backend_id:
        raise ValueError(f"backend_id must be a non-empty string, got {backend_id!r}")


def _check_num_outputs(num_outputs: object) -> None:
    if num_outputs is not None and (
        isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1
    ):
        raise ValueError(f"num_outputs must be a positive int or None, got {num_outputs!r}")


class DelegateRegistry:
    """Implementations by backend id; empty until something is registered."""

    def __init__(self, backends: Mapping[str, Backend] | None = None) -> None:
        self._entries: dict[str, Registered] = {}
        for backend_id, backend in (backends or {}).items():
            self.add(backend_id, backend)

    def add(
        self,
        backend_id: str,
        backend: Backend,
        *,
        label: str | None = None,
        num_outputs: int | None = None,
    ) -> None:
        """Runs the delegates of ``backend_id`` through ``backend`` (``num_outputs``: when
        every call of this backend has that many outputs, before what ``num_inputs`` reads)."""
        _check_backend_id(backend_id)
        _check_num_outputs(num_outputs)
        if not isinstance(backend, Backend):
            raise TypeError(
                f"a backend must have num_inputs(delegate) and execute(call), got "
                f"{type(backend).__name__}"
            )
        self._entries[backend_id] = Registered(
            backend, num_outputs, label or getattr(backend, "label", None) or type(backend).__name__
        )

    def register(self, backend_id: str, fn: DelegateFn, *, num_outputs: int | None = None) -> None:
        """Runs the delegates of ``backend_id`` through the Python function ``fn``."""
        _check_backend_id(backend_id)
        _check_num_outputs(num_outputs)
        replaced = self._entries.get(backend_id)
        delegate = PythonDelegate(fn, replaced.backend if replaced is not None else None)
        self._entries[backend_id] = Registered(
            delegate, num_outputs, f"Python function {delegate.label}"
        )

    def get(self, backend_id: str) -> Registered | None:
        return self._entries.get(backend_id)

    @property
    def backend_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))
