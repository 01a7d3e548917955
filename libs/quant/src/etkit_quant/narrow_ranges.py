"""``clamp_narrow_ranges``: a narrowed integer range (SNORM8's [-127, 127]) that an Arm program
keeps where its quantized model does.

A quantize clamps to its ``quant_min`` and ``quant_max``. ExecuTorch 1.5.1's Arm backend lowers
the quantize of a computed int8 value (a conv's, an add's, a requantize ``dq -> q``) as a TOSA
``RESCALE``, which clamps to the type's range, [-128, 127], and reads no ``quant_min``
(``backends/arm/operators/op_tosa_rescale.py``). Where the float value lies more than half a
step below ``-127 * scale`` (a tensor that clips: the saturation report warns), the quantized
model writes -127 and the program -128. The fuzzer's seed 6721: a conv's output resized and
requantized into a concatenation that shares a grid sampler's SNORM8 output, 18 % of it below
-1; the next conv came out biased -0.30 steps (bound 0.115).

The rewrite puts a ``clamp`` to the range between the value's dequantize and a quantize in the
same parameters: the quantized model's values do not change (they lie in the range already),
and the Arm backend lowers a quantized clamp as a TOSA ``CLAMP`` of the integers to
[``quant_min``, ``quant_max``], so the program keeps the range too. Values that an op only
moves or selects (``requantize.SHARED_PARAMETER_OPS``), a bilinear resize of values in the
range, a grid sampler (etkit's kernel clamps to its qspec), float coordinate arithmetic and a
bicubic resize (Arm decomposes the quantize of a float value with a clamp to the range, or the
portable kernel quantizes it) and the program's inputs need none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.boundary import ARM_ANNOTATION_INFO_KEY
from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize
from etkit_quant.requantize import (
    INTERPOLATING_OPS,
    SHARED_PARAMETER_OPS,
    base_op_name,
    per_tensor_parameters,
)

logger = logging.getLogger(__name__)

KEPT_RANGE_KEY: Final = "etkit_kept_range"
"""The ``node.meta`` key marking a ``clamp`` this module inserted (reports look through it)."""
# Ops the Arm backend computes in float whatever their annotation (its quantizer leaves a bicubic
# resize and its decomposition float; etkit-partition's ``DetagQuantizeOfFloatResults`` keeps
# the quantize of such a result on the portable kernel, which clamps to the range).
_ARM_FLOAT_OPS: Final = frozenset({"aten::upsample_bicubic2d"})
# Ops that only move values in one set of parameters beyond SHARED_PARAMETER_OPS: a constant
# pad (the RGB -> RGBA pad of an image: its zeros are in the range).
_MOVES_VALUES: Final = frozenset({"aten::constant_pad_nd"})


def _narrowed(node: Node) -> tuple[float, int, int, int] | None:
    """(scale, zero point, quant_min, quant_max) of a per-tensor quantize whose range is narrower
    than its integer type's; ``None`` for any other node."""
    params = per_tensor_parameters(node) if is_quantize(node) else None
    if params is None or params[4].is_floating_point:
        return None
    scale, zero, low, high, dtype = params
    info = torch.iinfo(dtype)
    if low <= info.min and high >= info.max:
        return None
    return float(scale), int(zero), int(low), int(high)


def _rescaled(source: Node) -> bool:
    """Whether the Arm lowering computes the value a quantize reads as integers and lowers the
    quantize as a ``RESCALE`` (which clamps at the type's range only): a requantize, or an op
    the Arm annotation marks quantized (else one reading dequantized values only). Not a float
    op's value (coordinate arithmetic: its quantize is decomposed with a clamp to the range; a
    bicubic resize), a program input, a grid sampler's output (etkit's kernel clamps to its
    qspec), nor an op that only moves, selects or interpolates values in the same parameters
    (a constant pad too)."""
    if is_dequantize(source):
        return True
    if source.op != "call_function" or is_grid_sampler(source):
        return False
    name = base_op_name(source)
    if name in SHARED_PARAMETER_OPS | INTERPOLATING_OPS | _ARM_FLOAT_OPS | _MOVES_VALUES:
        return False
    info = source.meta.get("custom", {}).get(ARM_ANNOTATION_INFO_KEY)
    if isinstance(info, Mapping):
        return bool(info.get("quantized", False))
    inputs = source.all_input_nodes  # an op on dequantized values only is an integer op
    return bool(inputs) and all(is_dequantize(a) or a.op == "get_attr" for a in inputs)


def _clamped(dequantize: Node) -> bool:
    readers = list(dequantize.users)
    return bool(readers) and all(r.target is torch.ops.aten.clamp.default for r in readers)


def clamp_narrow_ranges(model: GraphModule) -> list[str]:
    """Inserts ``dequantize -> clamp -> quantize`` (the same parameters) after each per-tensor
    quantize of a computed value whose range is narrower than its type's (see the module
    docstring), where every user of the quantize is a dequantize. Returns the names of the
    quantizes so kept; the graph is recompiled when there are any. The model's values do not
    change."""
    kept: list[str] = []
    for node in list(model.graph.nodes):
        params = _narrowed(node)
        source = node.args[0] if node.args else None
        if params is None or not isinstance(source, Node):
            continue
        if not _rescaled(source):
            continue
        if is_dequantize(source) and per_tensor_parameters(source) == per_tensor_parameters(node):
            continue  # the same parameters: no rescale
        users = list(node.users)
        if not users or not all(is_dequantize(u) for u in users):
            continue
        if all(_clamped(u) for u in users):
            continue  # kept already
        scale, zero, low, high = params
        dequantize = users[0].target
        assert callable(dequantize) and callable(node.target)  # call_function nodes
        args = tuple(node.args[1:6])
        with model.graph.inserting_after(node):
            dq = model.graph.call_function(dequantize, (node, *args))
        with model.graph.inserting_after(dq):
            clamp = model.graph.call_function(
                torch.ops.aten.clamp.default, (dq, (low - zero) * scale, (high - zero) * scale)
            )
        with model.graph.inserting_after(clamp):
            q = model.graph.call_function(node.target, (clamp, *args))
        for user in users:
            user.replace_input_with(node, q)
        for new in (dq, clamp, q):
            new.meta["stack_trace"] = node.meta.get("stack_trace")
        clamp.meta[KEPT_RANGE_KEY] = True
        if "val" in users[0].meta:
            dq.meta["val"] = clamp.meta["val"] = users[0].meta["val"]
        if "val" in node.meta:
            q.meta["val"] = node.meta["val"]
        kept.append(node.name)
    if kept:
        logger.info("kept narrowed ranges with a clamp: %s", ", ".join(kept))
        model.graph.lint()
        model.recompile()
    return kept
