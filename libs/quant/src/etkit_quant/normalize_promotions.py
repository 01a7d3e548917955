"""``promoted_constants``, a ``normalize_program`` step: an integer constant meeting a
floating-point tensor in an elementwise op becomes the floating-point constant the op's type
promotion computes with (its values cast to the result's dtype), so the op has operands of one
kind. Exact: PyTorch's type promotion casts the integer operand to the result's dtype before
the op (``torch.maximum(x, torch.tensor(0))`` is ``torch.maximum(x, torch.tensor(0.0))``
value for value; tested on the float model).

Upstream pin: ExecuTorch 1.5.1's Arm backend stops at such an op once quantized (the Model Gym's
``catmull_rom_warp`` ends in ``torch.maximum(out_color, torch.tensor(0))``: an int64 0-dim
constant). Its quantizer annotates only the float operand; ``FoldAndAnnotateQParamsPass``
(``preserve_partial_binary_tensor_qdq``, on for VGF) keeps that operand's dequantize and the
output's quantize around the op yet records their parameters on it; ``InsertRescaleInt32Pass``
then treats the op as an integer one and rescales its result to int8, which the kept quantize
reads: "AssertionError: Expecting input to have dtype torch.float32, but got dtype:
torch.int8" at lowering (``quantize_per_tensor``'s meta check, while
``FuseConsecutiveRescalesPass`` retraces the graph). With float constants the op is an
ordinary quantized binary op. When upstream's fold handles a mixed-kind binary op, this step
is still harmless (``libs/quant/tests/test_normalize_promotions.py`` tracks the upstream
failure).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import attribute, tensor_value
from etkit_quant.graph_constants import BROADCASTING_OPS, add_constant

aten = torch.ops.aten


def promoted_constants(module: GraphModule) -> list[str]:
    """Replaces each integer or bool constant (``get_attr``) operand of a broadcasting
    elementwise op whose result is floating point and whose other tensor operands are floating
    point by that constant cast to the result's dtype. Returns the names of the rewritten
    ops."""
    rewritten: list[str] = []
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target not in BROADCASTING_OPS:
            continue
        result = tensor_value(node)
        if result is None or not result.dtype.is_floating_point:
            continue
        operands = node.args[1:] if node.target is aten.where.self else node.args  # no condition
        tensors = [a for a in operands if isinstance(a, Node)]
        new_args = list(node.args)
        for index, arg in enumerate(node.args):
            if node.target is aten.where.self and index == 0:
                continue  # the condition: bool by the op's schema
            if not isinstance(arg, Node) or arg.op != "get_attr":
                continue
            value = attribute(module, str(arg.target))
            if not hasattr(value, "dtype") or value.dtype.is_floating_point:
                continue
            others = [tensor_value(t) for t in tensors if t is not arg]
            if not others or any(o is None or not o.dtype.is_floating_point for o in others):
                continue
            with module.graph.inserting_before(node):
                new_args[index] = add_constant(module, value.to(result.dtype), arg.name)
        if new_args != list(node.args):
            node.args = tuple(new_args)
            rewritten.append(node.name)
    if rewritten:
        module.graph.eliminate_dead_code()
        module.recompile()
    return rewritten
