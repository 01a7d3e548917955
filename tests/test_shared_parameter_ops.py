"""Ops that backends compute on the integers themselves (``cat``, reshapes, max-pool) get their
inputs in their output's parameters (``etkit_quant.requantize_shared_inputs``): a VGF program
with a ``cat`` of a fine-scaled flow and SNORM8 features verifies, and without the rewrite the
upstream bug still shows (a pin: when that half fails, the Arm backend rescales such inputs
itself and the rewrite may go)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from etkit_exporter import VerificationError, export_model
from etkit_quant import fixed, snorm8

# the module, not the function the package exports under its name
quantize_module = importlib.import_module("etkit_quant.quantize")


class FlowUpdate(torch.nn.Module):
    """RAFT's update step: correlation lookups reshaped into channels, concatenated with the
    flow (scale 0.00293, a fraction of a pixel) and context features, a conv predicting the
    flow's change, added to the flow."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(9 + 9 + 2 + 8, 2, 3, padding=1)

    def forward(
        self, s0: torch.Tensor, s1: torch.Tensor, flow: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        n, _, h, w = flow.shape
        corr = torch.cat([s0.view(n, h, w, -1), s1.view(n, h, w, -1)], dim=-1)
        return self.conv(torch.cat([corr.permute(0, 3, 1, 2), flow, context], 1))


def _export(root: Path) -> object:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs = (
        (torch.rand(64, 1, 3, 3, generator=g) * 2 - 1) * 0.5,
        (torch.rand(64, 1, 3, 3, generator=g) * 2 - 1) * 0.5,
        (torch.rand(1, 2, 8, 8, generator=g) * 2 - 1) * 0.35,
        torch.rand(1, 8, 8, 8, generator=g),
    )
    return export_model(
        FlowUpdate().eval(),
        inputs,
        artifacts_root=root,
        quantized_input_qspecs=(
            snorm8(),
            snorm8(),
            fixed(0.00293, 0, torch.int8, -127, 127),
            snorm8(),
        ),
        quantized_output_qspecs=(None,),
        target="vgf",
        verify=True,
        scenario=False,
    )


@pytest.mark.slow
def test_vgf_cat_of_differently_scaled_inputs_verifies(tmp_path: Path) -> None:
    result = _export(tmp_path / "fixed")
    verdict = result.verification["verdict"]  # type: ignore[attr-defined]
    assert verdict["result"] == "pass", verdict


@pytest.mark.slow
def test_upstream_arm_backend_concatenates_differently_scaled_int8_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quantize_module, "requantize_shared_inputs", lambda gm: [])
    with pytest.raises(VerificationError) as caught:
        _export(tmp_path / "unfixed")
    (failure,) = caught.value.failures
    assert failure["psnr_db"] < 32, failure  # measured 28.4 dB
