"""Integer values moved as integers outside the delegates.

``integer_moves``: an op that only moves values (``slice``, ``view``, ``permute``, ``squeeze``,
...: ``etkit_quant.graph.is_shape_op``) or pads them with a constant (``constant_pad_nd``) left
outside every delegate between a dequantize and quantizes of the same parameters
(``dq -> move -> q``) runs on the integers instead: the dequantize and the quantizes leave the
graph and the move reads the integer tensor, as the ExecuTorch portable kernels copy and pad
any dtype (a pad's constant becomes its quantized value). ``q(move(dq(x))) == move(x)``
whenever the two sets of parameters (scale, zero point, range, dtype) are equal, and a padded
constant c comes out ``q(c)`` either way, so every value is the same, bit for bit; the program
no longer writes and reads a float32 copy of the tensor.

Where it happens (XNNPACK): the RGBA pad of an image for etkit's grid sampler stays outside
(``DetagQuantizedPads``): it was a float dequantize, pad and quantize of the whole frame. And
ExecuTorch 1.5.1's XNNPACK partitioner does not take a ``slice_copy`` of a tensor with dynamic
sizes (its static slice needs static sizes), so in a size-range program the channel slice
after the sampler (RGBA -> RGB) stayed outside as a float dequantize and slice of the whole
image: at 1088 x 1920 the flow-warp demo's range program ran 7 % slower than the fixed-size
export (``bench/sizes_bench.py``).

Two parts: the policy ``DetagMovedQuantizes`` keeps such a move's quantizes out of the next
partition (a tag policy, so last of all, when every other tag is final: a partitioner may not
change the graph), and ``integer_moves``, run on the lowered program (before the next
``to_backend``), rewrites each ``dq -> move -> q`` outside the delegates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.utils.fuser_utils import validate_partition

from etkit_partition.pads import CONSTANT_PAD
from etkit_partition.policies import TAG_KEY, _split
from etkit_quant.graph import is_dequantize, is_quantize, is_shape_op, target_name
from etkit_quant.requantize import per_tensor_parameters, same_parameters

logger = logging.getLogger(__name__)


def _same_parameters(a: Node, b: Node) -> bool:
    first, second = per_tensor_parameters(a), per_tensor_parameters(b)
    return first is not None and second is not None and same_parameters(first, second)


def _quantized_constant(value: object, dequantize: Node) -> int | None:
    """``value`` (a pad's constant) quantized with ``dequantize``'s parameters."""
    params = per_tensor_parameters(dequantize)
    if params is None or not isinstance(value, (int, float)):
        return None
    scale, zero, low, high, _ = params
    return int(min(max(round(float(value) / float(scale)) + int(zero), int(low)), int(high)))


def _move_of_dequantized(node: Node) -> Node | None:
    """The dequantize ``node`` (a shape op or a constant pad) moves the values of, when every
    use of ``node`` is a quantize with the same per-tensor parameters; else ``None``."""
    if node.op != "call_function" or not (target_name(node) in CONSTANT_PAD or is_shape_op(node)):
        return None
    source = node.args[0] if node.args else None
    if not isinstance(source, Node) or not is_dequantize(source):
        return None
    if not isinstance(source.args[0], Node):
        return None
    users = list(node.users)
    if not users or not all(is_quantize(u) and _same_parameters(source, u) for u in users):
        return None
    return source


@dataclass
class DetagMovedQuantizes:
    """Each quantize of a ``dq -> move -> q`` whose dequantize and move (a shape op) stay
    outside the delegates (both untagged) stays outside too, so that ``integer_moves`` can
    remove the pair after lowering; not where its partition, or that of a consumer, would then
    need repairing (split, or reach itself through outside nodes). ``detagged`` names them.
    Pads are left alone: on kornia's combined warps, taking the quantizes of two pads out of a
    partition passed these checks and still left ``repair_partitions`` with pieces that feed
    each other (a dependency cycle ExecuTorch's lowering refuses); the RGBA pad of an image,
    which is what matters, has its quantize outside already. The etkit exporter applies it to
    size-range programs (XNNPACK's static slice takes no dynamic sizes)."""

    detagged: list[str] = field(default_factory=list)

    def apply(self, program: ExportedProgram) -> list[Node]:
        found: list[Node] = []
        for node in program.graph.nodes:
            if TAG_KEY in node.meta:
                continue
            source = _move_of_dequantized(node)
            if source is None or TAG_KEY in source.meta or not is_shape_op(node):
                continue  # (a pad's quantizes stay where they are: see the class docstring)
            for quantize in node.users:
                tag = quantize.meta.get(TAG_KEY)
                if tag is None:
                    continue
                del quantize.meta[TAG_KEY]
                touched = {tag, *(u.meta.get(TAG_KEY) for u in quantize.users)} - {None}
                if not all(_whole(program, t) for t in touched):
                    quantize.meta[TAG_KEY] = tag  # a partition would need repairing: left as is
                    continue
                found.append(quantize)
                self.detagged.append(quantize.name)
        return found


def _whole(program: ExportedProgram, tag: object) -> bool:
    """Whether the nodes tagged ``tag`` are still one piece the backend can fuse: connected and
    not reaching themselves through outside nodes (``policies._split`` leaves them as they are;
    a partition it would split, ``repair_partitions`` could leave in pieces that feed each
    other), and ``torch.fx``'s ``validate_partition`` (ExecuTorch's check) passes."""
    members = {n for n in program.graph.nodes if n.meta.get(TAG_KEY) == tag}
    return not members or (len(_split(members)) == 1 and bool(validate_partition(list(members))))


def integer_moves(program: ExportedProgram) -> list[str]:
    """Rewrites each ``dq -> move -> q`` of ``program``'s graph (a lowered program: the nodes
    outside the delegates) into the move of the integers (see the module's docstring); returns
    the names of the moves rewritten."""
    graph = program.graph
    rewritten: list[str] = []
    for node in list(graph.nodes):
        source = _move_of_dequantized(node)
        if source is None:
            continue
        users = list(node.users)
        if target_name(node) in CONSTANT_PAD:
            constant = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)
            quantized = _quantized_constant(constant, source)
            if quantized is None:
                continue
            node.args = (*node.args[:2], quantized)
            node.kwargs = {}
        node.replace_input_with(source, source.args[0])
        node.meta["val"] = users[0].meta.get("val")  # the integer tensor, the move's shape
        for quantize in users:
            quantize.replace_all_uses_with(node)
            graph.erase_node(quantize)
        if not source.users:
            graph.erase_node(source)
        rewritten.append(node.name)
        logger.debug("%s moves the integers (its dequantize and quantize left)", node.name)
    if rewritten:
        graph.lint()
        program.graph_module.recompile()
    return rewritten
