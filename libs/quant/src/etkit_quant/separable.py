"""``separate``: a constant that is a sum of a row and a column, held as the two.

A pixel grid (``meshgrid`` of ``linspace`` rows and columns, stacked: the x channel varies
along the width only, the y channel along the height only) is H x W x 2 values that a program
of several sizes would hold once per size, or compute with copies (``expand_copy`` then
``stack``). Held as a row ``A`` (1 x W x 2: the x channel, 0 in y) and a column ``B`` (H x 1 x
2: the y channel, 0 in x), the grid is ``A + B`` exactly (each value is ``v + 0``), and a grid
added to a flow, ``grid + flow``, is ``(flow + A) + B`` exactly: two broadcasting adds, no
plane-sized constant and no copy. ``normalize.fold_constants`` uses it for a constant over its
size limit.

A program of dynamic sizes computes its grid (``arange`` of the input's size): there the
broadcast is in the graph, ``stack([expand(row), expand(column)], -1)``, and
``separate_broadcast_stacks`` stacks the row and the column each with zeros instead, no copy of
a plane, added to the flow the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.fx import GraphModule, Node


def separate(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(a, b)`` with ``a + b`` equal to ``value`` bit for bit and each of them broadcast along
    one of two axes of ``value`` (size 1 there), where every value is ``v + 0`` (each fiber of
    ``value`` along the two axes varies along one of them only, the other term is 0 there);
    ``None`` when ``value`` (floating point, at least 2-D) has no such pair of axes. Of several
    pairs, the one whose terms hold the fewest values."""
    if not value.dtype.is_floating_point or value.dim() < 2 or not torch.isfinite(value).all():
        return None
    best: tuple[torch.Tensor, torch.Tensor] | None = None
    sizes = value.shape
    for i in range(value.dim()):
        for j in range(i + 1, value.dim()):
            if sizes[i] < 2 or sizes[j] < 2:
                continue
            terms = _separate_along(value, i, j)
            if terms is not None and (
                best is None
                or terms[0].numel() + terms[1].numel() < best[0].numel() + best[1].numel()
            ):
                best = terms
    return best


def _separate_along(
    value: torch.Tensor, i: int, j: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    first_i, first_j = value.narrow(i, 0, 1), value.narrow(j, 0, 1)
    along_j = (value == first_i).all(dim=i, keepdim=True).all(dim=j, keepdim=True)  # no i
    along_i = (value == first_j).all(dim=i, keepdim=True).all(dim=j, keepdim=True)  # no j
    if not bool((along_j | along_i).all()):
        return None
    zero = torch.zeros((), dtype=value.dtype)
    a = torch.where(along_j, first_i, zero)  # varies along j only (size 1 along i)
    b = torch.where(along_j, zero, first_j)  # varies along i only (size 1 along j)
    if not torch.equal(a + b, value):
        return None
    return a.contiguous(), b.contiguous()


def other_addend(user: Node, node: Node) -> Node | None:
    """``x`` of a reader ``node + x`` (or ``x + node``) whose result has ``node``'s shape and
    dtype (no broadcast of ``node``, no ``alpha``); ``None`` for any other reader."""
    if user.target is not torch.ops.aten.add.Tensor or user.kwargs or len(user.args) != 2:
        return None
    a, b = user.args
    other = b if a is node else a if b is node else None
    if not isinstance(other, Node) or other is node:
        return None
    mine, result = node.meta.get("val"), user.meta.get("val")
    if not isinstance(mine, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None
    return other if (mine.shape, mine.dtype) == (result.shape, result.dtype) else None


def column_on_rows(column: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(y, mask)`` whose product ``y * mask`` is ``column`` broadcast to ``width`` with its last
    two dimensions flattened (``... x H x (width * C)``), for a column ``... x H x 1 x C`` (C of
    2 to 4: a point's coordinates) whose values lie in one of its C channels (a pixel grid's y):
    ``y`` is that channel (``... x H x 1``), ``mask`` 1 at that channel's places and 0 elsewhere
    (``1 x ... x 1 x (width * C)``); ``None`` for any other column.

    Why: XNNPACK adds a column broadcast across the width with a C-value inner block one block
    at a time (the pixel grid's y at 544 x 960: 1.58 ms, a whole plane 0.34 ms); ``y * mask``
    and an add of the same shape go a whole row at a time (in isolation: 2.22 ms against the
    column's 4.57 and the plane's 1.77, outputs equal). Where the column is 0, ``y * 0`` is 0 or
    -0: the same number, so a sum with it is the same number (a -0 where the column gave +0 is
    possible only where that sum is zero)."""
    if column.dim() < 3 or column.shape[-2] != 1 or not 2 <= column.shape[-1] <= 4:
        return None
    channels = column.shape[-1]
    holding = [c for c in range(channels) if bool((column[..., c] != 0).any())]
    if len(holding) != 1:
        return None
    (c,) = holding
    y = column[..., 0, c : c + 1].contiguous()
    mask = torch.zeros(width * channels, dtype=column.dtype)
    mask[c::channels] = 1
    return y, mask.reshape(*([1] * (column.dim() - 2)), width * channels)


def add_where_read(
    module: GraphModule, node: Node, terms: Sequence[Node], rows: tuple[Node, Node] | None = None
) -> None:
    """Replaces ``node`` by the sum of ``terms`` (equal to it bit for bit, each value one term's
    plus zeros) where it is read: a reader ``node + x`` of ``node``'s shape becomes
    ``(x + terms[0]) + terms[1] ...``, any other reader reads ``terms[0] + terms[1] ...``.
    ``rows``: ``(y, mask)`` of ``column_on_rows`` for a last term (a column) added on the rows
    flattened, ``reshape(reshape(total, ... x H x W*C) + y * mask, node's shape)``."""
    aten = torch.ops.aten
    shape = list(node.meta["val"].shape) if rows is not None else []
    for user in list(node.users):
        other = other_addend(user, node)
        with module.graph.inserting_before(user):
            total = other if other is not None else terms[0]
            made = []
            for term in terms if other is not None else terms[1:]:
                total = module.graph.call_function(aten.add.Tensor, (total, term))
                made.append(total)
            if rows is not None:
                call = module.graph.call_function
                column = call(aten.mul.Tensor, rows)
                made.append(column)
                if other is None:  # a plane for the reader: the row plus the column
                    made.append(column := call(aten.reshape.default, (column, shape)))
                    made.append(total := call(aten.add.Tensor, (total, column)))
                else:  # on the rows flattened, then back to the node's shape
                    flat = [*shape[:-2], shape[-2] * shape[-1]]
                    made.append(total := call(aten.reshape.default, (total, flat)))
                    made.append(total := call(aten.add.Tensor, (total, column)))
                    made.append(total := call(aten.reshape.default, (total, shape)))
            for new in made:
                new.meta["stack_trace"] = node.meta.get("stack_trace")
        if other is not None:
            total.meta.update(user.meta)
            user.replace_all_uses_with(total)
            module.graph.erase_node(user)
        else:
            total.meta["val"] = node.meta.get("val")
            user.replace_input_with(node, total)


def _broadcast_source(tensor: object) -> Node | None:
    """``x`` of ``expand(x, shape)`` where ``x`` has the result's rank (size 1 where it is
    broadcast) and a floating dtype, read by nothing else."""
    if not isinstance(tensor, Node) or tensor.target is not torch.ops.aten.expand.default:
        return None
    source, value = tensor.args[0], tensor.meta.get("val")
    if not isinstance(source, Node) or len(tensor.users) != 1:
        return None
    before = source.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    if before.dim() != value.dim() or not before.dtype.is_floating_point:
        return None
    return source


def separate_broadcast_stacks(module: GraphModule) -> list[str]:
    """Rewrites each ``stack([expand(a), expand(b), ...], dim)`` (every operand a broadcast of a
    tensor of the same rank) into the sum of ``stack`` s of each operand unexpanded with zeros
    in the others' places: ``stack([a, 0], d) + stack([0, b], d)``, equal bit for bit (each
    value is ``v + 0``). A reader ``stack + x`` becomes ``(x + term_a) + term_b``; any other
    reads the sum. Returns the names of the stacks rewritten (the graph is recompiled)."""
    aten = torch.ops.aten
    rewritten: list[str] = []
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not aten.stack.default:
            continue
        operands = node.args[0]
        if not isinstance(operands, (list, tuple)) or len(operands) < 2:
            continue
        sources = [_broadcast_source(t) for t in operands]
        if any(s is None for s in sources):
            continue
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        with module.graph.inserting_before(node):
            zeros = [module.graph.call_function(aten.zeros_like.default, (s,)) for s in sources]
            terms = [
                module.graph.call_function(
                    aten.stack.default,
                    ([s if j == k else zeros[k] for j in range(len(sources))], dim),
                )
                for k, s in enumerate(sources)
            ]
        add_where_read(module, node, terms)
        rewritten.append(node.name)
    if rewritten:
        module.graph.eliminate_dead_code()
        module.recompile()
    return rewritten
