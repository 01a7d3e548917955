"""``gather_position_nodes``: the sampling arithmetic of warps written as index gathers, which
``BoundaryQuantizer`` (``grid_math="float"``) keeps in float beside the grid samplers'
coordinate arithmetic (``graph.coordinate_nodes``).

A warp written as index gathers (the Model Gym's ``DenseWarp`` nearest and Catmull-Rom modes:
``flat[y * W + x]`` at ``floor``/``round``/``clamp``-ed positions ``grid - flow``, weighted by
``lerp_weight``s of those positions) computes its sampling positions and weights in user code,
where a grid sampler computes them inside the op. Quantized by the base like any elementwise
arithmetic, the positions become int8 tensors (a step of about 0.07 px over a 16-pixel
image): an integer position k comes back as k - 0.03, ``.to(torch.int32)`` truncates it to
k - 1, and the gather reads the wrong pixel (DenseWarp's nearest mode on VGF came out 20.5 dB
from the float model, Catmull-Rom on XNNPACK 19.8 dB). These nodes stay float:

- the positions: every node the index operands of a gather (``aten.index.Tensor``,
  ``aten.gather``, ``aten.index_select``) are computed from through coordinate arithmetic
  (``graph.is_coordinate_op``: elementwise, shape, cast, constant, base grid), up to the last
  compute-heavy op, a graph input or another gather; a node there may feed other ops too (a
  Catmull-Rom tap position also gives its weight);
- the weights: every coordinate-arithmetic node computed only from those positions and
  constants (``lerp_weight``s, their products, an out-of-bounds mask), up to where they meet
  the gathered values, which their quantized consumers read as they read any float tensor.

The gathers themselves read quantized images, as the base annotates them.
"""

from __future__ import annotations

from typing import Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import (
    compute_kind,
    coordinate_nodes,
    graph_inputs_feeding_only,
    is_coordinate_op,
    target_name,
)

_GATHER_INDEX_ARGS: Final = {
    "aten::index.Tensor": 1,  # a list of optional index tensors
    "aten::gather": 2,
    "aten::index_select": 2,
}


def is_index_gather(node: Node) -> bool:
    """True for ``aten.index.Tensor``, ``aten.gather`` and ``aten.index_select`` nodes."""
    return node.op == "call_function" and _gather_name(node) in _GATHER_INDEX_ARGS


def _gather_name(node: Node) -> str:
    return target_name(node).removesuffix(".default")


def _index_operands(node: Node) -> list[Node]:
    position = _GATHER_INDEX_ARGS[_gather_name(node)]
    arg = node.args[position] if len(node.args) > position else None
    found: list[Node] = []
    torch.fx.node.map_arg(arg, found.append)
    return found


def _arithmetic(node: Node) -> bool:
    return (
        node.op == "call_function"
        and is_coordinate_op(node)
        and compute_kind(node) is None
        and not is_index_gather(node)
    )


def _constant(node: Node, constants: dict[Node, bool]) -> bool:
    """Whether ``node`` depends on no graph input (a parameter, a base grid)."""
    if node not in constants:
        if node.op == "get_attr":
            constants[node] = True
        elif node.op != "call_function":
            constants[node] = False
        else:
            constants[node] = all(_constant(a, constants) for a in node.all_input_nodes)
    return constants[node]


_ROUNDING_OPS: Final = {"aten::floor", "aten::round", "aten::ceil", "aten::trunc"}


def _is_float(node: object) -> bool:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def rounded_positions(model: GraphModule, region: set[Node] | None = None) -> list[Node]:
    """The float tensors the index gathers' positions ``region`` (``gather_position_nodes``
    when ``None``) round to whole pixels: the operands of its ``floor``, ``round``, ``ceil``
    and ``trunc`` ops, and of its casts from float to an integer type (``.long()``) of values
    not rounded already; in pixels of the gathered image, as a warp written as gathers
    computes them. In graph order."""
    region = gather_position_nodes(model) if region is None else region
    found: dict[Node, None] = {}
    whole: set[Node] = set()  # computed from rounded positions: a shift there is whole pixels
    for node in model.graph.nodes:
        if node not in region:
            continue
        if any(source in whole for source in node.all_input_nodes):
            whole.add(node)
        first = node.args[0] if node.args else None
        if not isinstance(first, Node) or not _is_float(first) or first in whole:
            continue
        value = node.meta.get("val")
        casts = isinstance(value, torch.Tensor) and not value.dtype.is_floating_point
        if casts or target_name(node).removesuffix(".default") in _ROUNDING_OPS:
            found[first] = None
            whole.add(node)
    return list(found)


def gather_position_nodes(model: GraphModule) -> set[Node]:
    """The positions and weights of the index gathers in ``model`` (see the module's
    docstring). Empty for a graph without gathers."""
    gathers = [n for n in model.graph.nodes if is_index_gather(n)]
    positions: set[Node] = set()
    pending = [i for g in gathers for i in _index_operands(g)]
    while pending:
        node = pending.pop()
        if node in positions or not _arithmetic(node):
            continue
        positions.add(node)
        pending.extend(node.all_input_nodes)
    if not positions:
        return positions
    constants: dict[Node, bool] = {}
    region = set(positions)
    for node in model.graph.nodes:  # in order: a node's inputs are decided before it
        if node in region or not _arithmetic(node) or _constant(node, constants):
            continue
        sources = node.all_input_nodes
        if any(s in region for s in sources) and all(
            s in region or _constant(s, constants) for s in sources
        ):
            region.add(node)
    return region


def coordinate_graph_inputs(model: GraphModule) -> list[Node]:
    """The graph inputs that flow only into coordinate arithmetic (``graph.coordinate_nodes``)
    or straight into grid samplers' grid inputs: coordinate maps, flows and matrices given as
    inputs, which are quantized like grids (int16); the positions of index gathers
    (``gather_position_nodes``) count as coordinate arithmetic. In graph order."""
    return graph_inputs_feeding_only(model, coordinate_nodes(model) | gather_position_nodes(model))
