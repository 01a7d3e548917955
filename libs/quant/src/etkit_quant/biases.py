"""``snap_float_biases``: a quantized convolution's or linear's float bias made the value the
backend will compute with.

XNNPACK's quantizer leaves the bias of a quantized convolution or linear in float, and the
backend quantizes it when it lowers the op: to int32 at the input's scale times the weight's
(per output channel for per-channel weights; ExecuTorch 1.5.1
``backends/xnnpack/operators/quant_params.py``, ``QuantParams.from_bias``). The quantized PT2E
model, the program's reference, adds the float bias. The two differ by up to half of
``input_scale * weight_scale`` per output channel: a constant offset on every value of that
channel, rounding some of them to the other neighbour (in a flow head, one step of the flow
moves every warp it drives). Snapping the float bias to that grid changes the model by exactly
what the program changes it by, so the reference computes what the program computes. Arm's
quantizer quantizes biases itself (a ``dequantize`` of int32): those are left as they are.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase

from etkit_quant.graph import attribute, operator_name

_BIASED: Final = {
    "aten::conv1d": 2,
    "aten::conv2d": 2,
    "aten::conv3d": 2,
    "aten::linear": 2,
    "aten::conv_transpose1d.input": 2,
    "aten::conv_transpose2d.input": 2,
    "aten::convolution": 2,
}
_PER_TENSOR: Final = "quantized_decomposed::dequantize_per_tensor"
_PER_CHANNEL: Final = "quantized_decomposed::dequantize_per_channel"
_INT32: Final = (-(2**31), 2**31 - 1)


def _name(node: Any) -> str:
    if not isinstance(node, Node) or node.op != "call_function":
        return ""
    return operator_name(node.target).removesuffix(".default").removesuffix(".tensor")


def _constant(module: GraphModule, node: Node) -> Any:
    return attribute(module, str(node.target)) if node.op == "get_attr" else None


def _weight_scales(module: GraphModule, weight: Node, channels: int) -> torch.Tensor | None:
    """The weight's scale per output channel (``channels`` of them), or ``None`` when the
    weight is not dequantized in a way the bias's scale can be read from."""
    name = _name(weight)
    if name == _PER_TENSOR and isinstance(weight.args[1], float | int):
        return torch.full((channels,), float(weight.args[1]), dtype=torch.float32)
    if name == _PER_CHANNEL and isinstance(weight.args[1], Node):
        scales = _constant(module, weight.args[1])
        if isinstance(scales, torch.Tensor) and scales.numel() == channels:
            return scales.detach().to(torch.float32).reshape(-1)
    return None


def snap_float_biases(module: GraphModule) -> list[str]:
    """Replaces the float bias of every convolution and linear of the converted ``module`` that
    reads a per-tensor dequantized input and a dequantized weight with the bias the backend
    computes with: ``dequantize(quantize(bias, input_scale * weight_scale, int32))`` (module
    docstring). Returns the names of the ops whose bias changed; the module is recompiled when
    there are any. Exact where the backend quantizes the bias so; idempotent."""
    snapped: list[str] = []
    for node in module.graph.nodes:
        index = _BIASED.get(_name(node))
        if index is None or len(node.args) <= index:
            continue
        source, weight, bias = node.args[0], node.args[1], node.args[index]
        if not (isinstance(source, Node) and isinstance(weight, Node) and isinstance(bias, Node)):
            continue
        if _name(source) != _PER_TENSOR or bias.op != "get_attr" or len(bias.users) != 1:
            continue  # (a bias two ops share may be quantized at two scales: left alone)
        if _name(node) == "aten::convolution" and node.args[6]:
            continue  # a transposed convolution's weight holds output channels on axis 1
        values = _constant(module, bias)
        input_scale = source.args[1]
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            continue
        if not isinstance(input_scale, float | int):
            continue
        weight_scales = _weight_scales(module, weight, values.numel())
        if weight_scales is None:
            continue
        scales = weight_scales * float(input_scale)  # float32, as the backend multiplies them
        zeros = torch.zeros_like(scales, dtype=torch.int64)
        with torch.no_grad():
            quantized = torch.ops.quantized_decomposed.quantize_per_channel(
                values.detach().to(torch.float32), scales, zeros, 0, *_INT32, torch.int32
            )
            exact = torch.ops.quantized_decomposed.dequantize_per_channel(
                quantized, scales, zeros, 0, *_INT32, torch.int32
            ).to(values.dtype)
        if torch.equal(exact, values):
            continue
        owner_name, _, leaf = str(bias.target).rpartition(".")
        owner = attribute(module, owner_name) if owner_name else module
        replacement = (
            torch.nn.Parameter(exact, requires_grad=False)
            if isinstance(values, torch.nn.Parameter)
            else exact
        )
        setattr(owner, leaf, replacement)
        snapped.append(node.name)
    if snapped:
        module.recompile()
    return snapped


# -- while training: the same rounding, read from the fake quantizes -------------------------


def _snapped_bias(bias: torch.Tensor, input_scale: torch.Tensor, weight_scale: torch.Tensor) -> Any:
    """``bias`` on the int32 grid of ``input_scale * weight_scale`` (``snap_float_biases``'s
    rounding, on the fake quantizes' current scales), with a straight-through gradient."""
    with torch.no_grad():
        scales = (weight_scale.to(torch.float32) * input_scale.to(torch.float32)).reshape(-1)
        scales = scales.expand(bias.numel()).contiguous()
        zeros = torch.zeros_like(scales, dtype=torch.int64)
        quantized = torch.ops.quantized_decomposed.quantize_per_channel(
            bias.detach().to(torch.float32), scales, zeros, 0, *_INT32, torch.int32
        )
        exact = torch.ops.quantized_decomposed.dequantize_per_channel(
            quantized, scales, zeros, 0, *_INT32, torch.int32
        ).to(bias.dtype)
    return bias + (exact - bias).detach()


def _fake_quantized(module: GraphModule, node: Any) -> bool:
    if not isinstance(node, Node) or node.op != "call_module":
        return False
    return isinstance(module.get_submodule(str(node.target)), FakeQuantizeBase)


def snap_biases_while_training(prepared: GraphModule) -> list[str]:
    """In a QAT-prepared ``prepared`` (``prepare_qat``), every convolution and linear whose
    input and weight are fake quantized and whose bias is a float parameter (XNNPACK's
    quantizer; Arm's fake-quantizes the bias itself) adds its bias as the backend will: on the
    int32 grid of the two fake quantizes' current scales, straight through for the gradient.
    The training and eval forwards then add what ``convert_qat``'s ``snap_float_biases`` and
    the program add. Returns the ops' names; ``unsnap_biases`` undoes it."""
    snapped: list[str] = []
    graph = prepared.graph
    for node in list(graph.nodes):
        index = _BIASED.get(_name(node))
        if index is None or len(node.args) <= index:
            continue
        source, weight, bias = node.args[0], node.args[1], node.args[index]
        if not (_fake_quantized(prepared, source) and _fake_quantized(prepared, weight)):
            continue
        if not isinstance(bias, Node) or bias.op != "get_attr" or len(bias.users) != 1:
            continue
        values = _constant(prepared, bias)
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            continue
        if _name(node) == "aten::convolution" and node.args[6]:
            continue
        with graph.inserting_before(node):
            input_scale = graph.get_attr(f"{source.target}.scale")
            weight_scale = graph.get_attr(f"{weight.target}.scale")
            snap = graph.call_function(_snapped_bias, (bias, input_scale, weight_scale))
        node.update_arg(index, snap)
        snapped.append(node.name)
    if snapped:
        prepared.recompile()
    return snapped


def unsnap_biases(prepared: GraphModule) -> int:
    """Undoes ``snap_biases_while_training``: each op reads its float bias again (before
    ``convert_pt2e``). Returns how many were undone."""
    graph = prepared.graph
    undone = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _snapped_bias:
            bias, input_scale, weight_scale = node.args
            node.replace_all_uses_with(bias)
            graph.erase_node(node)
            for scale in (input_scale, weight_scale):
                if isinstance(scale, Node) and not scale.users:
                    graph.erase_node(scale)
            undone += 1
    if undone:
        prepared.recompile()
    return undone
