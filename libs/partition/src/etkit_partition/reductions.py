"""Reductions a backend claims but cannot compile, kept out of its partitions.

``DetagMaximaOverChannels`` (XNNPACK): ExecuTorch 1.5.1's XNNPACK partitioner claims ``amax``
and ``max.dim`` of a 4-D tensor over any dimension, and its lowering then stops the export
("amax.default only supports dim == 2 or dim == 3": a maximum over channels, as a spatial
attention map takes it). Outside, such a reduction runs as ExecuTorch's portable kernel.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition.pads import dequantized_through_shape_ops
from etkit_partition.policies import TAG_KEY
from etkit_quant.graph import target_name

logger = logging.getLogger(__name__)

_MAXIMA: Final = frozenset({"aten::amax", "aten::max.dim"})
_SPATIAL: Final = frozenset({2, 3})  # the dimensions XNNPACK's max reduction lowers


def _dims(node: Node) -> list[int] | None:
    """The dimensions ``node`` reduces, made non-negative; ``None`` when they are not known."""
    value = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    rank = getattr(value, "ndim", None)
    arg = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims: Sequence[object] = arg if isinstance(arg, (list, tuple)) else [arg]
    if rank is None or not all(isinstance(d, int) for d in dims):
        return None
    return [d % rank for d in dims if isinstance(d, int)]


@dataclass(frozen=True)
class DetagMaximaOverChannels:
    """Each delegated ``amax`` or ``max.dim`` that reduces a dimension other than height and
    width (or all of them: ``amax`` with no dimensions) stays outside the delegates, with its
    results' ``getitem`` nodes and the dequantize (and shape ops) feeding it."""

    def apply(self, program: ExportedProgram) -> list[Node]:
        detagged: list[Node] = []
        for node in program.graph.nodes:
            name = target_name(node).removesuffix(".default")
            if name not in _MAXIMA or TAG_KEY not in node.meta:
                continue
            dims = _dims(node)
            if dims is not None and dims and set(dims) <= _SPATIAL:
                continue
            items = [u for u in node.users if u.target is operator.getitem]
            for member in (node, *items, *dequantized_through_shape_ops(node.args[0])):
                if member.meta.pop(TAG_KEY, None) is not None:
                    detagged.append(member)
            logger.debug("%s stays outside the delegates: a maximum over dims %s", node.name, dims)
        return detagged
