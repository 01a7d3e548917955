"""``normalize_program``: makes a library-built ATen graph look like a hand-written one before a
quantizer sees it.

Libraries such as kornia compute their sampling grids with code written for eager PyTorch: the
matrix inverse of a fixed transform element by element, in-place writes into freshly made
tensors, ``.to()`` calls that change nothing, factors like ``2 / (W - 1)`` as 0-dim tensors.
``torch.export`` records all of it, and the quantizers and backends downstream trip over it
(see the docs' "Known upstream issues", ``docs/explanation/upstream-issues.md``). Each step
below changes the graph, never what it computes (each is tested for exact equality on the float
model):

- ``functionalize``: in-place ops (``copy_``, ``add_``, ``mul_``, ...) become their functional
  forms (``torch.export``'s own functionalization, no decomposition) when one writes a value
  another node can see (a view's base, a buffer);
- ``functional_activations``: an in-place op on a fresh tensor only it reads (a hand-written
  ``relu(inplace=True)``) takes its functional overload in place, and nothing else changes.
  The quantizers' patterns name the functional ops: ExecuTorch 1.5.1's XNNPACK quantizer
  leaves ``relu_`` unannotated, its input and output get different quantization parameters,
  and XNNPACK's int8 clamp then reads one as the other (the STN tutorial's localization net
  came out 8.5 dB from the quantized model);
- ``adaptive_max_pools``: an ``adaptive_max_pool2d`` whose output sizes divide its input sizes
  becomes the ``max_pool2d`` it equals (kernel and stride the quotients: the adaptive windows
  are then those tiles; ``max_pool2d_with_indices`` where its indices are read). ExecuTorch
  1.5.1 refuses ``adaptive_max_pool2d`` on both targets (not a Core ATen op, and torch has no
  decomposition of it), and its quantizers annotate ``max_pool2d``;
- ``drop_dead_code``: ops whose result nothing reads (a branch a model computes and drops:
  ``torch.export`` keeps it) leave the graph, pure ops only. A dead grid sampler of an input
  that a conv also reads gave that input two quantizes, which ExecuTorch 1.5.1's
  ``QuantizeInputs`` refuses ("Input 0 has more than one users");
- ``drop_metadata_asserts``: ``aten._assert_tensor_metadata`` nodes (what ``.to()`` leaves)
  are removed, and ``.to()`` conversions that change neither dtype nor device are bypassed;
- ``drop_noop_views``: ops whose result is their input unchanged (``x[:, 0:C]`` of a C-channel
  tensor, which ``torch.export`` records as an ``alias``; a ``clone``; a view or reshape to the
  input's own shape) are bypassed. A partition whose outputs include such an alias of another
  of its outputs is lowered by ExecuTorch 1.5.1's Arm backend with the alias removed: two VGF
  outputs of one tensor, one of which the VGF never writes (a fuzzer find: zeros read as the
  program's value, 17.5 dB);
- ``slices_of_cat``: a slice of a ``cat`` that lies within one of its inputs reads that input
  (and a ``cat`` nothing else reads leaves the graph): a VGF in which a grid sampler's output
  only reached a ``cat`` sliced so was 15 dB from the quantized model (the fuzzer's seed 2786);
- ``fold_constants``: every subgraph that depends on no graph input (a fixed matrix's inverse, a
  base grid, a constant grid) is computed once and becomes one constant;
- ``merge_duplicates``: nodes that compute the same op on the same arguments, from the
  graph's inputs, become one (common subexpression elimination; random ops excepted; two
  constants holding equal values count as the same argument, but stay two constants).
  ExecuTorch 1.5.1's Arm backend merges such twins after partitioning
  (``FuseDuplicateUsersPass``), and a VGF whose outputs were both twins writes one of them: the
  next delegate read zeros (the fuzzer's seed 2224, ``sigmoid(x)`` computed twice: -36 dB;
  class P, RIFE's ``warp()`` building one flow's sampling grid twice from two base grids);
- ``tensor_scalars``: a scalar op (``eq.Scalar``, ``add.Scalar``, ...) on a 0-dim tensor becomes
  its tensor form with a 0-dim constant (ExecuTorch's Arm quantizer turns the scalar into a
  1-element tensor of shape [1], which changes the result's shape);
- ``promoted_constants``: an integer constant meeting a float tensor in an elementwise op
  becomes the float constant type promotion computes with (``etkit_quant.normalize_promotions``);
- ``ranked_scalar_constants``: a 0-dim constant meeting a tensor of rank r in an elementwise op
  becomes a constant of shape [1] * r (ExecuTorch's XNNPACK lowering indexes every quantized
  constant's first dimension).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from etkit_quant.affine_grids import affine_grids as affine_grids_rewrite
from etkit_quant.channel_ops import channel_ops_of_slices
from etkit_quant.graph import attribute, target_name, tensor_value
from etkit_quant.graph_constants import BROADCASTING_OPS, add_constant
from etkit_quant.normalize_promotions import promoted_constants
from etkit_quant.separable import (
    add_where_read,
    column_on_rows,
    separate,
    separate_broadcast_stacks,
)

logger = logging.getLogger(__name__)

aten = torch.ops.aten

# A folded constant larger than this stays computed in the graph: folding must not bloat the
# program (a coordinate grid of 1024 x 1024 positions is 2 M values).
MAX_FOLDED_ELEMENTS: Final = 1 << 22

_METADATA_ASSERTS: Final = frozenset(
    {"aten::_assert_tensor_metadata", "aten::_assert_tensor_metadata.default"}
)
_CONVERSIONS: Final = frozenset(
    {
        "aten::to.dtype",
        "aten::to.device",
        "aten::to.dtype_layout",
        "aten::to.other",
        "aten::_to_copy",
        "aten::_to_copy.default",
        "aten::type_as",
        "aten::type_as.default",
    }
)
# Scalar overloads whose tensor form takes the same arguments with a tensor in place of the
# scalar; ExecuTorch's Arm quantizer replaces exactly these (ReplaceScalarWithTensorByProfilePass).
_SCALAR_TO_TENSOR: Final[dict[Any, Any]] = {
    aten.add.Scalar: aten.add.Tensor,
    aten.sub.Scalar: aten.sub.Tensor,
    aten.mul.Scalar: aten.mul.Tensor,
    aten.div.Scalar: aten.div.Tensor,
    aten.eq.Scalar: aten.eq.Tensor,
    aten.ne.Scalar: aten.ne.Tensor,
    aten.gt.Scalar: aten.gt.Tensor,
    aten.ge.Scalar: aten.ge.Tensor,
    aten.lt.Scalar: aten.lt.Tensor,
    aten.le.Scalar: aten.le.Tensor,
    aten.remainder.Scalar: aten.remainder.Tensor,
    aten.bitwise_and.Scalar: aten.bitwise_and.Tensor,
    aten.bitwise_or.Scalar: aten.bitwise_or.Tensor,
    aten.bitwise_xor.Scalar: aten.bitwise_xor.Tensor,
}
# Tensor overloads that also take a number as their second operand (``x + 2.0``); the Arm
# backend's passes turn those into the scalar overloads above.
_SCALAR_OPERAND_TENSOR_OPS: Final = frozenset(
    {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor}
)


@dataclass
class NormalizationReport:
    """What ``normalize_program`` changed: a count per step (``steps``), and the names of the
    nodes each step folded, dropped or rewrote (``nodes``)."""

    steps: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, list[str]] = field(default_factory=dict)

    def record(self, step: str, names: Sequence[str]) -> None:
        self.steps[step] = self.steps.get(step, 0) + len(names)
        self.nodes.setdefault(step, []).extend(names)

    @property
    def changed(self) -> bool:
        return any(self.steps.values())

    def summary(self) -> str:
        done = [f"{step} {count}" for step, count in self.steps.items() if count]
        return ", ".join(done) if done else "nothing to normalize"


def normalize_program(
    program: ExportedProgram,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    dynamic_shapes: Any = None,
    max_folded_elements: int = MAX_FOLDED_ELEMENTS,
    channel_ops: bool = False,
    affine_grids: bool = False,
) -> tuple[ExportedProgram, NormalizationReport]:
    """``program`` normalized (the module's steps, in order) and exported again on
    ``example_inputs`` (with ``dynamic_shapes``, ``torch.export``'s, for a program exported with
    dynamic dimensions), with what changed; ``fold_constants`` folds results of at most
    ``max_folded_elements`` values; ``channel_ops`` (for a program whose coordinate arithmetic
    stays float) rewrites its per-channel ops of slices (``channel_ops.channel_ops_of_slices``);
    ``affine_grids`` (the same, for a CPU backend) its fixed-size ``affine_grid`` as
    elementwise ops on small tensors (``affine_grids.affine_grids``).
    A program with nothing to normalize is returned as it is.
    Raises ``TypeError`` for a ``program`` that is not an ``ExportedProgram`` or inputs that
    are not a tuple of tensors."""
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"program must be a torch.export.ExportedProgram, got {type(program).__name__}"
        )
    if not isinstance(example_inputs, tuple) or not all(
        isinstance(x, torch.Tensor) for x in example_inputs
    ):
        raise TypeError("example_inputs must be the tuple of tensors the program was exported with")
    report = NormalizationReport()
    mutating = [n.name for n in program.graph.nodes if _mutates(n) and not _writes_own_value(n)]
    if mutating:
        program = program.run_decompositions({})  # functionalization only: decomposes nothing
    report.record("functionalize", mutating)
    module: GraphModule = program.module(check_guards=False)
    report.record("drop_dead_code", drop_dead_code(module))
    report.record("functional_activations", functional_activations(module))
    report.record("adaptive_max_pools", adaptive_max_pools(module))
    report.record("drop_metadata_asserts", drop_metadata_asserts(module))
    report.record("drop_noop_views", drop_noop_views(module))
    report.record("slices_of_cat", slices_of_cat(module))
    if channel_ops:
        report.record("channel_ops_of_slices", channel_ops_of_slices(module))
    report.record("fold_constants", fold_constants(module, max_folded_elements))
    if dynamic_shapes is not None:  # (a one-size program's grid is folded: fold_constants)
        report.record("broadcast_stacks", separate_broadcast_stacks(module))
    report.record("merge_duplicates", merge_duplicates(module))
    report.record("tensor_scalars", tensor_scalars(module))
    report.record("promoted_constants", promoted_constants(module))
    report.record("ranked_scalar_constants", ranked_scalar_constants(module))
    if affine_grids:
        report.record("affine_grids", affine_grids_rewrite(module))
    if not report.changed:
        return program, report
    module.graph.eliminate_dead_code()
    module.recompile()
    normalized = torch.export.export(
        module, example_inputs, dynamic_shapes=dynamic_shapes, strict=False
    )
    logger.info("normalized the graph: %s", report.summary())
    return normalized, report


def _mutates(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and bool(schema.is_mutable)


def _writes_own_value(node: Node) -> bool:
    """Whether an in-place op writes a value nothing else can see: a fresh tensor (not an
    input, a buffer or a view of another tensor) that only this op reads, as a hand-written
    ``relu(inplace=True)`` does. Such ops need no functionalization: ``functional_activations``
    gives them their functional overload."""
    target = node.args[0] if node.args else None
    if not isinstance(target, Node) or target.op != "call_function" or len(target.users) != 1:
        return False
    schema = getattr(target.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return all(r.alias_info is None for r in schema.returns)


def _functional_overload(node: Node) -> Any | None:
    """The functional form of an in-place ATen op (``aten.relu_.default`` ->
    ``aten.relu.default``), or ``None`` where there is none with the same arguments."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.name.startswith("aten::"):
        return None
    packet_name = schema.name.split("::")[-1]
    if not packet_name.endswith("_"):
        return None
    packet = getattr(aten, packet_name[:-1], None)
    overload = getattr(packet, schema.overload_name or "default", None)
    functional = getattr(overload, "_schema", None)
    if functional is None or functional.is_mutable:
        return None
    if [a.name for a in functional.arguments] != [a.name for a in schema.arguments]:
        return None
    return overload


def functional_activations(module: GraphModule) -> list[str]:
    """Gives each in-place op that writes a value only it reads (see ``_writes_own_value``)
    its functional overload: the same value, in the form the quantizers' patterns match.
    Returns the names of the rewritten nodes."""
    rewritten: list[str] = []
    for node in module.graph.nodes:
        if not _mutates(node) or not _writes_own_value(node):
            continue
        functional = _functional_overload(node)
        if functional is not None:
            node.target = functional
            rewritten.append(node.name)
    return rewritten


def adaptive_max_pools(module: GraphModule) -> list[str]:
    """Rewrites each ``adaptive_max_pool2d`` whose output sizes divide its input's last two sizes
    as ``max_pool2d`` with kernel and stride the quotients (the same windows, so the same values;
    ``max_pool2d_with_indices``, whose indices are the same flat positions, where the indices are
    read). Others stay: no ``max_pool2d`` computes windows of different sizes. Returns the names
    of the pools rewritten."""
    changed: list[str] = []
    graph = module.graph
    for node in list(graph.nodes):
        if target_name(node) != "aten::adaptive_max_pool2d" or len(node.args) < 2:
            continue
        source, sizes = node.args[0], node.args[1]
        value = tensor_value(source)
        if not isinstance(source, Node) or value is None or value.dim() < 3:
            continue
        if not isinstance(sizes, (list, tuple)) or len(sizes) != 2:
            continue
        inputs = [int(d) for d in value.shape[-2:]]
        tiles = zip(inputs, sizes, strict=True)
        if not all(isinstance(o, int) and o > 0 and d % o == 0 for d, o in tiles):
            continue
        kernel = [d // o for d, o in zip(inputs, sizes, strict=True)]
        items = {user: user.args[1] for user in node.users if user.target is operator.getitem}
        if len(items) != len(node.users):
            continue
        if any(index == 1 and user.users for user, index in items.items()):
            node.target = aten.max_pool2d_with_indices.default
            node.args = (source, kernel, kernel)
        else:
            with graph.inserting_before(node):
                pool = graph.call_function(aten.max_pool2d.default, (source, kernel, kernel))
            pool.meta = dict(node.meta)
            for user, index in items.items():
                if index == 0:
                    pool.meta["val"] = user.meta.get("val")
                    user.replace_all_uses_with(pool)
                graph.erase_node(user)
            graph.erase_node(node)
        changed.append(node.name)
    if changed:
        module.recompile()
    return changed


def drop_dead_code(module: GraphModule) -> list[str]:
    """Removes every pure op whose result nothing reads, repeatedly (what reads only dead ops
    dies too). Returns the names of the removed nodes (not of unread ``getitem`` s)."""
    removed: list[str] = []
    erased = False
    for node in reversed(list(module.graph.nodes)):
        if node.op == "call_function" and not node.users and not node.is_impure():
            if node.target is not operator.getitem:  # (an unread result of a live op: not news)
                removed.append(node.name)
            module.graph.erase_node(node)
            erased = True
    if erased:
        module.recompile()
    return removed


def drop_metadata_asserts(module: GraphModule) -> list[str]:
    """Removes ``aten._assert_tensor_metadata`` nodes and bypasses conversions (``.to()``,
    ``_to_copy``, ``type_as``) whose result has the dtype, device, layout and shape of their
    input, in a graph without in-place ops. Returns the names of the removed nodes."""
    removed: list[str] = []
    for node in list(module.graph.nodes):
        name = target_name(node)
        if name in _METADATA_ASSERTS and not node.users:
            removed.append(node.name)
            module.graph.erase_node(node)
        elif name in _CONVERSIONS and _is_identity_conversion(node):
            source = node.args[0]
            assert isinstance(source, Node)
            _replace(node, source, removed)
    if removed:
        module.recompile()
    return removed


def merge_duplicates(module: GraphModule) -> list[str]:
    """Replaces each node that repeats an earlier node's op and arguments (after the earlier
    merges) by that node, in a graph without in-place ops. Only nodes that depend on a graph
    input are merged; a ``get_attr`` constant is compared by its value (dtype, shape and
    elements), so ``x + base`` and ``x + base_copy`` merge, but constants themselves stay one per
    use, since a constant shared by two partitions fails ExecuTorch 1.5.1's Arm lowering
    (``KeyError`` in ``deduplicate_get_attr_pass``). Random ops (``torch.rand``, dropout), impure
    nodes and nodes with tensor arguments are never merged. Returns the names of the merged
    nodes."""
    if any(_mutates(n) for n in module.graph.nodes):
        return []
    seen: dict[tuple[Any, ...], Node] = {}
    merged: list[str] = []
    variable: set[Node] = set()  # nodes that depend on a graph input
    constants = _ConstantClasses(module)
    for node in list(module.graph.nodes):
        if node.op == "placeholder" or any(a in variable for a in node.all_input_nodes):
            variable.add(node)
        if node.op != "call_function" or node not in variable:
            continue
        if node.is_impure() or torch.Tag.nondeterministic_seeded in getattr(
            node.target, "tags", ()
        ):
            continue
        try:
            key = (node.target, _key(node.args, constants), _key(node.kwargs, constants))
            hash(key)
        except TypeError:
            continue
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = node
            continue
        _replace(node, earlier, merged)
    if merged:
        module.graph.eliminate_dead_code()
        _drop_unused_constants(module)
        module.recompile()
    return merged


class _ConstantClasses:
    """Numbers ``get_attr`` constants so that two holding equal tensors get the same number."""

    def __init__(self, module: GraphModule) -> None:
        self._module = module
        self._numbers: dict[Node, int] = {}
        self._representatives: list[torch.Tensor] = []

    def number(self, node: Node) -> int | None:
        """The class of ``node``'s value, or None for a node that is not a tensor constant."""
        if node.op != "get_attr":
            return None
        if node not in self._numbers:
            value = attribute(self._module, str(node.target))
            if not isinstance(value, torch.Tensor):
                return None
            for index, other in enumerate(self._representatives):
                if (
                    other.dtype == value.dtype
                    and other.shape == value.shape
                    and other.device == value.device
                    and torch.equal(other, value)
                ):
                    self._numbers[node] = index
                    break
            else:
                self._numbers[node] = len(self._representatives)
                self._representatives.append(value)
        return self._numbers[node]


def _key(value: object, constants: _ConstantClasses) -> object:
    """``value`` as a dictionary key: nodes by identity, tensor constants by value; tensor
    arguments are not compared."""
    if isinstance(value, torch.Tensor):
        raise TypeError("tensor arguments are not compared")
    if isinstance(value, Node):
        number = constants.number(value)
        return value if number is None else ("constant", number)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v, constants) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v, constants)) for k, v in value.items()))
    return value


_NOOP_PADS: Final = frozenset(
    {
        "aten::pad",
        "aten::constant_pad_nd",
        "aten::reflection_pad1d",
        "aten::reflection_pad2d",
        "aten::reflection_pad3d",
        "aten::replication_pad1d",
        "aten::replication_pad2d",
        "aten::replication_pad3d",
    }
)
_NOOP_VIEWS: Final = frozenset(
    {"aten::alias", "aten::clone", "aten::view", "aten::reshape", "aten::slice.Tensor"}
)


def drop_noop_views(module: GraphModule) -> list[str]:
    """Bypasses the ops of ``_NOOP_VIEWS`` and ``_NOOP_PADS`` whose result is their input
    unchanged (same shape, dtype and strides; a slice of a whole dimension with step 1; a clone
    that keeps the memory format; a pad of 0 on every side), in a graph without in-place ops
    (where a view could be written through). Returns the names of the bypassed nodes."""
    if any(_mutates(n) for n in module.graph.nodes):
        return []
    removed: list[str] = []
    for node in list(module.graph.nodes):
        name = target_name(node)
        if name in _NOOP_PADS and len(node.args) > 1 and isinstance(node.args[1], (list, tuple)):
            if any(p != 0 for p in node.args[1]):
                continue  # a pad that pads
        elif name not in _NOOP_VIEWS or not node.args:
            continue
        source, result = node.args[0], tensor_value(node)
        value = tensor_value(source)
        if not isinstance(source, Node) or value is None or result is None:
            continue
        same = (
            value.shape == result.shape
            and value.dtype == result.dtype
            and value.stride() == result.stride()
            and node.kwargs.get("memory_format") in (None, torch.preserve_format)
        )
        if name == "aten::slice.Tensor":
            same = same and (node.args[4] if len(node.args) > 4 else 1) == 1
        if not same:
            continue
        _replace(node, source, removed)
    if removed:
        module.recompile()
    return removed


def slices_of_cat(module: GraphModule) -> list[str]:
    """A slice (step 1) of a ``cat`` along the ``cat``'s dimension that lies within one of the
    ``cat``'s inputs reads that input instead (the input itself when the slice is all of it), so
    a ``cat`` whose other inputs nothing else reads leaves the graph with them. A VGF in which a
    grid sampler's output only reached such a ``cat`` came out 15 dB from the quantized model
    (the fuzzer's seed 2786: ``cat([warped, features])[:, 1:4]``, the slice all of
    ``features``): the sampler's compute segment then feeds nothing. Returns the names of the
    slices changed."""
    changed: list[str] = []
    for node in list(module.graph.nodes):
        if target_name(node) != "aten::slice.Tensor" or len(node.args) < 2:
            continue
        cat, result = node.args[0], tensor_value(node)
        if not isinstance(cat, Node) or target_name(cat) != "aten::cat" or result is None:
            continue
        inputs = cat.args[0]
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(i, Node) for i in inputs):
            continue
        rank = result.dim()
        arguments = [*node.args[1:], None, None, None][:4]  # dim, start, end, step
        cat_dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        dim, start, end, step = arguments
        values = [tensor_value(i) for i in inputs]
        if not (isinstance(dim, int) and isinstance(cat_dim, int)) or step not in (None, 1):
            continue
        if dim % rank != cat_dim % rank or any(v is None for v in values):
            continue
        dim %= rank
        sizes = [int(v.shape[dim]) for v in values if v is not None]
        total = sum(sizes)
        first = start if isinstance(start, int) else 0
        last = end if isinstance(end, int) else total
        first = min(max(first + total if first < 0 else first, 0), total)
        last = min(max(last + total if last < 0 else last, 0), total)
        offset = 0
        for source, size in zip(inputs, sizes, strict=True):
            if offset <= first < last <= offset + size:
                assert isinstance(source, Node)  # checked above
                if first == offset and last == offset + size:
                    _replace(node, source, changed)
                else:
                    node.args = (source, dim, first - offset, last - offset, 1)
                    changed.append(node.name)
                break
            offset += size
    if changed:
        module.recompile()
    return changed


def _replace(node: Node, by: Node, names: list[str]) -> None:
    """``node``'s uses read ``by`` instead; ``node`` leaves the graph, its name in ``names``."""
    node.replace_all_uses_with(by)
    names.append(node.name)
    node.graph.erase_node(node)


def _is_identity_conversion(node: Node) -> bool:
    source, result = (tensor_value(node.args[0]) if node.args else None), tensor_value(node)
    if source is None or result is None:
        return False
    memory_format = node.kwargs.get("memory_format")
    return (
        source.dtype == result.dtype
        and source.device == result.device
        and source.layout == result.layout
        and source.shape == result.shape
        and memory_format in (None, torch.preserve_format)
    )


def fold_constants(module: GraphModule, max_elements: int = MAX_FOLDED_ELEMENTS) -> list[str]:
    """Computes every operator that depends on no graph input (only on parameters, buffers,
    constants and literal arguments) once, and replaces each such result that a computed node
    or the output reads with a buffer holding it (``_folded_N``). Random operators and in-place
    ones that write a value another node sees are never folded. A result of over
    ``max_elements`` values is folded only as a row and a column within the limit, where it
    is one (a pixel grid: ``_fold_separated``). Returns the names of the replaced nodes."""
    known: dict[Node, Any] = {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            known[node] = attribute(module, str(node.target))
        elif node.op == "call_function" and _foldable(node, known):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: known[n])
            with torch.no_grad():
                known[node] = node.target(*args, **kwargs)
    replaced: list[str] = []
    for node in list(module.graph.nodes):
        value = known.get(node)
        if node.op != "call_function" or not isinstance(value, torch.Tensor):
            continue
        if all(user in known for user in node.users):
            continue
        if value.numel() > max_elements:
            if _fold_separated(module, node, value, max_elements):
                replaced.append(node.name)
            continue
        with module.graph.inserting_before(node):
            constant = add_constant(module, value.clone(), node.name)
        node.replace_all_uses_with(constant)
        replaced.append(node.name)
    if replaced:
        module.graph.eliminate_dead_code()
        _drop_unused_constants(module)
        module.recompile()
    return replaced


def _fold_separated(module: GraphModule, node: Node, value: torch.Tensor, limit: int) -> bool:
    """A constant over the size limit that is a row plus a column (``separable.separate``: a
    pixel grid) becomes the two, each within the limit, added where it is read: ``value + x``
    (an ``add`` of the same shape) becomes ``(x + row) + column``, exactly; any other reader
    reads ``row + column``. A pixel grid's column (its y, broadcast across the width) is added
    on the rows flattened, as ``y * mask`` (``separable.column_on_rows``: the same numbers,
    whole rows at a time on XNNPACK). Returns whether ``node`` was so replaced."""
    terms = separate(value)
    if terms is None or max(t.numel() for t in terms) > limit:
        return False
    flat = column_on_rows(terms[1], int(value.shape[-2]))  # a pixel grid's y: on whole rows
    if flat is not None and max(t.numel() for t in flat) > limit:
        flat = None
    with module.graph.inserting_before(node):
        row = add_constant(module, terms[0], node.name)
        if flat is None:
            add_where_read(module, node, [row, add_constant(module, terms[1], node.name)])
            return True
        y, mask = (add_constant(module, t, node.name) for t in flat)
    add_where_read(module, node, [row], rows=(y, mask))
    return True


def _foldable(node: Node, known: dict[Node, Any]) -> bool:
    if not all(n in known for n in node.all_input_nodes):
        return False
    if node.target is operator.getitem:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    if _mutates(node) and not _writes_own_value(node):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    return target_name(node) not in _METADATA_ASSERTS


def _drop_unused_constants(module: GraphModule) -> None:
    """Deletes the buffers no ``get_attr`` reads any more (folded into a constant), so that the
    program does not carry them."""
    for node in list(module.graph.nodes):
        if node.op == "get_attr" and not node.users:
            module.graph.erase_node(node)
    read = {str(n.target) for n in module.graph.nodes if n.op == "get_attr"}
    for name, _ in list(module.named_buffers()):
        if name not in read:
            owner, _, leaf = name.rpartition(".")
            delattr(attribute(module, owner) if owner else module, leaf)


def tensor_scalars(module: GraphModule) -> list[str]:
    """Rewrites each scalar op (``eq.Scalar``, ``add.Scalar``, ..., and ``add.Tensor`` and its
    kin given a number) whose tensor operand is 0-dim into its tensor form with a 0-dim
    constant of the tensor's dtype (or the scalar's type where the two differ in kind), so
    that no pass can widen the scalar into a shape. Returns the names of the rewritten
    nodes."""
    rewritten: list[str] = []
    for node in list(module.graph.nodes):
        tensor_form = _SCALAR_TO_TENSOR.get(node.target) if node.op == "call_function" else None
        if node.op == "call_function" and node.target in _SCALAR_OPERAND_TENSOR_OPS:
            tensor_form = node.target  # x.add(2.0): the tensor overload with a number
        operand = tensor_value(node.args[0]) if tensor_form is not None and node.args else None
        if operand is None or operand.dim() != 0 or len(node.args) < 2:
            continue
        scalar = node.args[1]
        if not isinstance(scalar, (bool, int, float)):
            continue
        dtype = operand.dtype
        if isinstance(scalar, float) and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()  # the scalar's kind decides: keep the promotion
        with module.graph.inserting_before(node):
            constant = add_constant(module, torch.tensor(scalar, dtype=dtype), node.name)
        node.target = tensor_form
        node.args = (node.args[0], constant, *node.args[2:])
        rewritten.append(node.name)
    if rewritten:
        module.recompile()
    return rewritten


def ranked_scalar_constants(module: GraphModule) -> list[str]:
    """Gives each 0-dim constant that meets tensors of rank r >= 1 (and its own dtype) in a
    broadcasting elementwise op the shape [1] * r there. The result's shape and dtype are
    unchanged: the op's output already has rank r. Returns the names of the rewritten ops."""
    rewritten: list[str] = []
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target not in BROADCASTING_OPS:
            continue
        result = tensor_value(node)
        if result is None or result.dim() == 0:
            continue
        tensors = [a for a in node.args if isinstance(a, Node)]
        new_args = list(node.args)
        for index, arg in enumerate(node.args):
            value = _scalar_constant(module, arg)
            if value is None or not isinstance(arg, Node):
                continue
            others = [tensor_value(t) for t in tensors if t is not arg]
            if not others or any(o is None or o.dtype != value.dtype for o in others):
                continue  # a 0-dim tensor promotes differently from a ranked one
            with module.graph.inserting_before(node):
                new_args[index] = add_constant(
                    module, value.reshape([1] * result.dim()).clone(), arg.name
                )
        if new_args != list(node.args):
            node.args = tuple(new_args)
            rewritten.append(node.name)
    if rewritten:
        module.graph.eliminate_dead_code()
        module.recompile()
    return rewritten


def _scalar_constant(module: GraphModule, arg: object) -> torch.Tensor | None:
    if not isinstance(arg, Node) or arg.op != "get_attr":
        return None
    value = attribute(module, str(arg.target))
    return value if isinstance(value, torch.Tensor) and value.dim() == 0 else None


NormalizeStep = Callable[[GraphModule], list[str]]
STEPS: Final[tuple[tuple[str, NormalizeStep], ...]] = (
    ("drop_metadata_asserts", drop_metadata_asserts),
    ("fold_constants", fold_constants),
    ("tensor_scalars", tensor_scalars),
    ("ranked_scalar_constants", ranked_scalar_constants),
)
