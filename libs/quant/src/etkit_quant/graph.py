"""Queries on FX graph nodes that every etkit library asks: is this node a quantize, a
dequantize, a grid sampler?

They match by operator name, not by object identity, so they hold in every dialect a node can be
in: the ATen graph of ``torch.export`` (``aten.grid_sampler_2d.default``,
``quantized_decomposed.quantize_per_tensor.default``) and ExecuTorch's edge dialect, whose
operators are wrappers with the same names.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Final

import torch
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


def attribute(module: torch.nn.Module, target: str) -> Any:
    """The object a ``get_attr`` target names in ``module`` (``"conv.weight"``: a dotted path
    through submodules)."""
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


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


def value_source(
    node: Node, moves: Callable[[Node], bool] = is_shape_op
) -> tuple[Node, list[Node]]:
    """The node whose values ``node`` holds, found through the ops that only move values
    (``moves``: the shape ops by default) from ``node`` up their first arguments, and those ops
    in the order passed (``node`` first). An op whose first argument is not a node ends the
    walk: it is the source."""
    passed: list[Node] = []
    while moves(node) and node.args and isinstance(node.args[0], Node):
        passed.append(node)
        node = node.args[0]
    return node, passed


def is_grid_sampler(node: Node) -> bool:
    """True for ``aten.grid_sampler`` and ``aten.grid_sampler_2d`` nodes (any overload)."""
    return target_name(node) in GRID_SAMPLER_TARGET_NAMES


# Operators that check, not compute: they read a tensor and produce nothing (torch.export writes
# ``_assert_tensor_metadata`` for a ``.to()`` call). As users they are ignored.
CHECK_OP_NAMES: Final = frozenset(
    {
        "aten::_assert_tensor_metadata",
        "aten::_assert_scalar",
        "aten::_assert_async",
        "aten::_assert_async.msg",
        "aten::sym_constrain_range",
        "aten::sym_constrain_range_for_size",
        "aten::_functional_assert_async.msg",
    }
)

# Coordinate arithmetic that is not elementwise (elementwise operators are recognized by
# PyTorch's ``pointwise`` tag): building base grids, moving, casting and combining coordinates.
_COORDINATE_OP_NAMES: Final = SHAPE_OP_NAMES | frozenset(
    {
        "aten::linspace",
        "aten::arange",
        "aten::arange.start",
        "aten::arange.start_step",
        "aten::zeros",
        "aten::ones",
        "aten::full",
        "aten::empty.memory_format",
        "aten::zeros_like",
        "aten::ones_like",
        "aten::full_like",
        "aten::empty_like",
        "aten::scalar_tensor",
        "aten::lift_fresh_copy",
        "aten::alias",
        "aten::alias_copy",
        "aten::detach",
        "aten::detach_",
        "aten::meshgrid",
        "aten::meshgrid.indexing",
        "aten::stack",
        "aten::cat",
        "aten::concat",
        "aten::split.Tensor",
        "aten::split_with_sizes",
        "aten::split_with_sizes_copy",
        "aten::unbind.int",
        "aten::unbind_copy.int",
        "aten::chunk",
        "aten::narrow",
        "aten::repeat",
        "aten::tile",
        "aten::flip",
        "aten::roll",
        "aten::constant_pad_nd",
        "aten::pad",
        "aten::index.Tensor",
        "aten::index_select",
        "aten::gather",
        "aten::fill_.Scalar",
        "aten::fill.Scalar",
        "aten::copy_",
        "aten::copy",
        "aten::_to_copy",
        "aten::to.dtype",
        "aten::to.dtype_layout",
        "aten::to.device",
        "aten::type_as",
        "aten::_unsafe_view",
        "aten::view_as",
        "aten::reshape_as",
        "aten::expand_as",
        "aten::movedim.int",
        "aten::unflatten.int",
        "aten::flatten.using_ints",
        "aten::affine_grid_generator",
    }
)

# Matrix products and matrix functions whose matrices are at most this wide (a 2 x 3 affine
# theta against homogeneous (x, y, 1) positions, a 3 x 3 homography) are coordinate transforms,
# not network layers.
COORDINATE_MATRIX_MAX: Final = 4
_MATRIX_OP_NAMES: Final = frozenset(
    {"aten::mm", "aten::bmm", "aten::matmul", "aten::einsum", "aten::linalg_vecdot"}
)
_SMALL_MATRIX_OP_NAMES: Final = frozenset(
    {
        "aten::inverse",
        "aten::linalg_inv",
        "aten::linalg_inv_ex",
        "aten::linalg_solve",
        "aten::_linalg_solve_ex",
        "aten::linalg_det",
        "aten::det",
        "aten::_linalg_det",
    }
)

# What ``compute_kind`` names: the network layers that never belong in the coordinate
# arithmetic (also in the ExecuTorch edge dialect, where linear is ``addmm`` or ``mm``).
_COMPUTE_KINDS: Final = (
    ("conv", ("conv", "_convolution")),
    ("linear", ("aten::linear", "aten::addmm", "aten::addmv", "aten::baddbmm")),
    ("matmul", ("aten::mm", "aten::bmm", "aten::matmul", "aten::einsum")),
    ("pooling", ("pool", "aten::mean", "aten::sum", "aten::amax", "aten::amin")),
    ("resize", ("upsample", "interpolate", "aten::grid_sampler", "aten::pixel_shuffle")),
    ("normalization", ("norm",)),
)


def compute_kind(node: Node) -> str | None:
    """The kind of compute-heavy operator ``node`` is: ``"conv"``, ``"linear"``, ``"matmul"``,
    ``"pooling"`` (pools and reductions), ``"resize"`` (interpolation, grid sampling),
    ``"normalization"``, or ``None`` for anything else (elementwise, shape, constants), in the
    ATen and edge dialects."""
    name = target_name(node)
    if not name:
        return None
    for kind, patterns in _COMPUTE_KINDS:
        if any(p in name if not p.startswith("aten::") else name.startswith(p) for p in patterns):
            return kind
    return None


def _op_name(node: Node) -> str:
    return target_name(node).removesuffix(".default")


def _tags(node: Node) -> tuple[object, ...]:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        target = getattr(target, "_op", target)  # an edge operator wraps an ATen one
    return tuple(getattr(target, "tags", ()))


def is_check(node: Node) -> bool:
    """True for an operator that checks a tensor and produces nothing
    (``_assert_tensor_metadata``, ``_assert_scalar``, ...)."""
    return _op_name(node) in CHECK_OP_NAMES or target_name(node) in CHECK_OP_NAMES


def mutated_input(node: Node) -> Node | None:
    """The tensor an in-place operator (``copy_``, ``fill_``, ``relu_``, ...) writes into, from
    its schema; ``None`` for any other node."""
    if node.op != "call_function":
        return None
    schema = getattr(node.target, "_schema", None)
    arguments = getattr(schema, "arguments", None)
    if not arguments or not node.args:
        return None
    alias = getattr(arguments[0], "alias_info", None)
    first = node.args[0]
    if alias is not None and getattr(alias, "is_write", False) and isinstance(first, Node):
        return first
    return None


def _matrix_width(value: object) -> int:
    shape = getattr(value, "shape", None)
    return max((int(d) for d in shape[-2:]), default=0) if shape is not None else 0


def _contraction(node: Node) -> int | None:
    """The contracted dimension of a matrix product, from its first operand (``None`` when
    unknown)."""
    first = node.args[0] if node.args else None
    value = first.meta.get("val") if isinstance(first, Node) else None
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    return int(shape[-1])


def is_coordinate_op(node: Node) -> bool:
    """True for an operator that can be coordinate arithmetic: elementwise (PyTorch's
    ``pointwise`` tag), shape and copy ops, dtype casts, constants and base grids (``linspace``,
    ``arange``, ``meshgrid``, ``stack``, ``cat``), ``affine_grid``, and matrix products or
    inverses of matrices at most ``COORDINATE_MATRIX_MAX`` wide (an affine theta applied to
    homogeneous positions, a homography). Convolutions, linear layers, wider matrix products,
    pooling, reductions, interpolation and anything else are network layers (see
    ``compute_kind``)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    name = _op_name(node)
    if not name:
        return False
    if name in _COORDINATE_OP_NAMES or target_name(node) in _COORDINATE_OP_NAMES:
        return True
    if is_check(node):
        return True
    if name in _MATRIX_OP_NAMES:
        width = _contraction(node)
        return width is not None and width <= COORDINATE_MATRIX_MAX
    if name in _SMALL_MATRIX_OP_NAMES:
        first = node.args[0] if node.args else None
        value = first.meta.get("val") if isinstance(first, Node) else None
        return 0 < _matrix_width(value) <= COORDINATE_MATRIX_MAX
    return any(getattr(tag, "name", "") == "pointwise" for tag in _tags(node))


def grid_position_nodes(model: GraphModule, *, include_inputs: bool = False) -> set[Node]:
    """The grid-position subgraph: nodes all of whose uses lead, through any chain of ops, only
    into grid samplers' grid inputs. A node that also feeds anything else (or a grid sampler's
    image) is not in it. Graph inputs are included with ``include_inputs``.

    The chain is followed through checks that produce nothing (``_assert_tensor_metadata``,
    ignored as users) and through in-place writes: an in-place op whose result is unused
    (``buffer[..., 0].copy_(x)``) belongs with the tensor it writes into, and that tensor's
    remaining uses decide."""
    return _reaching_only_grids(model, include_inputs, lambda node: True)


def coordinate_nodes(model: GraphModule) -> set[Node]:
    """The coordinate arithmetic: the grid-position nodes (see ``grid_position_nodes``) between
    the last compute-heavy op and a grid sampler's grid input. A node is in it when it is
    coordinate arithmetic (``is_coordinate_op``: elementwise, shape, cast, constant, base grid,
    ``affine_grid``, a product of matrices at most 4 wide) and all its uses lead only into this
    set or into grid samplers' grid inputs. The layers that predict a flow or a theta (convs,
    linear layers, pooling, resizing) and everything before them are outside it, and so is the
    tensor they hand it (see ``coordinate_inputs``). Graph inputs are never in it."""
    return _reaching_only_grids(model, False, is_coordinate_op)


def coordinate_inputs(model: GraphModule, region: set[Node] | None = None) -> list[Node]:
    """The tensors that enter the coordinate arithmetic ``region`` (``coordinate_nodes`` when
    ``None``) from outside it: a predicted flow, a theta, a coordinate map given as a graph
    input; in graph order. Parameters and constants (``get_attr``) are left out."""
    region = coordinate_nodes(model) if region is None else region
    entering: dict[Node, None] = {}
    for node in model.graph.nodes:
        if node not in region:
            continue
        for source in node.all_input_nodes:
            if source not in region and source.op in ("call_function", "placeholder"):
                value = source.meta.get("val")
                if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
                    entering[source] = None
    order = {n: k for k, n in enumerate(model.graph.nodes)}
    return sorted(entering, key=order.__getitem__)


def graph_inputs_feeding_only(model: GraphModule, region: set[Node]) -> list[Node]:
    """The graph inputs all of whose uses lead only into ``region`` or straight into grid
    samplers' grid inputs (through in-place writes and checks, as ``grid_position_nodes``
    follows them), in graph order. ``gather_positions.coordinate_graph_inputs`` gives it the
    coordinate arithmetic and the index gathers' positions."""
    found = []
    for node in model.graph.nodes:
        if node.op != "placeholder":
            continue
        users = _effective_users(node)
        if users and all(_only_feeds_grid(node, u, region) for u in users):
            found.append(node)
    return found


def _reaching_only_grids(
    model: GraphModule, include_inputs: bool, admit: Callable[[Node], bool]
) -> set[Node]:
    skipped = ("output", "get_attr") if include_inputs else ("output", "get_attr", "placeholder")
    nodes = list(reversed(model.graph.nodes))
    found: set[Node] = set()
    changed = True
    while changed:  # an in-place write depends on the tensor it writes, made earlier
        changed = False
        for node in nodes:
            if node in found or node.op in skipped or is_check(node) or not admit(node):
                continue
            users = _effective_users(node)
            if users:
                member = all(_only_feeds_grid(node, u, found) for u in users)
            else:
                root = _written_tensor(node)  # a value used only to write into another
                member = root is not None and root in found
            if member:
                found.add(node)
                changed = True
    return found


_VIEW_OP_NAMES: Final = frozenset(
    {
        "aten::view",
        "aten::reshape",
        "aten::permute",
        "aten::transpose.int",
        "aten::t",
        "aten::squeeze",
        "aten::squeeze.dim",
        "aten::squeeze.dims",
        "aten::unsqueeze",
        "aten::expand",
        "aten::slice.Tensor",
        "aten::select.int",
        "aten::narrow",
        "aten::as_strided",
        "aten::diagonal",
        "aten::unflatten.int",
        "aten::movedim.int",
        "aten::alias",
        "aten::detach",
    }
)


def _is_view(node: Node) -> bool:
    return _op_name(node) in _VIEW_OP_NAMES


def _effective_users(node: Node) -> list[Node]:
    """``node``'s users that read its value: not checks, and not in-place writes into it (or
    views of it) whose results are unused."""
    return [u for u in node.users if not is_check(u) and not _writes_into(u, node)]


def _writes_into(user: Node, node: Node) -> bool:
    """Whether ``user`` only writes into ``node``: an unused in-place write into it, or a view
    of it used only to be written into. The cheap tests come first: only an in-place op or a
    view looks at its own users, so the recursion is as deep as a chain of views, not as the
    graph (RAFT-small's graph was deeper than Python's recursion limit)."""
    writes = mutated_input(user) is node
    if not writes and not (
        _is_view(user) and bool(user.args) and user.args[0] is node and bool(user.users)
    ):
        return False
    return not _effective_users(user)


def _written_tensor(node: Node) -> Node | None:
    """For a node whose value serves only to write into another tensor (an unused in-place
    write; a view only written into), the tensor written, through views; else ``None``."""
    target = mutated_input(node)
    if target is None:
        if not (_is_view(node) and node.users and isinstance(node.args[0], Node)):
            return None
        target = node.args[0]
    while _is_view(target) and not _effective_users(target) and isinstance(target.args[0], Node):
        target = target.args[0]
    return target


def tensor_value(node: object) -> torch.Tensor | None:
    """The (fake) tensor a node's ``meta["val"]`` holds; ``None`` for anything else."""
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def is_grid_shaped(node: Node) -> bool:
    """Whether ``node``'s value is shaped like a sampling grid: a floating-point N x H x W x 2
    tensor (``grid_sample``'s grid layout)."""
    value = node.meta.get("val")
    return (
        isinstance(value, torch.Tensor)
        and value.dtype.is_floating_point
        and value.dim() == 4
        and int(value.shape[-1]) == 2
    )


def _is_affine_grid(node: Node) -> bool:
    """Whether ``node`` is an ``affine_grid``'s result (``affine_grid_generator``), through
    shape ops: a sampling grid by construction. (A grid-shaped output in general is not: an
    image 2 pixels wide is N x C x H x 2.)"""
    while node.op == "call_function" and _is_view(node) and node.args:
        source = node.args[0]
        if not isinstance(source, Node):
            return False
        node = source
    return is_grid_shaped(node) and _op_name(node) == "aten::affine_grid_generator"


def _only_feeds_grid(node: Node, user: Node, positions: set[Node]) -> bool:
    if user in positions:
        return True
    if user.op == "output":  # a grid the program returns: an affine_grid's, as it is
        return _is_affine_grid(node)
    if is_grid_sampler(user):
        image = user.args[0]
        return len(user.args) > 1 and user.args[1] is node and image is not node
    return False
