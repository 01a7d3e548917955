"""``snap_float_biases``: after ``quantize`` with XNNPACK's quantizer, every convolution's and
linear's float bias is the value XNNPACK computes with (int32 at input scale x weight scale),
so the quantized model adds what the program adds; Arm's int32 biases are left alone."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
)
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config as xnnpack_config,
)
from torch.fx import GraphModule, Node

from etkit_quant import quantize
from etkit_quant.biases import snap_float_biases
from etkit_quant.graph import target_name


class Net(torch.nn.Module):
    """A convolution, a transposed convolution and a linear, each with a bias."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = torch.nn.Linear(8, 5)
        with torch.no_grad():  # biases far from any grid
            for layer in (self.conv, self.up, self.head):
                layer.bias.copy_(torch.linspace(-0.9, 0.8, layer.bias.numel()) + 0.0123)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.up(torch.relu(self.conv(x))))


def _inputs() -> tuple[torch.Tensor]:
    return (4 * torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(1)) - 2,)


def _attr(gm: GraphModule, target: object) -> torch.Tensor:
    value: object = gm
    for part in str(target).split("."):
        value = getattr(value, part)
    assert isinstance(value, torch.Tensor)
    return value


def _biased_ops(gm: GraphModule) -> list[Node]:
    names = ("aten::conv2d", "aten::conv_transpose2d.input", "aten::linear")
    return [n for n in gm.graph.nodes if target_name(n).removesuffix(".default") in names]


def _scales(gm: GraphModule, node: Node, channels: int) -> torch.Tensor:
    source, weight = node.args[0], node.args[1]
    assert isinstance(source, Node) and isinstance(weight, Node)
    if isinstance(weight.args[1], Node):  # per channel
        scales = _attr(gm, weight.args[1].target).to(torch.float32)
    else:
        scales = torch.full((channels,), float(weight.args[1]))
    return scales * float(source.args[1])  # type: ignore[arg-type]


@pytest.mark.parametrize("per_channel", [True, False])
def test_xnnpack_biases_are_what_xnnpack_computes_with(per_channel: bool) -> None:
    model = Net().eval()
    base = XNNPACKQuantizer().set_global(xnnpack_config(is_per_channel=per_channel))
    gm = quantize(model, _inputs(), base)
    ops = _biased_ops(gm)
    assert len(ops) == 3
    originals = {
        "conv2d": model.conv.bias,
        "conv_transpose2d": model.up.bias,
        "linear": model.head.bias,
    }
    for node in ops:
        bias = node.args[2]
        assert isinstance(bias, Node) and bias.op == "get_attr"
        values = _attr(gm, bias.target).detach()
        scales = _scales(gm, node, values.numel())
        steps = values / scales
        # a whole number of int32 steps, as XNNPACK quantizes it (float32 product, float32 round)
        assert torch.equal(steps.round() * scales, values), node.name
        # ... and within half a step of the model's bias, of which it is the rounding
        original = next(v for k, v in originals.items() if node.name.startswith(k)).detach()
        assert ((values - original).abs() <= scales / 2 + 1e-12).all(), node.name
        assert not torch.equal(values, original), node.name  # the biases were off the grid
    assert model.conv.bias[0].item() == pytest.approx(-0.9 + 0.0123)  # the caller's model kept
    assert snap_float_biases(gm) == []  # idempotent


def test_arm_biases_are_quantized_by_arm_and_left_alone() -> None:
    base = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+FP+int16"))
    base.set_global(get_symmetric_quantization_config())
    gm = quantize(Net().eval(), _inputs(), base)
    for node in _biased_ops(gm):
        bias = node.args[2]
        assert isinstance(bias, Node) and "dequantize" in target_name(bias)  # Arm's int32 bias
    assert snap_float_biases(gm) == []


def test_the_quantized_model_adds_the_bias_xnnpack_adds() -> None:
    """The conv's value before its output quantize equals XNNPACK's arithmetic: the int32 sum of
    int8 products plus the int32 bias, times input scale x weight scale (float error only)."""
    model = Net().eval()
    gm = quantize(
        model, _inputs(), XNNPACKQuantizer().set_global(xnnpack_config(is_per_channel=True))
    )
    (conv,) = [n for n in _biased_ops(gm) if target_name(n).startswith("aten::conv2d")]
    source, weight = conv.args[0], conv.args[1]
    assert isinstance(source, Node) and isinstance(weight, Node)
    values: dict[str, torch.Tensor] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: Node) -> object:
            result = super().run_node(n)
            if n in (conv, source):
                values[n.name] = result
            return result

    Capture(gm).run(*_inputs())
    s_in, zp_in = float(source.args[1]), int(source.args[2])  # type: ignore[arg-type]
    q_in = torch.round(values[source.name] / s_in) + zp_in
    q_w = _attr(gm, weight.args[0].target).to(torch.float64)  # type: ignore[union-attr]
    scales = _attr(gm, weight.args[1].target).to(torch.float64)  # type: ignore[union-attr]
    step = scales * s_in  # per output channel
    q_b = torch.round(model.conv.bias.detach().double() / step)  # XNNPACK's int32 bias
    acc = torch.nn.functional.conv2d((q_in - zp_in).double(), q_w, padding=1)
    expected = (acc + q_b[None, :, None, None]) * step[None, :, None, None]
    error = (values[conv.name].detach().double() - expected).abs() / step[None, :, None, None]
    assert float(error.max()) < 0.05  # int32 steps (float32 sums); the float bias: up to 0.5


def test_qat_adds_the_bias_the_program_adds_and_trains_it() -> None:
    """``prepare_qat`` over XNNPACK's QAT quantizer: each conv adds its bias on the int32 grid of
    its fake quantizes' scales (the value ``convert_qat`` gives the quantized model, bit for
    bit), the bias still learns (straight through), and ``convert_qat``'s graph reads plain
    parameters again."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_qat_config,
    )
    from quant_models import FlowWarp

    from etkit_quant import BoundaryQuantizer, convert_qat, prepare_qat, snorm8

    torch.manual_seed(3)
    frames = [(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8)) for _ in range(3)]
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(xnnpack_qat_config(is_qat=True)),
        input_qspecs=(snorm8(), snorm8()),
        output_qspecs=(snorm8(),),
    )
    prepared = prepare_qat(FlowWarp(), frames[0], quantizer, calibration=frames)
    convs = _biased_ops(prepared)
    assert len(convs) == 2 and all(
        isinstance(c.args[2], Node) and c.args[2].op == "call_function" for c in convs
    )
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in prepared.named_parameters() if "bias" in n}
    loss = sum((prepared(*f) ** 2).mean() for f in frames)
    loss.backward()  # type: ignore[union-attr]
    optimizer.step()
    assert before and all(
        not torch.equal(p, before[n]) for n, p in prepared.named_parameters() if n in before
    )  # the biases learn through the rounding

    prepared.eval()
    added: dict[str, torch.Tensor] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: Node) -> object:
            result = super().run_node(n)
            if n in convs:
                bias = self.env[n.args[2]]  # type: ignore[index]
                added[n.name] = bias.detach().clone()
            return result

    with torch.no_grad():
        Capture(prepared).run(*frames[0])
    converted = convert_qat(prepared)
    assert not [
        n for n in converted.graph.nodes if n.op == "call_function" and "snapped" in str(n.target)
    ]
    for conv in _biased_ops(converted):
        bias = conv.args[2]
        assert isinstance(bias, Node) and bias.op == "get_attr"
        assert torch.equal(_attr(converted, bias.target), added[conv.name]), conv.name
