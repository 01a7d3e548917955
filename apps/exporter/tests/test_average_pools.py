"""``vgf_average_pools``: average pools export for VGF and verify (as depthwise convolutions, or
after an add of 0 behind a sigmoid/tanh); the float model's values do not change; the upstream
failure the add avoids still reproduces in the stock flow (a pin: when it stops failing, that
rewrite may go)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import export_model
from etkit_exporter.export.average_pools import (
    average_pools_as_convs,
    separate_pools_from_tables,
    vgf_average_pools,
)


class PooledGate(torch.nn.Module):
    """A gate (sigmoid) or a bounded feature (tanh) averaged: a blend mask pooled, an attention
    gate's global average."""

    def __init__(self, activation: str) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.conv(x)) if self.activation != "tanh" else self.conv(x).tanh()
        if self.activation == "sigmoid":
            return F.avg_pool2d(y, 2)
        if self.activation == "tanh":
            return F.adaptive_avg_pool2d(y, 1).flatten(1)
        return F.avg_pool2d(y, 3, stride=1, padding=1)  # padded: stays a pool


def _inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 4, 6, 8, generator=torch.Generator().manual_seed(3)),)


def test_a_plain_pool_becomes_its_depthwise_convolution() -> None:
    model = PooledGate("sigmoid").eval()  # avg_pool2d(2) over 6 x 8
    graph = torch.export.export(model, _inputs(), strict=True).module(check_guards=False)
    assert average_pools_as_convs(graph) == ["avg_pool2d"]
    convs = [n for n in graph.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    assert len(convs) == 2 and convs[1].args[6] == 4  # the model's conv, then the depthwise
    assert not [n for n in graph.graph.nodes if n.op == "call_function" and "pool" in str(n.target)]
    with torch.no_grad():
        torch.testing.assert_close(graph(*_inputs()), model(*_inputs()), rtol=1e-6, atol=1e-6)


def test_a_global_average_pool_becomes_a_mean() -> None:
    model = PooledGate("tanh").eval()  # adaptive_avg_pool2d(1)
    graph = torch.export.export(model, _inputs(), strict=True).module(check_guards=False)
    assert average_pools_as_convs(graph) == ["adaptive_avg_pool2d"]
    (mean,) = [n for n in graph.graph.nodes if n.target == torch.ops.aten.mean.dim]
    assert mean.args[1:] == ([-2, -1], True)
    with torch.no_grad():
        torch.testing.assert_close(graph(*_inputs()), model(*_inputs()), rtol=1e-6, atol=1e-6)


def test_a_padded_pool_behind_a_sigmoid_reads_it_through_an_add_of_zero() -> None:
    model = PooledGate("padded").eval()
    graph = torch.export.export(model, _inputs(), strict=True).module(check_guards=False)
    assert vgf_average_pools(graph) == ["avg_pool2d"]
    adds = [n for n in graph.graph.nodes if n.target == torch.ops.aten.add.Tensor]
    assert len(adds) == 1 and adds[0].args[1] == 0.0
    (pool,) = adds[0].users
    assert "avg_pool2d" in str(pool.target)
    with torch.no_grad():
        assert torch.equal(graph(*_inputs()), model(*_inputs()))
    assert separate_pools_from_tables(graph) == []  # the pool now reads the add


def test_a_pool_of_a_conv_output_is_left_alone() -> None:
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(torch.relu(self.conv(x)), 2)

    graph = torch.export.export(Plain().eval(), _inputs(), strict=True).module(check_guards=False)
    assert separate_pools_from_tables(graph) == []
    assert average_pools_as_convs(graph) == ["avg_pool2d"]  # a plain pool still becomes a conv


@pytest.mark.slow
@pytest.mark.parametrize(
    "activation",
    [  # one gate in CI; the pooled rewrite is the same for each (-m extended: the others)
        pytest.param("sigmoid", marks=pytest.mark.extended),
        pytest.param("tanh", marks=pytest.mark.extended),
        "padded",
    ],
)
def test_pooled_gate_exports_for_vgf_and_verifies(activation: str, tmp_path: Path) -> None:
    result = export_model(
        PooledGate(activation).eval(),
        _inputs(),
        artifacts_root=tmp_path / activation,
        target="vgf",
        verify=True,
    )
    assert result.verification["verdict"]["result"] == "pass"


@pytest.mark.slow
def test_upstream_arm_backend_fails_on_an_average_pool_after_sigmoid() -> None:
    """The stock flow: PT2E with the VGF quantizer, ``to_edge_transform_and_lower`` with the VGF
    partitioner. It fails in the Arm TOSA pipeline, before model-converter runs."""
    from executorch.backends.arm.quantizer import (
        VgfQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    inputs = _inputs()
    graph = torch.export.export(PooledGate("sigmoid").eval(), inputs, strict=True)
    spec = VgfCompileSpec()
    quantizer = VgfQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(graph.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    converted = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    with pytest.raises(Exception) as caught:
        to_edge_transform_and_lower(converted, partitioner=[VgfPartitioner(spec)])
    chain, error = [], caught.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    assert any("AVG_POOL2D requires input zero-point dtype" in text for text in chain), chain
