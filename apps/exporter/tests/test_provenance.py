"""``shared_provenance``: the provenance torch records per pass, kept without the quadratic
deep copy, and exports byte-identical with and without it (the byte identity:
test_diagnostics.py::test_exports_are_byte_identical_and_hold_no_build_path)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.fx.traceback as fx_traceback

from etkit_exporter.export.provenance import shared_provenance


def _node_with_history() -> torch.fx.Node:
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["from_node"] = [fx_traceback.NodeSource(None, "earlier pass")]
    return node


def test_entries_are_shared_inside_and_copied_outside() -> None:
    node = _node_with_history()
    (entry,) = node.meta["from_node"]
    with shared_provenance():
        with shared_provenance():  # re-entrant
            inner = fx_traceback.NodeSource(node, "a pass")
        shared = fx_traceback.NodeSource(node, "a pass")
    copied = fx_traceback.NodeSource(node, "a pass")
    assert inner.from_node[0] is entry and shared.from_node[0] is entry
    assert shared.from_node is not node.meta["from_node"]  # a list of its own
    assert copied.from_node[0] is not entry  # torch's own deep copy once the block ends
    assert copied.from_node[0].pass_name == shared.from_node[0].pass_name == "earlier pass"
    assert fx_traceback.copy.deepcopy is __import__("copy").deepcopy


def test_the_graphs_entries_name_live_until_the_block_ends() -> None:
    """So that no two graphs of one export share an address, and so an id."""
    with shared_provenance():
        graph = torch.fx.Graph()
        fx_traceback.NodeSource(graph.placeholder("x"), "a pass")
        named, unnamed = weakref.ref(graph), weakref.ref(torch.fx.Graph())
        del graph
        gc.collect()
        assert named() is not None and unnamed() is None
    gc.collect()
    assert named() is None
    assert fx_traceback.NodeSource.__init__.__name__ == "__init__"  # torch's own again


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), shared_provenance():
        raise RuntimeError("a failing stage")
    node = _node_with_history()
    assert fx_traceback.NodeSource(node).from_node[0] is not node.meta["from_node"][0]
