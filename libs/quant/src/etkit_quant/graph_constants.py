"""What graph rewrites share about constants: ``add_constant``, a new buffer of a module read by
a ``get_attr`` node, and ``BROADCASTING_OPS``, the elementwise ops whose tensor operands
broadcast, so that a constant operand may take any rank up to the result's. ``normalize``'s
steps and the rewrites it runs on request (``normalize_promotions``, ``channel_ops``,
``affine_grids``) all use them."""

from __future__ import annotations

from typing import Final

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten

# Elementwise ops that broadcast all their tensor arguments: a 0-dim argument can take any rank
# up to the result's without changing the result.
BROADCASTING_OPS: Final = frozenset(
    {
        aten.add.Tensor,
        aten.sub.Tensor,
        aten.mul.Tensor,
        aten.div.Tensor,
        aten.div.Tensor_mode,
        aten.maximum.default,
        aten.minimum.default,
        aten.pow.Tensor_Tensor,
        aten.where.self,
        aten.clamp_min.Tensor,
        aten.clamp_max.Tensor,
        aten.eq.Tensor,
        aten.ne.Tensor,
        aten.lt.Tensor,
        aten.le.Tensor,
        aten.gt.Tensor,
        aten.ge.Tensor,
        aten.atan2.default,
        aten.remainder.Tensor,
    }
)


def add_constant(module: GraphModule, value: torch.Tensor, hint: str) -> Node:
    """A new ``get_attr`` node of ``module`` reading a new buffer ``_folded_<k>`` that holds
    ``value`` (the first free ``k``), its ``meta["val"]`` the value and
    ``meta["etkit_folded_from"]`` ``hint`` (the name of the node it stands for). The caller
    places it and wires its users."""
    index = 0
    while hasattr(module, f"_folded_{index}"):
        index += 1
    name = f"_folded_{index}"
    module.register_buffer(name, value)
    node = module.graph.get_attr(name)
    node.meta["val"] = value
    node.meta["etkit_folded_from"] = hint
    return node
