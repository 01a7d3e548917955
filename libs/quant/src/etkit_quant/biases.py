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

from typing import Any, Final, TypeGuard

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase

from etkit_quant.graph import attribute, operator_name

_BIASED: Final = frozenset(
    {
        "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear",
        "aten::conv_transpose1d.input", "aten::conv_transpose2d.input", "aten::convolution",
    }
)  # fmt: skip
_BIAS: Final = 2  # the bias's argument index in each of them
_PER_TENSOR: Final = "quantized_decomposed::dequantize_per_tensor"
_PER_CHANNEL: Final = "quantized_decomposed::dequantize_per_channel"
_INT32: Final = (-(2**31), 2**31 - 1)


def _name(node: Any) -> str:
    if not isinstance(node, Node) or node.op != "call_function":
        return ""
    return operator_name(node.target).removesuffix(".default").removesuffix(".tensor")


def _constant(module: GraphModule, node: Node) -> Any:
    return attribute(module, str(node.target)) if node.op == "get_attr" else None


def _float_bias(module: GraphModule, node: Node) -> Node | None:
    """The ``get_attr`` node of ``node``'s float bias, when ``node`` is a convolution or linear
    whose bias only it reads (a bias two ops share may be quantized at two scales: left alone);
    ``None`` otherwise, and for a transposed ``aten.convolution`` (its weight holds output
    channels on axis 1)."""
    if _name(node) not in _BIASED or len(node.args) <= _BIAS:
        return None
    bias = node.args[_BIAS]
    if not isinstance(bias, Node) or bias.op != "get_attr" or len(bias.users) != 1:
        return None
    if _name(node) == "aten::convolution" and node.args[6]:
        return None
    values = _constant(module, bias)
    return bias if isinstance(values, torch.Tensor) and values.is_floating_point() else None


def _on_int32_grid(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``dequantize(quantize(values, scales, int32))`` per channel, as the backend quantizes a
    bias (float32 arithmetic), in ``values``' dtype; no gradient."""
    zeros = torch.zeros_like(scales, dtype=torch.int64)
    with torch.no_grad():
        quantized = torch.ops.quantized_decomposed.quantize_per_channel(
            values.detach().to(torch.float32), scales, zeros, 0, *_INT32, torch.int32
        )
        exact: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_channel(
            quantized, scales, zeros, 0, *_INT32, torch.int32
        ).to(values.dtype)
    return exact


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
        bias = _float_bias(module, node)
        if bias is None:
            continue
        source, weight = node.args[0], node.args[1]
        if not (isinstance(weight, Node) and _name(source) == _PER_TENSOR):
            continue
        assert isinstance(source, Node)  # (a dequantize, named above)
        input_scale = source.args[1]
        if not isinstance(input_scale, float | int):
            continue
        values = _constant(module, bias)
        weight_scales = _weight_scales(module, weight, values.numel())
        if weight_scales is None:
            continue
        # float32, as the backend multiplies them
        exact = _on_int32_grid(values, weight_scales * float(input_scale))
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
    scales = (weight_scale.to(torch.float32) * input_scale.to(torch.float32)).reshape(-1)
    exact = _on_int32_grid(bias, scales.detach().expand(bias.numel()).contiguous())
    return bias + (exact - bias).detach()


def _fake_quantized(node: Any, module: GraphModule) -> TypeGuard[Node]:
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
        bias = _float_bias(prepared, node)
        if bias is None:
            continue
        source, weight = node.args[0], node.args[1]
        if not (_fake_quantized(source, prepared) and _fake_quantized(weight, prepared)):
            continue
        with graph.inserting_before(node):
            input_scale = graph.get_attr(f"{source.target}.scale")
            weight_scale = graph.get_attr(f"{weight.target}.scale")
            snap = graph.call_function(_snapped_bias, (bias, input_scale, weight_scale))
        node.update_arg(_BIAS, snap)
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
