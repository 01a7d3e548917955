"""The input shapes a module ``prepare_qat`` returned takes: each dimension fixed at the size it
was captured with, or, where it was captured dynamic (``prepare_qat(dynamic_shapes=...)``: a
batch, a crop's height and width), any size in the range ``torch.export`` recorded for it. The
prepared module checks every forward's inputs against them before it runs (``PreparedShapes``),
so that a crop outside the range or a batch the capture fixed is one line naming the input,
the dimension and what the module takes, never an error deep in the graph or a silently wrong
broadcast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram


@dataclass(frozen=True)
class SizeRange:
    """A dynamic dimension's sizes: ``low..high`` (``high`` ``None``: unbounded), each a
    multiple of ``multiple``."""

    low: int
    high: int | None
    multiple: int = 1

    def text(self) -> str:
        high = "" if self.high is None else str(self.high)
        step = f" (multiples of {self.multiple})" if self.multiple > 1 else ""
        return f"{self.low}..{high}{step}"

    def outside(self, size: int) -> bool:
        return (
            size < self.low
            or (self.high is not None and size > self.high)
            or size % self.multiple != 0
        )


Dimension = int | SizeRange | None
"""A fixed size, a dynamic one's range, or ``None`` (a dynamic size whose expression etkit does
not read: not checked)."""


@dataclass(frozen=True)
class PreparedShapes:
    """The shapes of a prepared module's user inputs, by name, in order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[Dimension, ...], ...]

    @property
    def dynamic(self) -> bool:
        """Whether any dimension takes more than one size."""
        return any(not isinstance(d, int) for shape in self.shapes for d in shape)

    def describe(self) -> str:
        """``frame0 [1..64, 3, 64..144, 96..256]``, each input."""
        parts = []
        for name, shape in zip(self.names, self.shapes, strict=True):
            dims = ", ".join(_dimension_text(d) for d in shape)
            parts.append(f"{name} [{dims}]")
        return ", ".join(parts)

    def check(self, inputs: Sequence[object], what: str = "") -> None:
        """Raises ``ValueError`` (one line, ``what`` naming the call or sample) unless
        ``inputs`` are as many tensors as the module takes, each of its rank and, in each
        dimension, of a size the module takes. Symbolic sizes (a capture's fake tensors) pass."""
        prefix = f"{what}: " if what else ""
        if len(inputs) != len(self.names):
            raise ValueError(
                f"{prefix}the prepared module takes {len(self.names)} inputs "
                f"({', '.join(self.names)}), got {len(inputs)}"
            )
        for name, value, shape in zip(self.names, inputs, self.shapes, strict=True):
            if not isinstance(value, torch.Tensor):
                continue  # the graph's own error names it
            sizes = tuple(value.shape)
            if len(sizes) != len(shape):
                raise ValueError(
                    f"{prefix}input {name} has {len(sizes)} dimensions "
                    f"({_shape_text(sizes)}); the prepared module takes {len(shape)} "
                    f"({', '.join(_dimension_text(d) for d in shape)})"
                )
            for axis, (size, allowed) in enumerate(zip(sizes, shape, strict=True)):
                if not isinstance(size, int) or allowed is None:
                    continue
                axis_name = _axis_name(axis, len(shape))
                if isinstance(allowed, int) and size != allowed:
                    raise ValueError(
                        f"{prefix}input {name} is {_shape_text(sizes)}: its {axis_name} {size} is "
                        f"not {allowed}, the only {axis_name} the module was prepared for (its "
                        f"capture fixed it); prepare it with that {axis_name} dynamic to train "
                        "on others"
                    )
                if isinstance(allowed, SizeRange) and allowed.outside(size):
                    raise ValueError(
                        f"{prefix}input {name} is {_shape_text(sizes)}: its {axis_name} {size} is "
                        f"outside {allowed.text()}, the {axis_name}s the module was prepared for; "
                        "prepare it with a range that covers it"
                    )


def prepared_shapes(program: ExportedProgram) -> PreparedShapes:
    """The user inputs' shapes of ``program`` (as captured, with the ranges of its dynamic
    dimensions from ``range_constraints``)."""
    names = set(program.graph_signature.user_inputs)
    ranges = program.range_constraints
    found: list[tuple[str, tuple[Dimension, ...]]] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in names:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        found.append((node.name, tuple(_dimension(d, ranges) for d in value.shape)))
    return PreparedShapes(tuple(n for n, _ in found), tuple(s for _, s in found))


def _dimension(size: object, ranges: Mapping[Any, Any]) -> Dimension:
    """A captured size as ``Dimension``: an int; a symbol ``s`` or ``k * s`` (``k * Dim``) with
    its range, times ``k``; ``None`` for any other expression. (Read through sympy's duck
    attributes: ``is_Symbol``, ``is_Mul``, ``is_Integer``.)"""
    if isinstance(size, int):
        return size
    expr: Any = getattr(getattr(size, "node", None), "expr", None)
    if expr is None:
        return None
    multiple = 1
    symbol = expr
    if getattr(expr, "is_Mul", False) and len(expr.args) == 2:
        factor, symbol = sorted(expr.args, key=lambda a: not getattr(a, "is_Integer", False))
        if not getattr(factor, "is_Integer", False):
            return None
        multiple = int(factor)
    if not getattr(symbol, "is_Symbol", False) or symbol not in ranges:
        return None
    bounds = ranges[symbol]
    low: Any = getattr(bounds, "lower", None)
    high: Any = getattr(bounds, "upper", None)
    if not _finite_integer(low):
        return None
    high_size = multiple * int(high) if _finite_integer(high) else None  # else unbounded
    return SizeRange(multiple * int(low), high_size, multiple)


def _finite_integer(value: object) -> bool:
    return isinstance(value, int) or bool(
        getattr(value, "is_Integer", False) and getattr(value, "is_finite", False)
    )


def _axis_name(axis: int, rank: int) -> str:
    if axis == 0 and rank >= 2:
        return "batch"
    if rank == 4 and axis == 2:
        return "height"
    if rank == 4 and axis == 3:
        return "width"
    return f"dimension {axis}"


def _dimension_text(d: Dimension) -> str:
    if d is None:
        return "any"
    if isinstance(d, SizeRange):
        return d.text()
    return str(d)


def _shape_text(sizes: Sequence[int]) -> str:
    return " x ".join(str(s) for s in sizes)
