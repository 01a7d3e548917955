"""``affine_grid`` of a fixed size as elementwise ops on small tensors, for a CPU backend.

``F.affine_grid(theta, (N, C, H, W))`` is one ATen op in a captured program; lowering decomposes
it (``torch._decomp``) into a base grid built from ``linspace`` at run time (``arange``, ``lt``,
``where``, pads and adds: portable kernels) and a matrix product written as a broadcasting
multiply of an ``N x H*W x 3 x 2`` tensor and a ``sum`` over its third dimension (another
portable kernel, over the whole grid). In the STN tutorial's program at 64 x 1 x 28 x 28 on
XNNPACK those were 1.7 of its 10.9 ms, the ``sum`` alone 0.65 ms outside every delegate.

``affine_grids`` writes the same product as what it is per output channel ``j`` (x, then y)::

    grid[n, h, w, j] = (x[w] * theta[n, j, 0] + y[h] * theta[n, j, 1]) + theta[n, j, 2]

with ``x`` and ``y`` the base grid's coordinates (``1 x 1 x 1 x W`` and ``1 x 1 x H x 1``
constants, ``linspace`` as the decomposition makes them) and each ``theta[:, :, k]`` an
``N x 2 x 1 x 1`` slice: two multiplies of small tensors, two adds whose broadcasts run along
contiguous rows, and one permute of ``N x 2 x H x W`` into the ``N x H x W x 2`` grid. The
products and sums are the decomposition's (its base grid's third coordinate is 1, and its sum
adds the three products in order), so the grid is the decomposition's value; PyTorch's own
``affine_grid`` (a ``bmm``) may differ from both in the last bit. The reference a program is
verified against is the rewritten graph, so its coordinates are computed by the same float
operations as the program's.

Only for a fixed size (``torch.export`` specializes an ``affine_grid``'s size anyway) and a
float32 theta of ``N x 2 x 3``; the exporter applies it where the coordinate arithmetic stays
float on XNNPACK.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import coordinate_nodes, target_name, tensor_value
from etkit_quant.graph_constants import add_constant

_AFFINE_GRID = "aten::affine_grid_generator"


def _base(steps: int, align_corners: bool) -> torch.Tensor:
    """The base grid's coordinates along one dimension: the decomposition's own function."""
    from torch._decomp.decompositions import _linspace_from_neg_one

    value: torch.Tensor = _linspace_from_neg_one(
        steps, align_corners, torch.float32, torch.device("cpu")
    )
    return value


def _arguments(node: Node) -> tuple[Node, tuple[int, int, int, int], bool] | None:
    """``(theta, (N, C, H, W), align_corners)`` of an ``affine_grid_generator`` node this
    rewrite takes, else ``None``."""
    if target_name(node) != _AFFINE_GRID or node.kwargs or len(node.args) != 3:
        return None
    theta, size, align_corners = node.args
    if not isinstance(theta, Node) or not isinstance(align_corners, bool):
        return None
    if not isinstance(size, (list, tuple)) or len(size) != 4:
        return None
    sizes = [s for s in size if isinstance(s, int) and not isinstance(s, bool)]
    if len(sizes) != 4:
        return None  # symbolic sizes
    value = tensor_value(theta)
    if value is None or value.dtype != torch.float32 or tuple(value.shape) != (sizes[0], 2, 3):
        return None
    return theta, (sizes[0], sizes[1], sizes[2], sizes[3]), align_corners


def affine_grids(module: GraphModule) -> list[str]:
    """Rewrites each fixed-size 2-D ``affine_grid_generator`` of a float32 theta that is
    coordinate arithmetic (``graph.coordinate_nodes``: it leads only into grid samplers' grids)
    as the elementwise ops of the module docstring. Returns the names of the rewritten nodes. An
    ``affine_grid`` the program returns is left as it is: a quantizer takes that op (by its
    name) for coordinate arithmetic on its way out, not the ops it would become."""
    aten = torch.ops.aten
    graph = module.graph
    region = coordinate_nodes(module)
    rewritten: list[str] = []
    for node in list(graph.nodes):
        returned = any(user.op == "output" for user in node.users)
        found = _arguments(node) if node in region and not returned else None
        if found is None:
            continue
        theta, (n, _, height, width), align_corners = found
        xs = _base(width, align_corners).reshape(1, 1, 1, -1)
        ys = _base(height, align_corners).reshape(1, 1, -1, 1)
        with graph.inserting_before(node):
            x, y = add_constant(module, xs, node.name), add_constant(module, ys, node.name)
            column = []
            for k in range(3):  # theta[:, :, k], N x 2 x 1 x 1
                part = graph.call_function(aten.slice.Tensor, (theta, 2, k, k + 1))
                column.append(graph.call_function(aten.view.default, (part, [n, 2, 1, 1])))
            along_x = graph.call_function(aten.mul.Tensor, (x, column[0]))  # N x 2 x 1 x W
            along_y = graph.call_function(aten.mul.Tensor, (y, column[1]))  # N x 2 x H x 1
            planes = graph.call_function(aten.add.Tensor, (along_x, along_y))
            planes = graph.call_function(aten.add.Tensor, (planes, column[2]))
            grid = graph.call_function(aten.permute.default, (planes, [0, 2, 3, 1]))
        if "stack_trace" in node.meta:  # errors and reports name the model's line
            for made in (*column, along_x, along_y, planes, grid):
                made.meta["stack_trace"] = node.meta["stack_trace"]
        node.replace_all_uses_with(grid)
        graph.erase_node(node)
        rewritten.append(node.name)
    if rewritten:
        graph.eliminate_dead_code()
        module.recompile()
    return rewritten
