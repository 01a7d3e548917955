"""A VGF program keeps SNORM8's [-127, 127] where its quantized model does
(``etkit_quant.narrow_ranges``): a conv whose output clips at the SNORM8 program output
verifies, and without the clamp the upstream fault still shows (a pin: ExecuTorch 1.5.1's Arm
backend lowers the output's quantize as a RESCALE, which clamps at -128; when that half fails,
the lowering keeps ``quant_min`` itself and the clamp may go)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from etkit_exporter import VerificationError, export_model
from etkit_quant import snorm8

quantize_module = importlib.import_module("etkit_quant.quantize")


class LoudConv(torch.nn.Module):
    """A conv whose output spans about [-1.6, 1.6]: a fifth of it clips at SNORM8's -1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.mul_(5.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _export(root: Path) -> object:
    x = torch.rand(1, 3, 12, 10, generator=torch.Generator().manual_seed(2)) * 2 - 1
    return export_model(
        LoudConv().eval(),
        (x,),
        target="vgf",
        artifacts_root=root,
        quantized_output_qspecs=(snorm8(),),
        verify=True,
    )


@pytest.mark.slow
def test_a_clipping_snorm8_output_keeps_its_range_on_vgf(tmp_path: Path) -> None:
    result = _export(tmp_path / "fixed")
    (judged,) = result.verification["verdict"]["outputs"]  # type: ignore[attr-defined]
    assert judged["passes"] and judged["max_steps"] <= 1, judged


@pytest.mark.slow
def test_upstream_arm_backend_clamps_int8_at_minus_128(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quantize_module, "clamp_narrow_ranges", lambda gm: [])
    with pytest.raises(VerificationError) as caught:
        _export(tmp_path / "unfixed")
    (failure,) = caught.value.failures
    assert failure["mean_steps"] < -0.05, failure
