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


def _resample_pte(tmp_path: Path, image: torch.Tensor, flow: torch.Tensor) -> Path:
    model = Resample("bilinear", "border", False).eval()
    return _lower(model, (image, flow), tmp_path / "resample.pte")


def test_channels_last_tensors_are_honoured(tmp_path: Path) -> None:
    torch.manual_seed(1)
    image = torch.randn(1, 4, 6, 10).contiguous(memory_format=torch.channels_last)
    flow = torch.randn(1, 5, 7, 2)
    pte = _resample_pte(tmp_path, image, flow)
    runtime.register()
    (output,) = Runtime.get().load_program(pte).load_method("forward").execute([image, flow])
    op = GridSampleOp(mode="bilinear", padding_mode="border", align_corners=False)
    expected = cpu.grid_sample(image, flow * 0.5, op)
    assert torch.equal(output.contiguous(), expected.contiguous())


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [(4, 9, "newer"), (20, None, "checksum"), (0, 0x58, "magic")],
    ids=["newer-version", "corrupt", "bad-magic"],
)
def test_bad_blob_in_a_pte_is_refused_at_load(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], offset: int, value: int | None, message: str
) -> None:
    torch.manual_seed(2)
    image, flow = torch.randn(1, 2, 4, 4), torch.randn(1, 3, 3, 2)
    data = bytearray(_resample_pte(tmp_path, image, flow).read_bytes())
    start = data.find(b"ETGS")
    assert start >= 0
    data[start + offset] = (data[start + offset] ^ 0xFF) if value is None else value
    broken = tmp_path / "broken.pte"
    broken.write_bytes(bytes(data))
    runtime.register()
    program = Runtime.get().load_program(broken)
    with pytest.raises(RuntimeError):
        program.load_method("forward")
    assert message in capfd.readouterr().err  # the backend says why
