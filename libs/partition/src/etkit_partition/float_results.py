"""``DetagQuantizeOfFloatResults``: a quantize that ends a partition and quantizes a value the
partition computes in float stays outside it.

ExecuTorch 1.5.1's Arm backend folds a partition's last quantize into the op before it; when
that op computes in float (an op the Arm quantizer leaves float, as it does ``upsample_bicubic2d``
and its decomposition), the VGF then declares a float32 output where the program holds the
quantize's int8 value, and the program cannot run (a convolution followed by a bicubic 2x
upsample as the model's output: "the VGF declares VK_FORMAT_R32_SFLOAT [1, 20, 26, 4] (8320
bytes), the program's value is int8 ... (2080 bytes)"). Outside, the portable kernel quantizes
the VGF's float result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition.policies import TAG_KEY
from etkit_quant.boundary import ARM_ANNOTATION_INFO_KEY
from etkit_quant.graph import is_dequantize, is_quantize, is_shape_op, target_name, value_source

logger = logging.getLogger(__name__)


def _is_float(node: Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _passes_values(node: Node) -> bool:
    """An op that moves values without computing (a view, a permute, a dim-order copy)."""
    return is_shape_op(node) or "dim_order" in target_name(node)


def _origin(node: Node) -> Node:
    return value_source(node, _passes_values)[0]


# Ops a quantizer fuses into the op before them (a convolution's ReLU, its batch norm): they
# read that op's float result inside one quantized unit.
_FUSED: Final = frozenset(
    {
        "aten::relu",
        "aten::relu6",
        "aten::hardtanh",
        "aten::clamp",
        "aten::_native_batch_norm_legit_no_training",
        "aten::batch_norm",
    }
)


def _computed_in_float(node: Node) -> bool:
    """Whether ``node`` is an op of a float region: it reads a float value some op computed (not
    a dequantize, a parameter or an input; views and copies looked through) and no dequantize.
    An op between dequantizes and a quantize reads a dequantize, or ends a fused unit that does
    (a convolution and its ReLU: the ReLU is looked through)."""
    while target_name(node).split(".")[0] in _FUSED and isinstance(node.args[0], Node):
        node = _origin(node.args[0])
    origins = [_origin(source) for source in node.all_input_nodes]
    if any(is_dequantize(o) for o in origins):
        return False
    return any(o.op == "call_function" and _is_float(o) for o in origins)


def _marked_quantized(node: Node) -> bool:
    """Whether the quantizer marked ``node`` quantized (Arm's ``_arm_annotation_info``, which the
    nodes a decomposition makes inherit): Arm folds the quantize into such an op. An op marked
    float (the coordinate arithmetic before a grid sampler's int16 grid) gets a quantize of its
    own, and its VGF declares the integer output."""
    custom = node.meta.get("custom")
    info = custom.get(ARM_ANNOTATION_INFO_KEY) if isinstance(custom, dict) else None
    return info is None or bool(info.get("quantized", True))


def _ends_partition(node: Node, tag: object) -> bool:
    return any(u.op == "output" or u.meta.get(TAG_KEY) != tag for u in node.users)


@dataclass(frozen=True)
class DetagQuantizeOfFloatResults:
    """Each quantize whose result leaves its partition (a program output, or read outside) and
    whose input the partition computes in float stays outside the delegates."""

    def apply(self, program: ExportedProgram) -> list[Node]:
        detagged: list[Node] = []
        for node in program.graph.nodes:
            tag = node.meta.get(TAG_KEY)
            if tag is None or not is_quantize(node):
                continue
            producer = node.args[0]
            if not isinstance(producer, Node) or producer.meta.get(TAG_KEY) != tag:
                continue
            if not _ends_partition(node, tag) or not _computed_in_float(producer):
                continue
            if not _marked_quantized(producer):
                continue  # a float op the quantizer left float: Arm quantizes its result itself
            node.meta.pop(TAG_KEY)
            detagged.append(node)
            logger.debug("%s stays outside the delegates: it quantizes a float result", node.name)
        return detagged
