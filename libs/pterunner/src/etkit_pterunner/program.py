"""``PteProgram``: a ``.pte`` file read from its bytes, run by the interpreter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etkit_pterunner.delegates import Backend, DelegateFn, DelegateRegistry
from etkit_pterunner.engine import MethodPlan, RunResult, execute, plan_method
from etkit_pterunner.errors import UnsupportedProgramError
from etkit_pterunner.model import DelegateInfo, MethodInfo, deserialize, read_methods


class PteProgram:
    """An ExecuTorch program read from the bytes of its ``.pte`` file, runnable method by
    method with delegates substituted by the runner's implementations (see
    ``etkit_pterunner``)."""

    def __init__(
        self,
        methods: Sequence[MethodInfo],
        *,
        source: str,
        size: int,
        path: Path | None = None,
        backends: Mapping[str, Backend] | None = None,
        delegates: Mapping[str, DelegateFn] | None = None,
    ) -> None:
        self._methods = {method.name: method for method in methods}
        self.source = source
        self.size = size
        self.path = path
        self._registry = DelegateRegistry(backends)
        self._plans: dict[str, MethodPlan] = {}
        for backend_id, fn in (delegates or {}).items():
            self.register_delegate(backend_id, fn)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        backends: Mapping[str, Backend] | None = None,
        delegates: Mapping[str, DelegateFn] | None = None,
    ) -> PteProgram:
        """Reads ``path``. Raises ``PteFormatError`` (a ``ValueError``) for a file that is not
        an ExecuTorch program, is truncated or corrupt, or has another schema version.
        ``backends``: what runs each backend id (see ``register_backend``); ``delegates``:
        Python functions by backend id (see ``register_delegate``), registered after them."""
        file = Path(path)
        data = file.read_bytes()
        return cls.from_bytes(
            data,
            source=str(file),
            path=file,
            backends=backends,
            delegates=delegates,
        )

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        source: str = "<bytes>",
        path: Path | None = None,
        backends: Mapping[str, Backend] | None = None,
        delegates: Mapping[str, DelegateFn] | None = None,
    ) -> PteProgram:
        """Reads a program from the bytes of a ``.pte`` file; see ``load``."""
        data = bytes(data)
        methods = read_methods(deserialize(data, source), source)
        return cls(
            methods,
            source=source,
            size=len(data),
            path=path,
            backends=backends,
            delegates=delegates,
        )

    def __repr__(self) -> str:
        return (
            f"PteProgram({self.source!r}, methods={list(self.method_names)}, "
            f"backends={list(self.registered_backends)})"
        )

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(self._methods)

    def method(self, name: str = "forward") -> MethodInfo:
        """The description of method ``name``: values, inputs, outputs, operators, delegates,
        instructions."""
        try:
            return self._methods[name]
        except KeyError:
            raise ValueError(
                f"{self.source} has no method {name!r}; its methods: "
                f"{', '.join(self._methods) or 'none'}"
            ) from None

    @property
    def delegates(self) -> tuple[DelegateInfo, ...]:
        """Every delegate of every method (backend id, index, processed size, compile specs,
        the instructions that call it)."""
        return tuple(d for method in self._methods.values() for d in method.delegates)

    @property
    def registered_backends(self) -> tuple[str, ...]:
        return self._registry.backend_ids

    def backend(self, backend_id: str) -> Backend | None:
        """What runs the delegates of ``backend_id``, if anything is registered for it."""
        entry = self._registry.get(backend_id)
        return None if entry is None else entry.backend

    def register_backend(
        self,
        backend_id: str,
        backend: Backend,
        *,
        label: str | None = None,
        num_outputs: int | None = None,
    ) -> None:
        """Runs every delegate of ``backend_id`` through ``backend`` (an object with
        ``num_inputs(delegate)`` and ``execute(call)``: see ``Backend``), replacing what was
        registered for it."""
        self._registry.add(backend_id, backend, label=label, num_outputs=num_outputs)
        self._plans.clear()

    def register_delegate(
        self, backend_id: str, fn: DelegateFn, *, num_outputs: int | None = None
    ) -> None:
        """Runs every delegate of ``backend_id`` through ``fn(processed_bytes, compile_specs,
        inputs) -> outputs`` (a list of tensors with the shapes and dtypes of the program's
        output tensors), replacing a built-in implementation. ``inputs`` are copies of the
        delegate's input tensors in the program's layout. The number of inputs: ``num_outputs``
        when given, else what the ``Backend`` ``fn`` replaces reads from the processed bytes,
        else it is guessed from which values earlier instructions write."""
        self._registry.register(backend_id, fn, num_outputs=num_outputs)
        self._plans.clear()

    def _plan(self, method: str) -> MethodPlan:
        if method not in self._plans:
            self._plans[method] = plan_method(self.method(method), self._registry)
        return self._plans[method]

    def unsupported(self, method: str = "forward") -> list[str]:
        """Every reason ``method`` cannot run, one line each naming the instruction and the
        operator or backend; empty when it can."""
        return list(self._plan(method).issues)

    def check(self, method: str = "forward") -> None:
        """Raises ``UnsupportedProgramError`` listing ``unsupported(method)``, if any."""
        issues = self.unsupported(method)
        if issues:
            raise UnsupportedProgramError(method, issues)

    def run(
        self,
        inputs: Sequence[Any],
        method: str = "forward",
        *,
        keep_values: bool = False,
        keep_delegate_io: bool = False,
    ) -> RunResult:
        """Runs ``method`` on ``inputs`` (tensors, or Python scalars for scalar inputs) and
        returns its outputs with timings and warnings; ``keep_values`` adds every value the run
        produced (``RunResult.values``: value index -> ``ValueRecord``), ``keep_delegate_io``
        only the tensors each delegate call read and wrote (``DelegateCallRecord.inputs`` and
        ``.outputs``).

        Before anything runs: every operator and backend is checked
        (``UnsupportedProgramError``), then the inputs against the method's (count, shape,
        dtype: ``ProgramInputError`` naming the input). A failing kernel or delegate raises
        ``ExecutionError`` naming the instruction."""
        if isinstance(inputs, Mapping) or not isinstance(inputs, Sequence):
            raise TypeError(
                f"inputs must be a list or tuple of the method's inputs, got "
                f"{type(inputs).__name__}"
            )
        return execute(
            self._plan(method), inputs, keep_values=keep_values, keep_delegate_io=keep_delegate_io
        )
