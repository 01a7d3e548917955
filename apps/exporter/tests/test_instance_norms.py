"""Instance norms on XNNPACK (issue 39): the export writes each as its moments
(``etkit_partition.instance_norms_as_moments``), which XNNPACK lowers, so none is left outside
the delegates as a portable ``_native_batch_norm_legit.no_stats`` (RAFT-small had 21, 21 % of
its time); the program verifies against its quantized model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import export_model


class NormedWarp(torch.nn.Module):
    """RAFT's encoder in small: a strided conv, an instance norm (affine and not), a ReLU, a
    flow head; frame 1 warped by the flow."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(6, 16, 3, padding=1)
        self.norm = torch.nn.InstanceNorm2d(16, affine=True)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.norm2 = torch.nn.InstanceNorm2d(16)
        self.head = torch.nn.Conv2d(16, 2, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv(torch.cat([frame0, frame1], 1))))
        x = torch.relu(self.norm2(self.conv2(x)))
        flow = torch.tanh(self.head(x)) * 0.1
        grid = flow.permute(0, 2, 3, 1) + _pixel_grid(frame1)
        return F.grid_sample(frame1, grid, padding_mode="border", align_corners=True)


def _pixel_grid(frame: torch.Tensor) -> torch.Tensor:
    _, _, h, w = frame.shape
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    return torch.stack([xs, ys], -1).unsqueeze(0)


@pytest.mark.slow
def test_instance_norms_run_inside_xnnpack_and_the_program_verifies(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = NormedWarp().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.3, 0.3)
    frame = torch.rand(1, 3, 24, 40) * 2 - 1
    inputs = (frame, torch.roll(frame, shifts=(1, 2), dims=(2, 3)))
    result = export_model(
        model, inputs, artifacts_root=tmp_path / "normed", target="xnnpack", verify=True
    )
    outside = [o["op"] for o in result.report["outside_delegates"]]
    assert not [op for op in outside if "batch_norm" in op or "rsqrt" in op], outside
    ops = {op for p in result.report["partitions"] for op in p["ops"]}
    assert {"aten::rsqrt", "aten::mean.dim"} <= ops, ops
    assert result.verification["verdict"]["result"] == "pass"
