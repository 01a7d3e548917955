"""``DetagQuantizedPads``: a quantized constant pad XNNPACK's partitioner would delegate stays
outside, with the shape ops and dequantize feeding it, and the program still loads and computes
the model. (The upstream failure it avoids, on kornia's ``elastic_transform2d``, is pinned by
``tests/test_third_party_zoo.py::test_upstream_xnnpack_refuses_kornias_quantized_pads``.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from etkit_partition import DetagQuantizedPads, PolicyPartitioner


class PadBetweenConvs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv2d(3, 4, 1)
        self.second = torch.nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(F.pad(self.first(x), [1, 1, 1, 1]))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1,)


def _model() -> PadBetweenConvs:
    torch.manual_seed(0)
    return PadBetweenConvs().eval()


@pytest.mark.slow
def test_quantized_pad_stays_outside_and_the_program_runs() -> None:
    import executorch.kernels.quantized  # noqa: F401  (the Q/DQ kernels around delegates)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    inputs = _inputs()
    exported = torch.export.export(_model(), inputs, strict=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    converted = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    partitioner = PolicyPartitioner(XnnpackPartitioner(), [DetagQuantizedPads()])
    manager = to_edge_transform_and_lower(converted, partitioner=[partitioner])
    detagged = {name for name, policy in partitioner.detagged.items()}
    assert any("constant_pad_nd" in name for name in detagged), partitioner.detagged
    outside = [
        n.name
        for n in manager.exported_program().graph.nodes
        if n.op == "call_function" and "constant_pad_nd" in n.name
    ]
    assert outside, "the pad is not outside the delegates"
    program = bytes(manager.to_executorch().buffer)
    method = Runtime.get().load_program(program).load_method("forward")
    output = method.execute(list(inputs))[0]
    with torch.no_grad():
        expected = _model()(*inputs)
    span = float(expected.max() - expected.min())
    assert float((output - expected).abs().max()) < 0.05 * span
