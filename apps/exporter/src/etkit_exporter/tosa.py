"""Reading TOSA flatbuffers (the VGF backend's intermediates) for reports and checks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def tosa_op_counts(path: Path) -> Counter[str]:
    """How many operators of each kind (``"TRANSPOSE"``, ``"CONV2D"``, ...) a ``.tosa`` file
    holds, over all its regions and blocks."""
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    names = {value: name for name, value in vars(Op).items() if not name.startswith("_")}
    graph = TosaGraph.GetRootAsTosaGraph(Path(path).read_bytes(), 0)
    counts: Counter[str] = Counter()
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            for o in range(block.OperatorsLength()):
                counts[names.get(block.Operators(o).Op(), "UNKNOWN")] += 1
    return counts
