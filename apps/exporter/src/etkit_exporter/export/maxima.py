"""Maxima over channels in a form XNNPACK lowers, for XNNPACK exports (before quantization; the
float model's values do not change).

``channel_maxima_last``: an ``amax`` of a 4-D tensor over one dimension other than height and
width (a maximum over channels: the Model Gym's Karis tonemap, ``torch.max(x, dim=1,
keepdim=True).values``; a spatial attention map), and a ``max.dim`` whose indices nothing reads,
becomes the same maximum over the last dimension of a permuted view, permuted back: a
permutation, ``max.dim`` over dimension 3 (its values), the inverse permutation. An ``amax``
over height or width becomes that ``max.dim`` (its values). Exact (a maximum, and copies).

Upstream pin: ExecuTorch 1.5.1's XNNPACK partitioner claims ``amax`` and ``max.dim`` of a 4-D
tensor over any dimension, and its lowering (``backends/xnnpack/operators/op_max_dim.py``) then
stops the export: "amax.default only supports dim == 2 or dim == 3" (its partitioner claims only
``max.dim``, which its passes turn into that ``amax``, so an ``amax`` written as such runs
outside the delegate even over width). Detagging the reduction
instead (``etkit_partition.DetagMaximaOverChannels``) splits the partition around it; over a
permuted view it stays inside XNNPACK's delegate. When upstream lowers other dimensions (or its
partitioner stops claiming them), this rewrite can go.
"""

from __future__ import annotations

import logging
import operator

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import target_name

logger = logging.getLogger(__name__)

aten = torch.ops.aten


def _reduced(node: Node) -> int | None:
    """The one dimension ``node`` (``amax``/``max.dim`` with ``keepdim``) reduces of a 4-D
    tensor, made non-negative; ``None`` otherwise."""
    source = node.args[0]
    value = source.meta.get("val") if isinstance(source, Node) else None
    if getattr(value, "ndim", None) != 4:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, (list, tuple)):
        dims = dims[0] if len(dims) == 1 else None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, int) or not keepdim:
        return None
    return dims % 4


def channel_maxima_last(module: GraphModule) -> list[str]:
    """Rewrites each maximum over channels (see the module's docstring) as a maximum over the
    last dimension of a permuted view; returns the names of the nodes rewritten."""
    rewritten: list[str] = []
    for node in list(module.graph.nodes):
        name = target_name(node).removesuffix(".default")
        if name not in ("aten::amax", "aten::max.dim"):
            continue
        dim = _reduced(node)
        if dim is None or (dim in (2, 3) and name == "aten::max.dim"):
            continue  # (max.dim over height or width: XNNPACK's own form)
        if dim in (2, 3):  # an amax over height or width: the max.dim XNNPACK's partitioner claims
            with module.graph.inserting_before(node):
                pair = module.graph.call_function(aten.max.dim, (node.args[0], dim, True))
                result = module.graph.call_function(operator.getitem, (pair, 0))
            for new in (pair, result):
                new.meta["stack_trace"] = node.meta.get("stack_trace")
            result.meta["val"] = node.meta.get("val")  # the same values: a later maximum reads it
            node.replace_all_uses_with(result)
            module.graph.erase_node(node)
            rewritten.append(node.name)
            continue
        if name == "aten::max.dim":
            items = list(node.users)
            if not all(u.target is operator.getitem for u in items) or any(
                u.args[1] != 0 and u.users for u in items
            ):
                continue  # the indices are read: left as it is
        order = [d for d in range(4) if d != dim] + [dim]
        inverse = [order.index(d) for d in range(4)]
        with module.graph.inserting_before(node):
            permuted = module.graph.call_function(aten.permute.default, (node.args[0], order))
            # max.dim, values only: the form XNNPACK's partitioner claims and lowers
            pair = module.graph.call_function(aten.max.dim, (permuted, 3, True))
            reduced = module.graph.call_function(operator.getitem, (pair, 0))
            result = module.graph.call_function(aten.permute.default, (reduced, inverse))
        for new in (permuted, pair, reduced, result):
            new.meta["stack_trace"] = node.meta.get("stack_trace")
        value = node.meta.get("val")
        result.meta["val"] = value[0] if isinstance(value, (tuple, list)) else value
        if name == "aten::max.dim":
            for item in list(node.users):
                item.replace_all_uses_with(result)
                module.graph.erase_node(item)
        else:
            node.replace_all_uses_with(result)
        module.graph.erase_node(node)
        rewritten.append(node.name)
    if rewritten:
        module.graph.lint()
        module.recompile()
        logger.debug("maxima over channels taken over the last dim: %s", rewritten)
    return rewritten
