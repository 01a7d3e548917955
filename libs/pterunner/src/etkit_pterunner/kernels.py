"""Kernel calls: an operator named in the program, run through its PyTorch equivalent.

A name such as ``aten::add.out`` resolves to ``torch.ops.aten.add.out`` and is called with the
program's arguments bound by the operator's schema (the emitter writes one value per schema
argument, then the return value: ``args = [self, other, alpha, out, out]``). Out variants write
into the out tensors, which the interpreter has laid out in memory as the program plans them
(dim order included). ExecuTorch's own operator namespaces become visible in ``torch.ops`` by
importing the libraries that register them: ``executorch.kernels.quantized`` loads
ExecuTorch's quantized kernels as ATen operators (``quantized_decomposed::*.out``, the very
kernels of the runtime), and ``executorch.exir.passes.dim_order_ops_registry`` defines
``dim_order_ops::*``. ``executorch_prim::*`` (scalar arithmetic on symbolic sizes, ``et_view``)
are interpreted here, as the runtime's prim ops do.
"""

from __future__ import annotations

import importlib
import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Protocol

import torch

from etkit_pterunner.model import DTYPE_OF_CODE, strides_for

logger = logging.getLogger(__name__)

# Importing these registers ExecuTorch's operator namespaces in torch.ops.
OPERATOR_LIBRARIES: Final = (
    "executorch.kernels.quantized",
    "executorch.exir.passes.dim_order_ops_registry",
)

_MEMORY_FORMATS: Final[dict[int, torch.memory_format]] = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}
_LAYOUTS: Final[dict[int, torch.layout]] = {0: torch.strided}


@cache
def load_operator_libraries() -> tuple[str, ...]:
    """Imports ``OPERATOR_LIBRARIES`` once; returns those that failed to import."""
    failed = []
    for module in OPERATOR_LIBRARIES:
        try:
            importlib.import_module(module)
        except Exception as error:  # a missing optional kernel library is reported, not fatal
            logger.warning("cannot import %s: %s", module, error)
            failed.append(module)
    return tuple(failed)


class Frame(Protocol):
    """What a kernel sees of the running method's values."""

    def get(self, index: int) -> Any:
        """The value at ``index``, lists resolved to Python lists of their items."""

    def tensor(self, index: int) -> torch.Tensor:
        """The tensor at ``index``."""

    def set(self, index: int, value: Any) -> None:
        """Replaces the value at ``index``."""

    def tensor_layout(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The planned sizes and dim order of the tensor value at ``index``."""

    def list_items(self, index: int) -> tuple[int, ...] | None:
        """The item value indices of the tensor list at ``index`` (-1: None), or ``None`` when
        it is not a tensor list."""

    def is_dynamic(self, index: int) -> bool:
        """True when the tensor value at ``index`` may change its sizes (within its bound)."""

    def resized(self, index: int, shape: Sequence[int]) -> torch.Tensor:
        """The tensor value at ``index`` given ``shape``: its planned memory with these sizes
        and its dim order; raises for a static tensor or a shape past its bound."""


class Kernel(Protocol):
    """A resolved operator."""

    name: str

    def check(self, args: Sequence[int]) -> str | None:
        """Why ``args`` cannot be the arguments of this operator, or ``None``."""

    def written(self, frame: Frame, args: Sequence[int]) -> list[int]:
        """The value indices this call writes."""

    def __call__(self, frame: Frame, args: Sequence[int]) -> None:
        """Runs the operator on ``args`` (value indices)."""


def _convert(value: Any, real_type: str) -> Any:
    """A program value as the PyTorch schema type ``real_type`` takes it: ScalarType,
    MemoryFormat and Layout arguments are stored as integers in the program."""
    if value is None:
        return None
    base = real_type.removeprefix("Optional[").removesuffix("]")
    if base == "ScalarType" and isinstance(value, int):
        return DTYPE_OF_CODE[value]
    if base == "MemoryFormat" and isinstance(value, int):
        return _MEMORY_FORMATS[value]
    if base == "Layout" and isinstance(value, int):
        return _LAYOUTS[value]
    return value


# Namespaces whose kernels honour any strides (ATen's, and dim_order_ops' Python definitions
# on ATen). Other kernels (ExecuTorch's quantized kernels wrapped as ATen operators) assume
# contiguous tensors: they get contiguous copies of their tensor arguments.
_STRIDED_NAMESPACES: Final = frozenset({"aten", "dim_order_ops"})


@dataclass
class TorchKernel:
    """An operator with a ``torch.ops`` overload of the same name.

    An out variant writes into fresh output tensors (laid out as the planned ones for ATen,
    contiguous for the others), which are then copied into the planned outputs: a kernel that
    re-lays out or reallocates its ``out`` (ExecuTorch's wrapped kernels make it contiguous)
    cannot leave the program's memory in another layout than the plan's."""

    name: str
    op: torch._ops.OpOverload

    def __post_init__(self) -> None:
        schema = self.op._schema
        self.arguments = list(schema.arguments)
        self.out_variant = any(a.is_out for a in self.arguments)
        # The emitter appends the return values: for an out variant its out tensors (one value,
        # a tensor list when there are several), otherwise each return.
        self.returns = 1 if self.out_variant else len(schema.returns)
        self.strided = self.name.partition("::")[0] in _STRIDED_NAMESPACES

    def check(self, args: Sequence[int]) -> str | None:
        if len(args) != len(self.arguments) + self.returns:
            return (
                f"{len(args)} arguments, but the schema {self.op._schema} takes "
                f"{len(self.arguments)} and {self.returns} return value"
                f"{'s' if self.returns != 1 else ''}"
            )
        for argument in self.arguments:
            base = str(argument.real_type).removeprefix("Optional[").removesuffix("]")
            if base in ("Device", "Generator", "Storage", "Stream"):
                return f"argument '{argument.name}' of type {base}, which programs do not hold"
        return None

    def written(self, frame: Frame, args: Sequence[int]) -> list[int]:
        if self.out_variant:
            indices = [i for a, i in zip(self.arguments, args, strict=False) if a.is_out]
        else:
            indices = list(args[len(self.arguments) :])
        flat: list[int] = []
        for index in indices:
            items = frame.list_items(index)
            flat += [i for i in items if i >= 0] if items is not None else [index]
        return flat

    def _staged(self, value: Any) -> Any:
        if self.strided:
            return value
        if isinstance(value, torch.Tensor):
            return value.contiguous()
        if isinstance(value, list):
            return [v.contiguous() if isinstance(v, torch.Tensor) else v for v in value]
        return value

    def _fresh(self, planned: torch.Tensor, dynamic: bool) -> torch.Tensor:
        if dynamic:  # the kernel gives it its sizes
            return torch.empty(0, dtype=planned.dtype)
        if self.strided:
            return torch.empty_strided(planned.shape, planned.stride(), dtype=planned.dtype)
        return torch.empty(planned.shape, dtype=planned.dtype)

    def __call__(self, frame: Frame, args: Sequence[int]) -> None:
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        staged: list[tuple[int, torch.Tensor]] = []
        for argument, index in zip(self.arguments, args, strict=False):
            value = _convert(frame.get(index), str(argument.real_type))
            if argument.is_out:
                items = frame.list_items(index)
                if items is None:
                    value = self._fresh(frame.tensor(index), frame.is_dynamic(index))
                    staged.append((index, value))
                else:
                    value = [
                        self._fresh(frame.tensor(i), frame.is_dynamic(i)) if i >= 0 else None
                        for i in items
                    ]
                    staged += [(i, t) for i, t in zip(items, value, strict=True) if t is not None]
            else:
                value = self._staged(value)
            if argument.kwarg_only:
                keywords[argument.name] = value
            else:
                positional.append(value)
        result = self.op(*positional, **keywords)
        if not self.out_variant:
            results = result if self.returns > 1 else (result,)
            for index, value in zip(args[len(self.arguments) :], results, strict=True):
                _store(frame, index, value)
            return
        for index, fresh in staged:
            planned = frame.tensor(index)
            if fresh.shape != planned.shape:
                planned = frame.resized(index, fresh.shape)
            planned.copy_(fresh)


def _store(frame: Frame, index: int, result: Any) -> None:
    """Puts a functional kernel's result at ``index``: into the planned tensor when there is
    one of the same shape and dtype, else in its place."""
    current = frame.get(index)
    if (
        isinstance(result, torch.Tensor)
        and isinstance(current, torch.Tensor)
        and current.shape == result.shape
        and current.dtype == result.dtype
    ):
        current.copy_(result)
        return
    frame.set(index, result)


@dataclass
class ScalarKernel:
    """A scalar operator on symbolic sizes (``executorch_prim::add.Scalar``, ...): ``arity``
    arguments, then the value the result goes to."""

    name: str
    arity: int
    function: Callable[..., Any]

    def check(self, args: Sequence[int]) -> str | None:
        if len(args) != self.arity + 1:
            return f"{len(args)} arguments, expected {self.arity} and the result"
        return None

    def written(self, frame: Frame, args: Sequence[int]) -> list[int]:
        return [args[-1]]

    def __call__(self, frame: Frame, args: Sequence[int]) -> None:
        operands = [frame.get(i) for i in args[:-1]]
        result = self.function(*operands)
        frame.set(args[-1], result)


def _et_view(frame: Frame, args: Sequence[int]) -> None:
    """``executorch_prim::et_view``: the output is the input's memory with the output's sizes
    (a -1 inferred) and the output's planned dim order, as the runtime points it there."""
    source = frame.tensor(args[0])
    sizes = list(frame.get(args[1]))
    if sizes.count(-1) == 1:
        known = math.prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = source.numel() // known if known else 0
    if math.prod(sizes) != source.numel():
        raise RuntimeError(f"et_view of {tuple(source.shape)} to {sizes}: element counts differ")
    layout = frame.tensor_layout(args[2])
    dim_order = layout[1] if layout is not None else tuple(range(len(sizes)))
    view = torch.as_strided(
        source, sizes, strides_for(tuple(sizes), dim_order), source.storage_offset()
    )
    frame.set(args[2], view)


@dataclass
class ViewKernel:
    name: str = "executorch_prim::et_view.default"

    def check(self, args: Sequence[int]) -> str | None:
        return None if len(args) == 3 else f"{len(args)} arguments, expected 3"

    def written(self, frame: Frame, args: Sequence[int]) -> list[int]:
        return [args[2]]

    def __call__(self, frame: Frame, args: Sequence[int]) -> None:
        _et_view(frame, args)


def _floordiv(a: Any, b: Any) -> Any:
    return a // b


def _truediv(a: Any, b: Any) -> Any:
    return a / b


def _sym_int(a: Any) -> int:
    return int(a)


def _sym_float(a: Any) -> float:
    return float(a)


def _ceil(a: float) -> int:
    return math.ceil(a)


def _trunc(a: float) -> int:
    return math.trunc(a)


def _round(a: float) -> int:
    return round(a)


def _sym_ite(condition: Any, a: Any, b: Any) -> Any:
    return a if condition else b


def _sym_not(a: Any) -> bool:
    return not a


# executorch_prim's scalar operators (exir/passes/executorch_prim_ops_registry.py).
_PRIM_SCALAR: Final[dict[str, tuple[int, Callable[..., Any]]]] = {
    "add.Scalar": (2, operator.add),
    "sub.Scalar": (2, operator.sub),
    "mul.Scalar": (2, operator.mul),
    "floordiv.Scalar": (2, _floordiv),
    "floordiv.int": (2, _floordiv),
    "truediv.Scalar": (2, _truediv),
    "mod.Scalar": (2, operator.mod),
    "mod.int": (2, operator.mod),
    "eq.Scalar": (2, operator.eq),
    "gt.Scalar": (2, operator.gt),
    "lt.Scalar": (2, operator.lt),
    "ge.Scalar": (2, operator.ge),
    "le.Scalar": (2, operator.le),
    "neg.Scalar": (1, operator.neg),
    "ceil.Scalar": (1, _ceil),
    "round.Scalar": (1, _round),
    "trunc.Scalar": (1, _trunc),
    "sym_float.Scalar": (1, _sym_float),
    "sym_int.Scalar": (1, _sym_int),
    "sym_max.Scalar": (2, max),
    "sym_min.Scalar": (2, min),
    "sym_not.Scalar": (1, _sym_not),
    "sym_ite.Scalar": (3, _sym_ite),
}

# Operators the runtime has and the runner cannot interpret, with the reason.
_REFUSED: Final[dict[str, str]] = {
    "executorch_prim::et_copy_index.tensor": (
        "it grows a tensor list inside control flow (torch.map/scan), which the runner does "
        "not interpret"
    ),
    "et_copy::_h2d_copy.out": "it copies between devices; the runner runs on the CPU only",
    "et_copy::_d2h_copy.out": "it copies between devices; the runner runs on the CPU only",
}


def resolve(name: str) -> Kernel | str:
    """The kernel for the operator ``name`` (``aten::add.out``), or why there is none."""
    if name in _REFUSED:
        return _REFUSED[name]
    namespace, _, rest = name.partition("::")
    if not rest or "." not in rest:
        return f"'{name}' is not a namespace::name.overload operator name"
    if namespace == "executorch_prim":
        if rest == "et_view.default":
            return ViewKernel()
        if rest in _PRIM_SCALAR:
            arity, function = _PRIM_SCALAR[rest]
            return ScalarKernel(name, arity, function)
        return "no interpretation of this executorch_prim operator"
    failed = load_operator_libraries()
    base, _, overload = rest.rpartition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        hint = f" (importing {', '.join(failed)} failed)" if failed else ""
        return f"torch.ops has no {namespace}.{base}.{overload}{hint}"
    if not isinstance(op, torch._ops.OpOverload):
        return f"torch.ops.{namespace}.{base}.{overload} is not an operator overload"
    return TorchKernel(name, op)
