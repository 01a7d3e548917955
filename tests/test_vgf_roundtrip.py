"""The real VGF toolchain end to end: PT2E quantization with the Arm VgfQuantizer, lowering with
VgfPartitioner (model-converter runs), and the VGF run on Vulkan by scenario_runner with the ML
emulation layers."""

from __future__ import annotations

import numpy as np
import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from etkit_exporter.vgf.scenario import run_vgf, vgf_delegates
from etkit_quant.graph import is_dequantize, is_quantize


class SmallConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x)))


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SmallConvNet().eval(), torch.randn(1, 3, 16, 16)


def test_quantized_vgf_equals_converted_pt2e_model_exactly() -> None:
    model, x = _model_and_input()
    spec = VgfCompileSpec("TOSA-1.0+INT")
    quantizer = VgfQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(
        torch.export.export(model, (x,), strict=True).module(check_guards=False), quantizer
    )
    prepared(x)
    converted = convert_pt2e(prepared)
    expected = converted(x)

    lowered = to_edge_transform_and_lower(
        torch.export.export(converted, (x,), strict=True), partitioner=[VgfPartitioner(spec)]
    )
    program = lowered.exported_program()
    (vgf,) = vgf_delegates(program)
    # the top-level graph keeps the boundary quantize/dequantize: the VGF is int8 in, int8 out
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    (quantize,) = [n for n in nodes if is_quantize(n)]
    (dequantize,) = [n for n in nodes if is_dequantize(n)]
    in_scale, in_zp, in_min, in_max = quantize.args[1:5]
    out_scale, out_zp = dequantize.args[1:3]
    x_q = torch.clamp(torch.round(x / in_scale) + in_zp, in_min, in_max).to(torch.int8)

    (y_q,) = run_vgf(vgf, [x_q.numpy()])
    assert y_q.dtype == np.int8 and y_q.shape == (1, 4, 16, 16)
    actual = (torch.from_numpy(y_q).float() - out_zp) * out_scale
    assert torch.equal(actual, expected), float((actual - expected).abs().max())


def test_float_vgf_matches_eager_pytorch() -> None:
    model, x = _model_and_input()
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,), strict=True),
        partitioner=[VgfPartitioner(VgfCompileSpec("TOSA-1.0+FP"))],
    )
    (vgf,) = vgf_delegates(lowered.exported_program())
    (y,) = run_vgf(vgf, [x.numpy()])
    np.testing.assert_allclose(y, model(x).detach().numpy(), atol=1e-5, rtol=0)
