"""``integer_scalar_operands``: the number operand of an integer ``add``/``mul`` becomes a 0-dim
constant of the integer tensor's own dtype, before a base quantizer's ``transform_for_annotation``.

Upstream pin: ExecuTorch 1.5.1's XNNPACK quantizer (``_convert_scalars_to_attrs`` in
``executorch/backends/xnnpack/quantizer/xnnpack_quantizer_utils.py``, run by
``XNNPACKQuantizer.transform_for_annotation``) makes every number operand of ``aten.add.Tensor``
and ``aten.mul.Tensor`` a float32 0-dim tensor, whatever the other operand's dtype. Index
arithmetic written as a user writes it (the Model Gym's ``DenseWarp``: ``y * W + x`` on int32
positions, then ``flat[index]``) turns float, and calibration fails with "IndexError: tensors used
as indices must be long, int, byte or bool tensors". A 0-dim constant of the integer operand's
dtype gives exactly what the number gave (a 0-dim operand of the same category does not promote),
and the upstream pass leaves operands that are already nodes alone. When upstream converts only
float operands, this step can go (``libs/quant/tests/test_integer_operands.py`` says so).
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten

_OPS: Final = frozenset({aten.add.Tensor, aten.mul.Tensor})
_PREFIX: Final = "_etkit_integer_operand_"


def _dtype(node: Node) -> torch.dtype | None:
    value = node.meta.get("val")
    return value.dtype if isinstance(value, torch.Tensor) else None


def _integer(dtype: torch.dtype | None) -> bool:
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def integer_scalar_operands(model: GraphModule) -> list[str]:
    """Gives each number operand of an integer-typed ``add.Tensor``/``mul.Tensor`` (a tensor
    operand and the result both integer or bool) a 0-dim constant of that operand's dtype; returns
    the names of the nodes changed. Values do not change."""
    changed: list[str] = []
    for node in list(model.graph.nodes):
        if node.op != "call_function" or node.target not in _OPS:
            continue
        tensors = [a for a in node.args if isinstance(a, Node)]
        numbers = [a for a in node.args if isinstance(a, (bool, int, float))]
        if not tensors or not numbers or not _integer(_dtype(node)):
            continue
        dtype = _dtype(tensors[0])
        if not _integer(dtype) or any(isinstance(n, float) and not n.is_integer() for n in numbers):
            continue
        args: list[Any] = []
        for arg in node.args:
            if isinstance(arg, Node) or not isinstance(arg, (bool, int, float)):
                args.append(arg)
                continue
            args.append(_constant(model, node, torch.tensor(int(arg), dtype=dtype)))
        node.args = tuple(args)
        changed.append(node.name)
    if changed:
        model.recompile()
    return changed


def _constant(model: GraphModule, user: Node, value: torch.Tensor) -> Node:
    index = 0
    while hasattr(model, f"{_PREFIX}{index}"):
        index += 1
    name = f"{_PREFIX}{index}"
    model.register_buffer(name, value)
    with model.graph.inserting_before(user):
        node = model.graph.get_attr(name)
    fake_mode = getattr(user.meta.get("val"), "fake_mode", None)
    node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
    return node
