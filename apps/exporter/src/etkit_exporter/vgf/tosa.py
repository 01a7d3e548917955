"""Reading TOSA flatbuffers (the VGF backend's intermediates) for reports and checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tosa.DType import DType
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph


def _op_names() -> dict[int, str]:
    return {value: name for name, value in vars(Op).items() if not name.startswith("_")}


def _blocks(path: Path) -> Iterator[Any]:
    """Every basic block of a ``.tosa`` file, over all its regions."""

    graph = TosaGraph.GetRootAsTosaGraph(Path(path).read_bytes(), 0)
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            yield region.Blocks(b)


def tosa_op_counts(path: Path) -> Counter[str]:
    """How many operators of each kind (``"TRANSPOSE"``, ``"CONV2D"``, ...) a ``.tosa`` file
    holds, over all its regions and blocks."""
    names = _op_names()
    counts: Counter[str] = Counter()
    for block in _blocks(path):
        for o in range(block.OperatorsLength()):
            counts[names.get(block.Operators(o).Op(), "UNKNOWN")] += 1
    return counts


def tosa_float_ops(path: Path) -> Counter[str]:
    """The operators of a ``.tosa`` file (a VGF delegate's intermediate) that read a
    floating-point tensor, by kind (``"CONV2D"``, ``"ADD"``, ...); ``CAST`` counts too (a
    conversion between integer and float)."""

    names = _op_names()
    floats = {getattr(DType, n) for n in ("FP32", "FP16", "BF16") if hasattr(DType, n)}
    counts: Counter[str] = Counter()
    for block in _blocks(path):
        types = {}
        for t in range(block.TensorsLength()):
            tensor = block.Tensors(t)
            types[tensor.Name()] = tensor.Type()
        for o in range(block.OperatorsLength()):
            operator = block.Operators(o)
            inputs = [operator.Inputs(k) for k in range(operator.InputsLength())]
            if any(types.get(name) in floats for name in inputs):
                counts[names.get(operator.Op(), "UNKNOWN")] += 1
    return counts
