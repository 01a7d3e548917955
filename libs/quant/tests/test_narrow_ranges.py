"""``clamp_narrow_ranges``: on Arm, a computed value quantized to a range narrower than its type
(SNORM8's [-127, 127]) gets a clamp in the same parameters, which the Arm backend lowers as an
integer ``CLAMP`` (its ``RESCALE`` clamps at [-128, 127] only); the quantized model's values do
not change."""

from __future__ import annotations

import importlib

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
from torch.fx import GraphModule

from etkit_quant import BoundaryQuantizer, quantize, snorm8
from etkit_quant.narrow_ranges import clamp_narrow_ranges

quantize_module = importlib.import_module("etkit_quant.quantize")


class ConvCat(torch.nn.Module):
    """A conv whose output (about [-1.5, 1.5]) is the SNORM8 program output, and the same
    output concatenated with the input (an op that only moves values: no clamp of its own)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.mul_(6.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y, torch.cat([x, x], 1)


def _inputs() -> tuple[torch.Tensor]:
    return (torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1,)


def _quantize(target: str) -> GraphModule:
    if target == "vgf":
        base: object = VgfQuantizer(VgfCompileSpec()).set_global(
            get_symmetric_quantization_config()
        )
    else:
        base = XNNPACKQuantizer().set_global(xnnpack_config())
    quantizer = BoundaryQuantizer(
        base,  # type: ignore[arg-type]
        input_qspecs=(snorm8(),),
        output_qspecs=(snorm8(), snorm8()),
    )
    return quantize(ConvCat().eval(), _inputs(), quantizer)


def _clamps(gm: GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.target is torch.ops.aten.clamp.default]


def test_on_arm_a_computed_snorm8_value_is_clamped_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gm = _quantize("vgf")
    (clamp,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clamp.default]
    low, high = clamp.args[1:3]
    assert low == pytest.approx(-1.0) and high == pytest.approx(1.0)
    (dq,) = clamp.all_input_nodes
    assert "conv" in dq.args[0].args[0].name  # the conv's quantize, not the input or the cat
    monkeypatch.setattr(quantize_module, "clamp_narrow_ranges", lambda gm: [])
    unclamped = _quantize("vgf")
    assert _clamps(unclamped) == []
    with torch.no_grad():
        y, c = gm(*_inputs())
        y0, c0 = unclamped(*_inputs())
    assert float(y.min()) == pytest.approx(-1.0) and float(y0.min()) == pytest.approx(-1.0)
    assert torch.equal(y, y0) and torch.equal(c, c0)


def test_xnnpack_models_get_no_clamp() -> None:
    assert _clamps(_quantize("xnnpack")) == []


def test_the_rewrite_is_idempotent() -> None:
    gm = _quantize("vgf")
    assert clamp_narrow_ranges(gm) == []
    assert len(_clamps(gm)) == 1
