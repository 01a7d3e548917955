"""Pads a backend claims but cannot compile, kept out of its partitions.

``DetagQuantizedPads`` (XNNPACK): ExecuTorch 1.5.1's XNNPACK partitioner delegates quantized
constant pads that XNNPACK then refuses to create when the program loads ("Failed to create
StaticConstantPad node N with code: xnn_status_invalid_parameter"; kornia's separable Gaussian
filter in ``elastic_transform2d``, its ``F.pad`` of a transform matrix). Outside, such a pad is
a copy in float.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition.policies import TAG_KEY
from etkit_quant.graph import is_dequantize, target_name, value_source

logger = logging.getLogger(__name__)

CONSTANT_PAD: Final = frozenset({"aten::constant_pad_nd", "aten::constant_pad_nd.default"})


def dequantized_through_shape_ops(value: object) -> list[Node]:
    """The shape ops from ``value`` up to the dequantize they read, and that dequantize; an
    empty list when ``value`` is not a dequantized tensor."""
    if not isinstance(value, Node):
        return []
    source, chain = value_source(value)
    return [*chain, source] if is_dequantize(source) else []


@dataclass(frozen=True)
class DetagQuantizedPads:
    """Each delegated constant pad that reads a dequantized tensor (directly or through shape
    ops) stays outside the delegates, with those shape ops and the dequantize: they run as the
    portable float kernels (copies)."""

    def apply(self, program: ExportedProgram) -> list[Node]:
        detagged: list[Node] = []
        for node in program.graph.nodes:
            if target_name(node) not in CONSTANT_PAD or TAG_KEY not in node.meta:
                continue
            chain = dequantized_through_shape_ops(node.args[0])
            if not chain:
                continue  # a float pad: XNNPACK takes it as it is
            for member in (node, *chain):
                if member.meta.pop(TAG_KEY, None) is not None:
                    detagged.append(member)
            logger.debug("%s stays outside the delegates: a quantized pad", node.name)
        return detagged
