"""Queries on FX graph nodes that every etkit library asks: is this node a quantize, a
dequantize, a grid sampler?

They match by operator name, not by object identity, so they hold in every dialect a node can be
in: the ATen graph of ``torch.export`` (``aten.grid_sampler_2d.default``,
``quantized_decomposed.quantize_per_tensor.default``) and ExecuTorch's edge dialect, whose
operators are wrappers with the same names.
"""

from __future__ import annotations

from typing import Final

from torch.fx import GraphModule, Node

QUANTIZE_TARGET_NAMES: Final = frozenset(
    {
        "quantized_decomposed::quantize_per_tensor",
        "quantized_decomposed::quantize_per_tensor.default",
        "quantized_decomposed::quantize_per_tensor.tensor",
        "quantized_decomposed::quantize_per_tensor.tensor2",
    }
)
DEQUANTIZE_TARGET_NAMES: Final = frozenset(
    {
        "quantized_decomposed::dequantize_per_tensor",
        "quantized_decomposed::dequantize_per_tensor.default",
        "quantized_decomposed::dequantize_per_tensor.tensor",
        "quantized_decomposed::dequantize_per_tensor.tensor2",
    }
)
GRID_SAMPLER_TARGET_NAMES: Final = frozenset(
    {
        "aten::grid_sampler",
        "aten::grid_sampler.default",
        "aten::grid_sampler_2d",
        "aten::grid_sampler_2d.default",
    }
)

# Operators that only move, copy or select values: their output is quantized as their (first)
# input is.
SHAPE_OP_NAMES: Final = frozenset(
    {
        "aten::view",
        "aten::view_copy",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::permute",
        "aten::permute_copy",
        "aten::transpose.int",
        "aten::t",
        "aten::squeeze",
        "aten::squeeze.dim",
        "aten::squeeze.dims",
        "aten::squeeze_copy.dims",
        "aten::unsqueeze",
        "aten::unsqueeze_copy",
        "aten::flatten.using_ints",
        "aten::clone",
        "aten::contiguous",
        "aten::expand",
        "aten::expand_copy",
        "aten::slice.Tensor",
        "aten::slice_copy.Tensor",
        "aten::select.int",
        "aten::select_copy.int",
    }
)


def operator_name(target: object) -> str:
    """The qualified name of an operator (``"aten::grid_sampler_2d"``) for a torch
    ``OpOverload`` or an edge-dialect ``EdgeOpOverload``; ``""`` for anything else."""
    name = getattr(target, "name", None)
    if callable(name):
        result = name()
        return result if isinstance(result, str) else ""
    return ""


def target_name(node: Node) -> str:
    """The qualified operator name of a ``call_function`` node (``"aten::grid_sampler_2d"``,
    ``"aten::grid_sampler_2d.vec"``), or ``""`` for any other node or a non-operator target."""
    return operator_name(node.target) if node.op == "call_function" else ""


def is_quantize(node: Node) -> bool:
    """True for a per-tensor quantize node."""
    return target_name(node) in QUANTIZE_TARGET_NAMES


def is_dequantize(node: Node) -> bool:
    """True for a per-tensor dequantize node."""
    return target_name(node) in DEQUANTIZE_TARGET_NAMES


def is_shape_op(node: Node) -> bool:
    """True for an operator that only moves, copies or selects values (view, reshape, permute,
    transpose, squeeze, unsqueeze, flatten, clone, expand, slice, select), in the ATen and edge
    dialects."""
    return target_name(node).removesuffix(".default") in SHAPE_OP_NAMES


def is_grid_sampler(node: Node) -> bool:
    """True for ``aten.grid_sampler`` and ``aten.grid_sampler_2d`` nodes (any overload)."""
    return target_name(node) in GRID_SAMPLER_TARGET_NAMES


def grid_position_nodes(model: GraphModule, *, include_inputs: bool = False) -> set[Node]:
    """The grid-position subgraph: nodes all of whose uses lead, through any chain of ops, only
    into grid samplers' grid inputs. A node that also feeds anything else (or a grid sampler's
    image) is not in it. Graph inputs are included with ``include_inputs``."""
    skipped = ("output", "get_attr") if include_inputs else ("output", "get_attr", "placeholder")
    positions: set[Node] = set()
    for node in reversed(model.graph.nodes):
        if node.op in skipped or not node.users:
            continue
        if all(_only_feeds_grid(node, user, positions) for user in node.users):
            positions.add(node)
    return positions


def _only_feeds_grid(node: Node, user: Node, positions: set[Node]) -> bool:
    if user in positions:
        return True
    if is_grid_sampler(user):
        image = user.args[0]
        return len(user.args) > 1 and user.args[1] is node and image is not node
    return False
