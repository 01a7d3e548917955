"""Reshapes a backend claims but cannot compile with dynamic sizes, kept out of its partitions.

``DetagDynamicReshapes`` (XNNPACK): ExecuTorch 1.5.1's XNNPACK partitioner claims
``unsqueeze_copy``, ``squeeze_copy`` and ``view_copy`` of tensors whose sizes are symbolic
(``torch.export`` dynamic dimensions), and its lowering then stops the export when more than
one of the result's dimensions is dynamic ("XNNPACK reshape only supports 1 dynamic dimension";
XNNPACK's static reshape infers one dimension at most). A sampling grid built for a dynamic
height and width (``stack`` of two expanded coordinate planes: an ``unsqueeze`` of a 1 x H x W
tensor) hits it. Outside, such a reshape runs as ExecuTorch's portable kernel, which resizes
its output to the run's sizes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition.pads import dequantized_through_shape_ops
from etkit_partition.policies import TAG_KEY
from etkit_quant.graph import target_name

logger = logging.getLogger(__name__)

_RESHAPES: Final = frozenset(
    {
        "aten::view_copy",
        "aten::unsqueeze_copy",
        "aten::squeeze_copy",
        "aten::squeeze_copy.dim",
        "aten::squeeze_copy.dims",
        "aten::view",
        "aten::reshape",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::squeeze.dim",
        "aten::squeeze.dims",
    }
)


def dynamic_dimensions(value: object) -> int:
    """How many of the sizes of the fake tensor ``value`` are symbolic (0 for anything else)."""
    if not isinstance(value, torch.Tensor):
        return 0
    return sum(1 for size in value.shape if not isinstance(size, int))


@dataclass(frozen=True)
class DetagDynamicReshapes:
    """Each delegated reshape (``view``, ``unsqueeze``, ``squeeze``) whose result has more than
    one dynamic dimension stays outside the delegates, with the dequantize (and shape ops) it
    reads: it runs as the portable kernel."""

    def apply(self, program: ExportedProgram) -> list[Node]:
        detagged: list[Node] = []
        for node in program.graph.nodes:
            name = target_name(node).removesuffix(".default")
            if name not in _RESHAPES or TAG_KEY not in node.meta:
                continue
            if dynamic_dimensions(node.meta.get("val")) <= 1:
                continue
            for member in (node, *dequantized_through_shape_ops(node.args[0])):
                if member.meta.pop(TAG_KEY, None) is not None:
                    detagged.append(member)
            logger.debug(
                "%s stays outside the delegates: a reshape with more than one dynamic dimension",
                node.name,
            )
        return detagged
