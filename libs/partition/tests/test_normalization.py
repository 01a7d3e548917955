"""``instance_norms_as_moments``: instance norms written as mean, subtract, multiply, add and
rsqrt compute what PyTorch's instance norm computes, and XNNPACK then lowers them (ExecuTorch's
own lowering leaves ``_native_batch_norm_legit.no_stats`` outside every delegate)."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

from etkit_partition import instance_norms_as_moments


class _Norms(torch.nn.Module):
    def __init__(self, affine: bool, running: bool, channels: int = 6) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.InstanceNorm2d(channels, affine=affine, track_running_stats=running)
        self.norm1d = torch.nn.InstanceNorm1d(channels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.norm(self.conv(x)))
        return y, self.norm1d(y.flatten(2))


def _model(affine: bool, running: bool) -> _Norms:
    torch.manual_seed(0)
    model = _Norms(affine, running)
    if affine:
        with torch.no_grad():
            model.norm.weight.uniform_(0.5, 1.5)
            model.norm.bias.uniform_(-0.5, 0.5)
    if running:  # statistics a trained model would carry
        model.norm.running_mean.uniform_(-0.2, 0.2)
        model.norm.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _targets(program: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    ("affine", "running"), [(False, False), (True, False), (True, True)], ids=str
)
def test_the_moments_compute_the_instance_norm(affine: bool, running: bool) -> None:
    model = _model(affine, running)
    x = torch.rand(2, 3, 11, 13) * 4 - 1  # batch 2, odd sizes, a mean far from 0
    program = torch.export.export(model, (x,), strict=True)
    assert "aten.instance_norm.default" in _targets(program)
    rewritten = instance_norms_as_moments(program)
    targets = _targets(rewritten)
    assert "aten.instance_norm.default" not in targets
    assert "aten.rsqrt.default" in targets and "aten.mean.dim" in targets
    for got, want in zip(rewritten.module()(x), model(x), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_xnnpack_lowers_the_moments_and_not_the_norm() -> None:
    model = _model(True, False)
    x = torch.rand(1, 3, 16, 20)
    program = torch.export.export(model, (x,), strict=True)
    stock = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    outside = _targets(stock.exported_program())
    assert any("_native_batch_norm_legit" in t for t in outside), outside
    ours = to_edge_transform_and_lower(
        instance_norms_as_moments(program), partitioner=[XnnpackPartitioner()]
    )
    outside = _targets(ours.exported_program())
    # the 2-D norm is inside the delegate; the 1-D one's mean is over one dimension, which
    # XNNPACK's global average pooling does not take: its moments stay outside, as portable ops
    assert not any("_native_batch_norm_legit" in t for t in outside), outside
    lowered = ours.exported_program()
    delegate_ops = [
        str(n.target)
        for module in lowered.graph_module.modules()
        if hasattr(module, "original_module")
        for n in module.original_module.graph.nodes
        if n.op == "call_function"
    ]
    assert sum("rsqrt" in t for t in delegate_ops) >= 1, delegate_ops


def test_a_program_without_instance_norms_is_returned_as_it_is() -> None:
    program = torch.export.export(torch.nn.Conv2d(3, 4, 3).eval(), (torch.rand(1, 3, 8, 8),))
    assert instance_norms_as_moments(program) is program
