"""A model quantized with etkit-quant's BoundaryQuantizer (SNORM8 inputs and outputs) lowers to
VGF, and its VGF run on Vulkan gives exactly the converted graph's output; the same with XNNPACK,
run in executorch.runtime."""

from __future__ import annotations

from pathlib import Path

import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from quant_models import NoGridSampler

from etkit_exporter.vgf.scenario import run_vgf, vgf_delegates
from etkit_quant import BoundaryQuantizer, is_dequantize, is_quantize, quantize, snorm8


def _example() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return NoGridSampler().eval(), torch.rand(1, 3, 16, 16) * 2 - 1


def test_snorm8_io_model_on_vgf_equals_converted_graph() -> None:
    model, x = _example()
    spec = VgfCompileSpec("TOSA-1.0+INT")
    base = VgfQuantizer(spec)
    base.set_global(get_symmetric_quantization_config())
    quantizer = BoundaryQuantizer(base, input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    converted = quantize(model, (x,), quantizer)
    expected = converted(x)

    lowered = to_edge_transform_and_lower(
        torch.export.export(converted, (x,), strict=True), partitioner=[VgfPartitioner(spec)]
    )
    program = lowered.exported_program()
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    (q_in,) = [n for n in nodes if is_quantize(n)]
    (dq_out,) = [n for n in nodes if is_dequantize(n)]
    # the boundary carries exactly SNORM8: an engine can hand the VGF R8_SNORM data
    for node in (q_in, dq_out):
        assert node.args[1:6] == (float(torch.tensor(1 / 127)), 0, -127, 127, torch.int8)
    x_q = torch.clamp(torch.round(x * 127), -127, 127).to(torch.int8)
    (vgf,) = vgf_delegates(program)
    (y_q,) = run_vgf(vgf, [x_q.numpy()])
    # dequantized as the graph's own output dequantize does
    actual = torch.ops.quantized_decomposed.dequantize_per_tensor(
        torch.from_numpy(y_q), *dq_out.args[1:6]
    )
    assert torch.equal(actual, expected), (actual - expected).abs().max()


def test_snorm8_io_model_on_xnnpack_runs_in_executorch_runtime(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )
    from executorch.runtime import Runtime

    model, x = _example()
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(xnnpack_config()),
        input_qspecs=(snorm8(),),
        output_qspecs=(snorm8(),),
    )
    converted = quantize(model, (x,), quantizer)
    expected = converted(x)
    lowered = to_edge_transform_and_lower(
        torch.export.export(converted, (x,), strict=True), partitioner=[XnnpackPartitioner()]
    )
    pte = tmp_path / "model.pte"
    pte.write_bytes(lowered.to_executorch().buffer)
    (actual,) = Runtime.get().load_program(pte).load_method("forward").execute([x])
    # XNNPACK's int8 kernels round their requantization their own way: within one SNORM8 step
    assert (actual - expected).abs().max().item() <= 1 / 127 + 1e-6
