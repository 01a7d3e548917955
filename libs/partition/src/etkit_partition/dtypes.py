"""``DetagQuantizeDtypes``: quantize/dequantize nodes of integer types a backend cannot compile
stay outside its delegates."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition.policies import TAG_KEY
from etkit_quant.graph import is_dequantize, is_quantize

logger = logging.getLogger(__name__)


def _quant_dtype(node: Node) -> torch.dtype | None:
    """The integer type of a quantize/dequantize node (its ``dtype`` argument)."""
    dtype = node.kwargs.get("dtype", node.args[5] if len(node.args) > 5 else None)
    return dtype if isinstance(dtype, torch.dtype) else None


@dataclass(frozen=True)
class DetagQuantizeDtypes:
    """Quantize and dequantize nodes whose integer type is one of ``dtypes`` stay outside the
    delegates, and so do the ops that read such a dequantize's output. XNNPACK, for one, has no
    int16 activations: its partitioner claims an int16 dequantize that feeds a float op it takes
    (a grid-shaped int16 input scaled before a grid sampler), and even with the dequantize
    outside, it reads a partition input produced by a dequantize as a quantized tensor of that
    type; its lowering then fails (``Unsupported dtype for quantization``). Outside, the portable
    kernels run them in float."""

    dtypes: frozenset[torch.dtype]

    def __init__(self, dtypes: Iterable[torch.dtype]) -> None:
        chosen = frozenset(dtypes)
        if not chosen or not all(isinstance(d, torch.dtype) for d in chosen):
            raise TypeError("DetagQuantizeDtypes needs one or more torch dtypes (torch.int16)")
        object.__setattr__(self, "dtypes", chosen)

    def apply(self, program: ExportedProgram) -> list[Node]:
        detagged = []
        for node in program.graph.nodes:
            if not (is_quantize(node) or is_dequantize(node)):
                continue
            if _quant_dtype(node) not in self.dtypes:
                continue
            readers = list(node.users) if is_dequantize(node) else []
            for member in (node, *readers):
                if member.meta.pop(TAG_KEY, None) is not None:
                    logger.debug(
                        "%s stays outside the delegates: %s", member.name, _quant_dtype(node)
                    )
                    detagged.append(member)
        return detagged
