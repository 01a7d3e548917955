"""A model whose output is a bicubic upsample (a super-resolution skip path): Arm's quantizer
leaves the upsample's decomposition in float, and the VGF then ended in the quantize of a float
result, which ExecuTorch 1.5.1's Arm backend folds away: the VGF declared a float32 output where
the program holds int8, and the program could not run. ``DetagQuantizeOfFloatResults`` leaves
that quantize to the portable kernel; the program runs and verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import export_model


class BicubicSkip(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.conv(x), scale_factor=2, mode="bicubic", align_corners=False)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["vgf", "xnnpack"])
def test_bicubic_upsample_output_runs_and_verifies(tmp_path: Path, target: str) -> None:
    x = torch.rand(1, 3, 10, 13, generator=torch.Generator().manual_seed(3))
    result = export_model(
        BicubicSkip().eval(), (x,), target=target, artifacts_root=tmp_path, verify=True
    )
    assert result.verification is not None
    (judged,) = result.verification["verdict"]["outputs"]
    assert judged["max_steps"] <= 1, judged
