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

An entry names its node's graph by ``id(graph)``, an address, and ExecuTorch's ETRecord names
the captured program's graph so (``export_graph_id``); two graphs of one export, one freed
before the other is made, may share an address in one process and not in another, and so one
export's record would number its graphs differently from the same export's in another process.
Inside the block every graph an entry names is also kept alive, so that the graphs of an export
have distinct ids and ``artifact.etrecord.reproducible_record`` numbers them the same on every
run (the IFNet re-creation's XNNPACK export: 879 -> 986 MB peak).
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch.fx.traceback import NodeSource

from etkit_quant.patching import PatchedWhileEntered

_graphs: dict[int, torch.fx.Graph] = {}  # every graph an entry names, while a block runs
_node_source_init = NodeSource.__init__


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


def _keeping_graph(self: NodeSource, node: torch.fx.Node | None, *args: Any, **kwargs: Any) -> None:
    """``NodeSource.__init__``, keeping the graph of the node it names alive."""
    if node is not None:
        _graphs[id(node.graph)] = node.graph
    _node_source_init(self, node, *args, **kwargs)


def _share() -> None:
    fx_traceback.copy = _SharingCopy()  # type: ignore[attr-defined]
    NodeSource.__init__ = _keeping_graph  # type: ignore[method-assign]


def _copy_as_torch() -> None:
    fx_traceback.copy = copy  # type: ignore[attr-defined]
    NodeSource.__init__ = _node_source_init  # type: ignore[method-assign]
    _graphs.clear()


_sharing = PatchedWhileEntered(_share, _copy_as_torch)


def shared_provenance() -> AbstractContextManager[None]:
    """Within the block, ``NodeSource`` shares provenance entries instead of deep-copying
    them, and keeps the graphs they name alive (re-entrant; restores torch's own behaviour and
    lets the graphs go on exit)."""
    return _sharing.entered()
