"""Partition tag policies: small objects with one job each, applied to a tagged program.

A policy removes ``delegation_tag`` from nodes that must stay outside the delegates. It never
leaves a partition the backend could not compile: ``repair_partitions`` (run by
``PolicyPartitioner`` after every policy) splits a tag whose nodes fell apart into connected
pieces, splits a piece whose nodes reach each other only through outside nodes (fusing it would
make a cycle), moves every dequantize into its consumers' partition (so that no partition reads
a float where its quantized op expects an integer; ``duplicate_dequantize``, run before
partitioning, gives each consumer a dequantize of its own), and detags pieces that hold nothing
but quantize/dequantize nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

from torch.export import ExportedProgram
from torch.fx import Node

from etkit_quant.boundary import user_outputs
from etkit_quant.graph import is_dequantize, is_quantize, operator_name, target_name

logger = logging.getLogger(__name__)

TAG_KEY: Final = "delegation_tag"


@runtime_checkable
class PartitionPolicy(Protocol):
    """One rule applied to a tagged program: detags the nodes it is about."""

    def apply(self, program: ExportedProgram) -> list[Node]:
        """Removes the tags this policy is about; returns the nodes it detagged."""
        ...


def _detag(nodes: Iterable[Node], why: str) -> list[Node]:
    detagged = []
    for node in nodes:
        if node.meta.pop(TAG_KEY, None) is not None:
            logger.debug("%s stays outside the delegates: %s", node.name, why)
            detagged.append(node)
    return detagged


def user_input_nodes(program: ExportedProgram) -> list[Node]:
    """The placeholders of the program's user inputs, in order."""
    names = list(program.graph_signature.user_inputs)
    by_name = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [by_name[name] for name in names if name in by_name]


def user_output_nodes(program: ExportedProgram) -> list[Node]:
    """The nodes producing the program's user outputs, in order."""
    return user_outputs(program.graph_module)[: len(program.graph_signature.user_outputs)]


def _check_indices(indices: Sequence[int], count: int, what: str) -> None:
    for index in indices:
        if not 0 <= index < count:
            raise ValueError(
                f"{what} index {index} is out of range: the program has {count} {what}s "
                f"(indices 0 to {count - 1})"
            )


def _indices(values: Iterable[int] | None, what: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    result = tuple(values)
    for value in result:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{what} indices must be ints, got {value!r}")
    return result


@dataclass(frozen=True)
class DetagInputQuantize:
    """The quantize nodes that consume the user inputs at ``indices`` (``None``: all) stay
    outside, so that the program's callers pass integers once the boundary quantize is
    stripped."""

    indices: tuple[int, ...] | None = None

    def __init__(self, indices: Iterable[int] | None = None) -> None:
        object.__setattr__(self, "indices", _indices(indices, "input"))

    def apply(self, program: ExportedProgram) -> list[Node]:
        inputs = user_input_nodes(program)
        chosen = range(len(inputs)) if self.indices is None else self.indices
        _check_indices(chosen, len(inputs), "input")
        nodes = [u for k in chosen for u in inputs[k].users if is_quantize(u)]
        if not nodes:
            logger.debug("DetagInputQuantize: no quantize consumes inputs %s", list(chosen))
        return _detag(nodes, "it quantizes a graph input")


@dataclass(frozen=True)
class DetagOutputDequantize:
    """The dequantize nodes that produce the user outputs at ``indices`` (``None``: all) stay
    outside, so that callers receive integers once the boundary dequantize is stripped."""

    indices: tuple[int, ...] | None = None

    def __init__(self, indices: Iterable[int] | None = None) -> None:
        object.__setattr__(self, "indices", _indices(indices, "output"))

    def apply(self, program: ExportedProgram) -> list[Node]:
        outputs = user_output_nodes(program)
        chosen = range(len(outputs)) if self.indices is None else self.indices
        _check_indices(chosen, len(outputs), "output")
        nodes = [outputs[k] for k in chosen if is_dequantize(outputs[k])]
        if not nodes:
            logger.debug("DetagOutputDequantize: no dequantize feeds outputs %s", list(chosen))
        return _detag(nodes, "it dequantizes a graph output")


def _op_name(target: object) -> str:
    result = operator_name(target)
    if not result:
        raise TypeError(
            f"expected an operator (such as torch.ops.aten.grid_sampler_2d.default), got {target!r}"
        )
    return result


@dataclass(frozen=True)
class DetagOps:
    """Nodes whose operator is one of ``targets`` stay outside, and with ``with_adjacent_qdq``
    so do the dequantize nodes feeding them and the quantize nodes consuming them: a
    dequantize -> op -> quantize unit that another backend can take whole."""

    targets: frozenset[str] = field(default_factory=frozenset)
    with_adjacent_qdq: bool = True

    def __init__(self, targets: Iterable[object], with_adjacent_qdq: bool = True) -> None:
        names = frozenset(_op_name(t) for t in targets)
        if not names:
            raise ValueError("DetagOps needs at least one operator")
        # aten::x and aten::x.default name the same overload
        names |= {n.removesuffix(".default") for n in names}
        object.__setattr__(self, "targets", names)
        object.__setattr__(self, "with_adjacent_qdq", with_adjacent_qdq)

    def apply(self, program: ExportedProgram) -> list[Node]:
        matches = [n for n in program.graph.nodes if target_name(n) in self.targets]
        nodes: list[Node] = []
        for node in matches:
            nodes.append(node)
            if self.with_adjacent_qdq:
                nodes += [a for a in node.all_input_nodes if is_dequantize(a)]
                nodes += [u for u in node.users if is_quantize(u)]
        if not matches:
            logger.debug("DetagOps: no node with targets %s", sorted(self.targets))
        return _detag(nodes, "its operator is kept for another backend")


def _components(members: set[Node]) -> list[set[Node]]:
    """The weakly connected pieces of ``members`` (edges between members only)."""
    pieces, seen = [], set()
    for start in members:
        if start in seen:
            continue
        piece, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node in piece:
                continue
            piece.add(node)
            stack.extend(n for n in (*node.all_input_nodes, *node.users) if n in members)
        seen |= piece
        pieces.append(piece)
    return pieces


def _reached_through_outside(members: set[Node]) -> set[Node]:
    """The members reachable from a member along a path that leaves ``members``."""
    frontier = [u for m in members for u in m.users if u not in members]
    reached, seen = set(), set()
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in members:
            reached.add(node)
        frontier.extend(node.users)
    return reached


def duplicate_dequantize(program: ExportedProgram) -> int:
    """Gives every consumer of a dequantize its own copy of it (PT2E's convert does the same),
    so that partitioning can put each dequantize in its consumer's partition. Run it before
    partitioning (``PolicyPartitioner.transform_for_pre_decomposition`` does): a partitioner
    may not change the graph. Returns the number of copies made."""
    graph = program.graph_module.graph
    copies = 0
    for dequantize in [n for n in graph.nodes if is_dequantize(n)]:
        for user in list(dequantize.users)[1:]:
            with graph.inserting_after(dequantize):
                copy = graph.create_node(
                    "call_function", dequantize.target, dequantize.args, dequantize.kwargs
                )
            copy.meta = dict(dequantize.meta)
            user.replace_input_with(dequantize, copy)
            copies += 1
    if copies:
        program.graph_module.recompile()
        logger.debug("%d dequantize copies made, one per consumer", copies)
    return copies


def _dequantize_with_consumers(nodes: Iterable[Node]) -> None:
    """Moves every dequantize of a partition into the partition of its consumers (outside every
    partition when they are outside), so that each delegate takes integers in and gives
    integers out. A dequantize left in one partition while its consumer sits in another makes
    the consumer's partition read a float where its quantized op expects an integer and its
    parameters (the Arm backend then fails, with "Expected two input qparams" or "Expecting
    input to have dtype torch.float32, but got dtype: torch.int8"). A dequantize outside every
    partition stays outside (a policy may have put it there: the consumer then reads a float).
    A dequantize whose consumers are in several partitions stays where it is, with a warning:
    ``duplicate_dequantize`` before partitioning gives each consumer its own."""
    for dequantize in nodes:
        if not is_dequantize(dequantize):
            continue
        own = dequantize.meta.get(TAG_KEY)
        if own is None:
            continue
        # the graph output (anything but an op) reads the dequantize where it is
        wanted = {u.meta.get(TAG_KEY) if u.op == "call_function" else own for u in dequantize.users}
        if not wanted or wanted == {own}:
            continue
        if len(wanted) > 1:
            logger.warning(
                "%s feeds several partitions (%s); give each consumer its own dequantize "
                "(etkit_partition.duplicate_dequantize) before partitioning",
                dequantize.name,
                ", ".join(sorted(str(t) for t in wanted)),
            )
            continue
        (tag,) = wanted
        if tag is None:
            dequantize.meta.pop(TAG_KEY, None)
        else:
            dequantize.meta[TAG_KEY] = tag
        logger.debug("%s goes with its consumers: %s", dequantize.name, tag or "no partition")


def _with_feeders(looping: set[Node], piece: set[Node]) -> set[Node]:
    """``looping`` and the members of ``piece`` that feed only it (a weight and its dequantize
    feeding a convolution, ...): they go with their consumers, which cannot make a cycle (no
    path leaves them but through ``looping``, and none reaches them from outside)."""
    grown = set(looping)
    changed = True
    while changed:
        changed = False
        for node in piece - grown:
            if node.users and all(u in grown for u in node.users):
                grown.add(node)
                changed = True
    return grown


def _split(members: set[Node]) -> list[set[Node]]:
    """``members`` as pieces a backend can fuse: connected, and none reaching itself through
    outside nodes."""
    pending = _components(members)
    pieces = []
    while pending:
        piece = pending.pop()
        looping = _reached_through_outside(piece)
        if looping and looping != piece:
            looping = _with_feeders(looping, piece)
            pending += _components(piece - looping) + _components(looping)
        else:
            pieces.append(piece)
    return pieces


def repair_partitions(program: ExportedProgram, tags: dict[str, object]) -> dict[str, object]:
    """Makes every tag a partition the backend can compile after detagging: pieces that fell
    apart get tags of their own (``tag``, ``tag_1``, ...) with the same delegation spec, pieces
    that would form a cycle are split, every dequantize goes into its consumers' partition (or
    outside, with consumers outside), pieces of only quantize/dequantize nodes are detagged, and
    tags with no nodes are dropped. Returns the new tag -> spec mapping."""
    by_tag: dict[str, set[Node]] = {}
    for node in program.graph.nodes:
        tag = node.meta.get(TAG_KEY)
        if tag is not None:
            by_tag.setdefault(tag, set()).add(node)
    order = {n: i for i, n in enumerate(program.graph.nodes)}
    specs: dict[str, object] = {}
    for tag, spec in tags.items():
        pieces = _split(by_tag.get(tag, set()))
        pieces.sort(key=lambda p: min(order[n] for n in p))
        for k, piece in enumerate(pieces):
            name = tag if k == 0 else f"{tag}_{k}"
            for node in piece:
                node.meta[TAG_KEY] = name
            specs[name] = spec
        if len(pieces) > 1:
            logger.debug("partition %s split into %d pieces after detagging", tag, len(pieces))
    _dequantize_with_consumers(program.graph.nodes)
    members: dict[str, set[Node]] = {}
    for node in program.graph.nodes:
        tag = node.meta.get(TAG_KEY)
        if tag is not None:
            members.setdefault(tag, set()).add(node)
    repaired: dict[str, object] = {}
    for name, spec in specs.items():
        piece = members.get(name, set())
        if not piece:
            continue
        if all(is_quantize(n) or is_dequantize(n) for n in piece):
            _detag(piece, "a partition of only quantize/dequantize nodes")
            continue
        repaired[name] = spec
    return repaired


def merge_partitions(program: ExportedProgram, tags: dict[str, object]) -> dict[str, object]:
    """Joins partitions of the same delegation spec (backend and compile specs) into one
    wherever no path runs from one to the other through a node outside both (joined, such a
    path would be a cycle): the pieces a capability partitioner leaves apart because no edge
    joins them (two ops that only share program inputs, say) become one delegate call, one VGF.
    Partitions are joined in graph order, each into the first group it can join. Returns the
    new tag -> spec mapping; run it after ``repair_partitions``."""
    members: dict[str, set[Node]] = {}
    for node in program.graph.nodes:
        tag = node.meta.get(TAG_KEY)
        if tag is not None and tag in tags:
            members.setdefault(tag, set()).add(node)
    order = {n: i for i, n in enumerate(program.graph.nodes)}
    ordered = sorted(members, key=lambda t: min(order[n] for n in members[t]))
    groups: list[tuple[str, set[Node]]] = []
    for tag in ordered:
        piece = members[tag]
        for name, group in groups:
            if tags[name] == tags[tag] and not _reached_through_outside(group | piece):
                group |= piece
                for node in piece:
                    node.meta[TAG_KEY] = name
                logger.debug("partition %s joined into %s", tag, name)
                break
        else:
            groups.append((tag, set(piece)))
    return {name: tags[name] for name, _ in groups}
