"""``DetagMaximaOverChannels``: a maximum over channels (a spatial attention map, as CBAM takes
it) that XNNPACK's partitioner would delegate stays outside, and the program loads and computes
the model; without it ExecuTorch 1.5.1's XNNPACK lowering stops the export."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from etkit_partition import DetagMaximaOverChannels, PolicyPartitioner


class SpatialAttention(torch.nn.Module):
    """Features scaled by a map computed from their maximum over channels."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.attention = torch.nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        strongest = torch.max(f, dim=1, keepdim=True)[0]
        return f * torch.sigmoid(self.attention(strongest))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.rand(1, 3, 9, 11, generator=torch.Generator().manual_seed(1)) * 2 - 1,)


def _model() -> SpatialAttention:
    torch.manual_seed(0)
    return SpatialAttention().eval()


def _maximum(name: str) -> bool:
    return name.startswith(("aten_max_dim", "aten_amax"))


def _lower(policies: list[Any]) -> tuple[Any, PolicyPartitioner]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    inputs = _inputs()
    exported = torch.export.export(_model(), inputs, strict=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    converted = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    partitioner = PolicyPartitioner(XnnpackPartitioner(), policies)
    return to_edge_transform_and_lower(converted, partitioner=[partitioner]), partitioner


@pytest.mark.slow
def test_maximum_over_channels_stays_outside_and_the_program_runs() -> None:
    import executorch.kernels.quantized  # noqa: F401  (the Q/DQ kernels around delegates)
    from executorch.runtime import Runtime

    manager, partitioner = _lower([DetagMaximaOverChannels()])
    assert any(_maximum(name) for name in partitioner.detagged), partitioner.detagged
    outside = [
        n.name
        for n in manager.exported_program().graph.nodes
        if n.op == "call_function" and _maximum(n.name)
    ]
    assert outside, "the maximum is not outside the delegates"
    program = bytes(manager.to_executorch().buffer)
    method = Runtime.get().load_program(program).load_method("forward")
    output = method.execute(list(_inputs()))[0]
    with torch.no_grad():
        expected = _model()(*_inputs())
    span = float(expected.max() - expected.min())
    assert float((output - expected).abs().max()) < 0.05 * span


@pytest.mark.slow
def test_upstream_xnnpack_cannot_lower_a_maximum_over_channels() -> None:
    """A pin: when this fails, ExecuTorch's XNNPACK lowers (or no longer claims) such a maximum,
    and the policy may go."""
    with pytest.raises(RuntimeError, match="only supports dim == 2 or dim == 3"):
        _lower([])
