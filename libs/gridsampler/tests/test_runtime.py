"""A .pte whose delegate names the grid-sampler backend runs in executorch.runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

from etkit_gridsampler import GridSampleOp, GridSamplerPartitioner, cpu, runtime


class Resample(torch.nn.Module):
    def __init__(self, mode: str, padding: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = flow * 0.5  # computed in the graph (exactly), left to the portable kernels
        return F.grid_sample(
            image, grid, mode=self.mode, padding_mode=self.padding, align_corners=self.align_corners
        )


def _lower(model: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> Path:
    exported = torch.export.export(model, example, strict=True)
    partitioner = GridSamplerPartitioner()
    program = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    delegates = [n for n in program.exported_program().graph.nodes if n.op == "get_attr"]
    assert len(delegates) == 1 and not partitioner.rejections
    path.write_bytes(program.to_executorch().buffer)
    return path


def test_register_is_idempotent() -> None:
    assert runtime.register() == runtime.BACKEND_ID
    assert runtime.register() == runtime.BACKEND_ID
    assert runtime.is_registered()


@pytest.mark.parametrize(
    ("mode", "padding", "align_corners"),
    [("bilinear", "zeros", False), ("nearest", "reflection", True), ("bilinear", "border", True)],
)
def test_pte_runs_and_matches_cpu_kernel(
    tmp_path: Path, mode: str, padding: str, align_corners: bool
) -> None:
    torch.manual_seed(0)
    image, flow = torch.randn(2, 4, 6, 10), torch.randn(2, 5, 7, 2)
    model = Resample(mode, padding, align_corners).eval()
    pte = _lower(model, (image, flow), tmp_path / "resample.pte")
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    (output,) = method.execute([image, flow])
    op = GridSampleOp(mode=mode, padding_mode=padding, align_corners=align_corners)  # type: ignore[arg-type]
    assert torch.equal(output, cpu.grid_sample(image, flow * 0.5, op))
    torch.testing.assert_close(output, model(image, flow), atol=1e-5, rtol=0)
