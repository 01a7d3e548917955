"""A ReLU before a quantize whose range holds negative values (SNORM8 at an output or a grid
sampler's image) survives VGF lowering: ``keep_activation_bounds`` on edge graphs, and a conv +
ReLU output exported for VGF and run whole (scenario_runner on lavapipe) against the quantized
PT2E model. Without the pass, the Arm backend folds the ReLU into the output quantize and every
negative value goes through (77 steps off measured on a spatial-transformer front end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge

from etkit_exporter import export_model
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.export.activation_bounds import activations_at_risk, keep_activation_bounds
from etkit_quant import snorm8

_q = torch.ops.quantized_decomposed


class _ActivationThenQuantize(torch.nn.Module):
    def __init__(self, activation: str, zero_point: int, quant_min: int) -> None:
        super().__init__()
        self.activation, self.zero_point, self.quant_min = activation, zero_point, quant_min
        self.conv = torch.nn.Conv2d(2, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = torch.relu(y) if self.activation == "relu" else torch.nn.functional.hardtanh(y, 0, 6)
        q = _q.quantize_per_tensor.default(
            y, 0.05, self.zero_point, self.quant_min, 127, torch.int8
        )
        return _q.dequantize_per_tensor.default(
            q, 0.05, self.zero_point, self.quant_min, 127, torch.int8
        )


def _edge_graph(activation: str, zero_point: int, quant_min: int) -> Any:
    model = _ActivationThenQuantize(activation, zero_point, quant_min).eval()
    program = torch.export.export(model, (torch.randn(1, 2, 4, 4),), strict=True)
    return to_edge(program).exported_program()


def _targets(graph_module: Any) -> list[str]:
    return [str(n.target) for n in graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("activation", ["relu", "hardtanh"])
@pytest.mark.parametrize(("zero_point", "quant_min"), [(0, -127), (-100, -128), (-127, -127)])
def test_activation_before_a_range_holding_negatives_becomes_a_clamp(
    activation: str, zero_point: int, quant_min: int
) -> None:
    program = _edge_graph(activation, zero_point, quant_min)
    graph_module = program.graph_module
    assert len(activations_at_risk(graph_module)) == 1
    x = torch.randn(1, 2, 4, 4) * 3
    before = program.module()(x)
    assert keep_activation_bounds(graph_module).modified
    targets = _targets(graph_module)
    assert not any("relu" in t or "hardtanh" in t for t in targets), targets
    assert sum("aten.clamp.default" in t for t in targets) == 1, targets
    after = program.module()(x)
    assert torch.equal(before, after)  # the same values, the bound now explicit
    assert not keep_activation_bounds(graph_module).modified  # idempotent


@pytest.mark.parametrize("activation", ["relu", "hardtanh"])
def test_activation_before_a_range_clipping_at_zero_is_left(activation: str) -> None:
    """An observer's range on a ReLU output (zero point at the int8 minimum): the backend's
    fusion is exact there, and the graph stays as it is."""
    graph_module = _edge_graph(activation, -128, -128).graph_module
    assert activations_at_risk(graph_module) == []
    assert not keep_activation_bounds(graph_module).modified


class _ConvReluOutput(torch.nn.Module):
    """A 1-channel image -> conv to 4 channels -> ReLU, the output quantized SNORM8."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_vgf_conv_relu_snorm8_output_matches_pt2e(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = _ConvReluOutput().eval()
    x = torch.rand(1, 1, 12, 10) * 2 - 1
    result = export_model(
        model,
        (x,),
        artifacts_root=tmp_path / "out",
        target="vgf",
        quantized_input_qspecs=(snorm8(),),
        quantized_output_qspecs=(snorm8(),),
    )
    from etkit_exporter.programs import load_program

    io = result.io_quant_params
    run = load_program(result.pte_path).run([program_input(x, io["inputs"][0])])
    actual = float_output(run.outputs[0], io["outputs"][0])
    with torch.no_grad():
        expected = result.converted_model(x)  # type: ignore[misc]
        assert bool((model.conv(x) < -0.1).any())  # the ReLU has values to remove
    steps = ((actual - expected).abs() / io["outputs"][0]["scale"]).round().max()
    assert int(steps) <= 1, f"{int(steps)} steps from the quantized PT2E model"
    assert float(actual.min()) >= 0.0


def test_upstream_arm_backend_drops_a_relu_before_a_quantize_holding_negatives() -> None:
    """Pins the upstream behaviour ``keep_activation_bounds`` works around: the Arm backend's
    ``FuseQuantizedActivationPass`` removes a conv's ReLU before an SNORM8 quantize (zero
    point 0, range [-127, 127]), whose integer output then holds negative values. When this
    fails, upstream keeps the ReLU and the workaround can go."""
    from executorch.backends.arm._passes.fuse_quantized_activation_pass import (
        FuseQuantizedActivationPass,
    )

    graph_module = _edge_graph("relu", 0, -127).graph_module
    assert any("relu" in t for t in _targets(graph_module))
    FuseQuantizedActivationPass()(graph_module)
    targets = _targets(graph_module)
    assert not any("relu" in t for t in targets), targets  # dropped upstream
