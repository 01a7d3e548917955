"""Node provenance without the quadratic copy.

Every FX pass that re-traces a graph (ExecuTorch's ``ExportPass``, each of the Arm backend's
~150 passes per VGF partition) records where each new node came from:
``torch.fx.traceback.NodeSource(node, pass_name)``, which deep-copies the node's whole
``meta["from_node"]`` history. The history grows by one entry per pass, so a lowering copies
O(passes^2) entries per node: 25 of 105 s of a RIFE-shaped 64x128 VGF export were spent in
those copies (cProfile, ``bench/export_bench.py``).

The entries are never changed once made (torch only ever appends to a node's own top-level
list, never to a ``NodeSource``'s), so sharing them is as good as copying them.
``shared_provenance()`` makes ``NodeSource`` take a new list holding the same entries instead
of a deep copy, for the duration of a ``with`` block: the same provenance, in linear time.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch.fx.traceback as fx_traceback
from torch.fx.traceback import NodeSource

_lock = threading.Lock()
_depth = 0


class _SharingCopy(ModuleType):
    """Stands in for the ``copy`` module inside ``torch.fx.traceback``: ``deepcopy`` of a list
    of provenance entries is a new list of the same entries; anything else is copied as
    ``copy`` would."""

    def __init__(self) -> None:
        super().__init__("copy")
        self.copy = copy.copy

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        if isinstance(value, list) and all(isinstance(v, NodeSource) for v in value):
            return list(value)
        return copy.deepcopy(value, memo)


@contextmanager
def shared_provenance() -> Iterator[None]:
    """Within the block, ``NodeSource`` shares provenance entries instead of deep-copying
    them (re-entrant; restores torch's own behaviour on exit)."""
    global _depth

    with _lock:
        if _depth == 0:
            fx_traceback.copy = _SharingCopy()  # type: ignore[attr-defined]
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                fx_traceback.copy = copy  # type: ignore[attr-defined]
