"""Per-channel coordinate arithmetic written as slices, one op each, and a ``cat``, as one op.

RIFE's warp (and the flow warps written after it: IFRNet, FILM's) converts a pixel flow to grid
units channel by channel::

    torch.cat([flow[:, 0:1] / ((w - 1) / 2), flow[:, 1:2] / ((h - 1) / 2)], 1)

On a CPU backend that is a strided copy per channel slice, the op on each, and a copy into the
``cat``, all on full-size float tensors. ``channel_ops_of_slices`` computes it as the op on the
tensor (or on the slice of all the channels involved) with a per-channel constant
(``flow / c``, ``c = [(w - 1) / 2, (h - 1) / 2]`` shaped ``1 x 2 x 1 x 1``): bit for bit the same
values, since each element meets its own channel's number either way (the number as the
tensor's dtype, as PyTorch applies a Python number to a tensor).

Only in the coordinate arithmetic (``graph.coordinate_nodes``), which a quantizer leaves in float
when the grid math is float: elsewhere the constant would be quantized as an operand where the
numbers were not.
"""

from __future__ import annotations

from typing import Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import coordinate_nodes, target_name, tensor_value
from etkit_quant.graph_constants import add_constant

_OPS: Final = frozenset(
    {"aten::div.Tensor", "aten::mul.Tensor", "aten::add.Tensor", "aten::sub.Tensor"}
)


def _slice_bounds(node: Node, dim: int) -> tuple[Node, int, int] | None:
    """``(source, start, end)`` of ``aten.slice.Tensor(source, dim, start, end, 1)`` along
    ``dim`` (bounds made non-negative and clipped as slicing does), else ``None``."""
    if target_name(node) != "aten::slice.Tensor" or node.kwargs:
        return None
    source, *rest = node.args
    source_value = tensor_value(source)
    if not isinstance(source, Node) or source_value is None:
        return None
    if len(rest) > 4:
        return None
    defaults: tuple[object, ...] = (0, None, None, 1)
    full = (*rest, *defaults[len(rest) :])
    slice_dim, start, end, step = full[0], full[1], full[2], full[3]
    if not isinstance(slice_dim, int) or step != 1:
        return None
    rank = source_value.dim()
    if slice_dim % rank != dim:
        return None
    size = int(source_value.shape[dim])
    bounds = []
    for bound, default in ((start, 0), (end, size)):
        if bound is None:
            bound = default
        if not isinstance(bound, int):
            return None  # a symbolic bound
        bound = bound + size if bound < 0 else bound
        bounds.append(min(max(bound, 0), size))
    return source, bounds[0], bounds[1]


def channel_ops_of_slices(module: GraphModule) -> list[str]:
    """Rewrites each ``cat`` of the coordinate arithmetic whose inputs are one elementwise op
    (``div``, ``mul``, ``add``, ``sub``: the same for all) of a number and a slice each, the
    slices consecutive along the ``cat``'s dimension of one floating-point tensor and read by
    nothing else, into that op of the slice they cover (the tensor itself when they cover it)
    and a constant holding each slice's number along that dimension. Returns the names of the
    ``cat`` s rewritten."""
    region = coordinate_nodes(module)
    rewritten: list[str] = []
    for cat in list(module.graph.nodes):
        if cat not in region or target_name(cat) != "aten::cat" or cat.kwargs:
            continue
        result = tensor_value(cat)
        inputs = cat.args[0]
        if result is None or not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
            continue
        dim = cat.args[1] if len(cat.args) > 1 else 0
        if not isinstance(dim, int) or result.dim() == 0:
            continue
        dim %= result.dim()
        parts = _parts(inputs, dim, result.dtype)
        if parts is None:
            continue
        op, source, ranges = parts
        start, end = ranges[0][0], ranges[-1][1]
        shape = [1] * result.dim()
        shape[dim] = end - start
        per_index = [number for first, last, number in ranges for _ in range(last - first)]
        constant = torch.tensor(per_index, dtype=result.dtype).reshape(shape)
        with module.graph.inserting_before(cat):
            operand: Node = source
            source_value = tensor_value(source)
            assert source_value is not None
            if (start, end) != (0, int(source_value.shape[dim])):
                operand = module.graph.call_function(
                    torch.ops.aten.slice.Tensor, (source, dim, start, end)
                )
                operand.meta["val"] = source_value.narrow(dim, start, end - start)
            constant_node = add_constant(module, constant, cat.name)
            target = op.target
            assert callable(target)
            merged = module.graph.call_function(target, (operand, constant_node))
        merged.meta = dict(cat.meta)
        cat.replace_all_uses_with(merged)
        module.graph.erase_node(cat)
        for node in inputs:
            sliced = node.args[0]
            module.graph.erase_node(node)
            if isinstance(sliced, Node) and not sliced.users:
                module.graph.erase_node(sliced)
        rewritten.append(cat.name)
    if rewritten:
        module.recompile()
    return rewritten


def _parts(
    inputs: list[object] | tuple[object, ...], dim: int, dtype: torch.dtype
) -> tuple[Node, Node, list[tuple[int, int, float]]] | None:
    """The op, the sliced tensor and each input's ``(start, end, number)``, when ``inputs`` is
    such a list; else ``None``."""
    if not dtype.is_floating_point:
        return None
    op: Node | None = None
    source: Node | None = None
    ranges: list[tuple[int, int, float]] = []
    for node in inputs:
        if not isinstance(node, Node) or len(node.users) != 1:
            return None
        name = target_name(node)
        if name not in _OPS or node.kwargs or len(node.args) != 2:
            return None
        if op is not None and node.target != op.target:
            return None
        sliced, number = node.args
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            return None
        if not isinstance(sliced, Node) or len(sliced.users) != 1:
            return None
        bounds = _slice_bounds(sliced, dim)
        value = tensor_value(node)
        if bounds is None or value is None or value.dtype != dtype:
            return None
        if source is not None and bounds[0] is not source:
            return None
        source_value = tensor_value(bounds[0])
        if source_value is None or source_value.dtype != dtype:
            return None
        if ranges and ranges[-1][1] != bounds[1]:
            return None  # not consecutive
        if bounds[2] <= bounds[1]:
            return None  # empty
        op, source = node, bounds[0]
        ranges.append((bounds[1], bounds[2], float(number)))
    if op is None or source is None:
        return None
    return op, source, ranges
