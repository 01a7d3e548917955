"""``channels_last``: images cross a program's boundaries, and its grid samplers, in the layout a
GPU reads (NHWC), so no transpose is left at the edges."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from etkit_quant.boundary import user_outputs
from etkit_quant.graph import grid_position_nodes, is_dequantize, is_grid_sampler, is_quantize

logger = logging.getLogger(__name__)

# torch.export names lifted parameters, buffers and constants with these prefixes.
_LIFTED_PREFIXES = ("p_", "b_", "c_", "_lifted_tensor_constant", "_frozen_param")


def _is_image(node: Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dim() == 4


def _user_inputs(graph_module: GraphModule) -> list[Node]:
    return [
        n
        for n in graph_module.graph.nodes
        if n.op == "placeholder" and n.users and not n.name.startswith(_LIFTED_PREFIXES)
    ]


def grid_tensors(graph_module: GraphModule) -> set[Node]:
    """Sampling grids, which keep their N x H x W x 2 layout: the nodes whose tensor reaches a
    grid sampler's grid input directly or through any chain of quantize/dequantize nodes, and
    the N x H x W x 2 tensors (graph inputs included) whose every use leads only into grid
    inputs (a grid input scaled in the model, say). Images that only feed the grid computation
    (the frames a flow network reads) are not grids."""
    grids = {
        n
        for n in grid_position_nodes(graph_module, include_inputs=True)
        if isinstance(n.meta.get("val"), torch.Tensor)
        and n.meta["val"].dim() == 4
        and n.meta["val"].shape[-1] == 2
    }
    for node in graph_module.graph.nodes:
        if not is_grid_sampler(node) or len(node.args) < 2 or not isinstance(node.args[1], Node):
            continue
        current: Node | None = node.args[1]
        while current is not None and current not in grids:
            grids.add(current)
            source = current.args[0] if current.args else None
            is_qdq = is_quantize(current) or is_dequantize(current)
            current = source if is_qdq and isinstance(source, Node) else None
    return grids


def _mark(node: Node, marked: list[Node]) -> None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() != 4:
        return
    if value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous():
        return  # already channels-last
    node.meta["val"] = value.contiguous(memory_format=torch.channels_last)
    marked.append(node)


def channels_last_nodes(graph_module: GraphModule) -> list[Node]:
    """The nodes ``channels_last`` marks, in graph order (see its docstring)."""
    grids = grid_tensors(graph_module)
    chosen: list[Node] = []

    def add(nodes: Iterable[Node]) -> None:
        for node in nodes:
            if node not in grids and _is_image(node) and node not in chosen:
                chosen.append(node)

    for node in _user_inputs(graph_module):
        if node in grids or not _is_image(node):
            continue
        add([node])
        add(u for u in node.users if is_quantize(u))
    for node in user_outputs(graph_module):
        if not _is_image(node) or node in grids:
            continue
        add([node])
        if is_dequantize(node) and isinstance(node.args[0], Node):
            add([node.args[0]])
    for node in graph_module.graph.nodes:
        if not is_grid_sampler(node):
            continue
        image = node.args[0]
        if isinstance(image, Node):
            add([image])
            if is_dequantize(image) and isinstance(image.args[0], Node):
                add([image.args[0]])
        add([node])
        add(u for u in node.users if is_quantize(u))
    order = {n: i for i, n in enumerate(graph_module.graph.nodes)}
    return sorted(chosen, key=order.__getitem__)


def channels_last(graph_module: GraphModule) -> PassResult:
    """An edge-dialect transform pass (a ``transform_passes`` entry of
    ``to_edge_transform_and_lower``) that makes channels-last (NHWC in memory):

    - the 4-D image inputs and outputs of the program (user inputs: placeholders that are not
      lifted parameters, buffers or constants);
    - the quantize right after an image input, and the tensor right before an image output's
      dequantize;
    - each grid sampler's image input and output, with the dequantize before and the quantize
      after them.

    A tensor that reaches a grid sampler's grid input, directly or through quantize/dequantize
    nodes, keeps its N x H x W x 2 layout. Backends read the layout from each tensor's dim order:
    the Arm backend then needs no transpose at those boundaries, and etkit's grid sampler reads
    the strides. Running it again changes nothing. These layouts live only in the fake tensors:
    run ``pin_delegate_layouts`` after lowering so that ``to_executorch``'s re-trace keeps
    them."""
    marked: list[Node] = []
    for node in channels_last_nodes(graph_module):
        _mark(node, marked)
    for node in marked:
        logger.debug("channels-last: %s", node.name)
    return PassResult(graph_module, bool(marked))
