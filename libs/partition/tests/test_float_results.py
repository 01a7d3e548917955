"""``DetagQuantizeOfFloatResults`` on programs lowered with the Arm VgfPartitioner
(model-converter runs): the quantize of a bicubic upsample's float result, the program's output,
stays outside the VGF; the quantize after a convolution and its fused ReLU stays inside."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from torch.export import ExportedProgram

from etkit_partition import DetagOutputDequantize, DetagQuantizeOfFloatResults, PolicyPartitioner
from etkit_quant import BoundaryQuantizer, is_quantize, quantize, snorm8

SPEC = "TOSA-1.0+INT+FP+int16"


class Upsample(torch.nn.Module):
    """A convolution and its ReLU, then (``bicubic``) a bicubic 2x upsample as the output: Arm's
    quantizer leaves the upsample's decomposition in float."""

    def __init__(self, bicubic: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bicubic = bicubic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        if self.bicubic:
            return F.interpolate(y, scale_factor=2, mode="bicubic", align_corners=False)
        return y


def _lower(bicubic: bool) -> tuple[ExportedProgram, PolicyPartitioner]:
    inputs = (torch.rand(1, 3, 10, 13, generator=torch.Generator().manual_seed(3)),)
    base = VgfQuantizer(VgfCompileSpec(SPEC))
    base.set_global(get_symmetric_quantization_config())
    quantizer = BoundaryQuantizer(base, input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    program = torch.export.export(
        quantize(Upsample(bicubic).eval(), inputs, quantizer), inputs, strict=True
    )
    # the integer output, as the etkit exporter gives it: the VGF ends in the quantize
    policies = [DetagOutputDequantize([0]), DetagQuantizeOfFloatResults()]
    partitioner = PolicyPartitioner(VgfPartitioner(VgfCompileSpec(SPEC)), policies)  # type: ignore[arg-type]
    lowered = to_edge_transform_and_lower(program, partitioner=[partitioner])
    return lowered.exported_program(), partitioner


def _output_producer(program: ExportedProgram) -> torch.fx.Node:
    output = next(n for n in program.graph.nodes if n.op == "output")
    node = output.args[0][0]
    assert isinstance(node, torch.fx.Node)
    return node


def test_quantize_of_a_float_result_stays_outside() -> None:
    program, partitioner = _lower(bicubic=True)
    by_policy = [n for n, p in partitioner.detagged.items() if p == "DetagQuantizeOfFloatResults"]
    producer = _output_producer(program).args[0]  # the output dequantize reads the quantize
    assert isinstance(producer, torch.fx.Node) and is_quantize(producer)
    assert by_policy == [producer.name]  # run by the portable kernel


def test_quantize_after_a_fused_relu_stays_inside() -> None:
    program, partitioner = _lower(bicubic=False)
    assert "DetagQuantizeOfFloatResults" not in partitioner.detagged.values()
    producer = _output_producer(program).args[0]
    assert isinstance(producer, torch.fx.Node) and not is_quantize(producer)  # the VGF's
