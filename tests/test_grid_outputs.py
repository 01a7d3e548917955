"""A sampling grid the program returns (an ``affine_grid`` of a predicted theta, for the
engine's own sampler): grid-shaped float outputs (N x H x W x 2) are grids, as grid-shaped
inputs are. The coordinate arithmetic computing one stays float and is quantized once, on its
way out, to a grid's qspec (SNORM16 in [-1, 1]). Before, the output's int8 qspec made the
``affine_grid`` an integer op, and Arm's lowering decomposed it with float constants against
integer inputs ("TosaValueError: Expected matching dtypes but got torch.float32 and
torch.int8"; a fuzzer find). Real toolchain, both targets, verified."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import ExportResult, export_model


class _ReturnsItsGrid(torch.nn.Module):
    """A localization head whose affine grid is the output; no sampler reads it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(7, 8, 3, padding=1)
        self.linear = torch.nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.linear(self.conv(x).mean((2, 3))).view(-1, 2, 3)
        return F.affine_grid(theta, [1, 1, 8, 4], align_corners=False)


@pytest.fixture(scope="module", params=["vgf", "xnnpack"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ExportResult:
    inputs = (torch.rand(1, 7, 16, 8, generator=torch.Generator().manual_seed(1)),)
    root = tmp_path_factory.mktemp("grid-output") / request.param
    return export_model(
        _ReturnsItsGrid().eval(), inputs, target=request.param, artifacts_root=root, verify=True
    )


def test_a_returned_grid_is_quantized_as_a_grid_and_verifies(exported: ExportResult) -> None:
    (output,) = exported.io_quant_params["outputs"]
    assert output["dtype"] == "int16"
    assert output["scale"] == pytest.approx(1 / 32767)
    assert exported.verification is not None
    assert exported.verification["verdict"]["result"] == "pass"
    (float_row,) = [
        c for c in exported.verification["comparisons"] if c["reference"] == "float model"
    ]
    assert float_row["psnr_db"] > 55.0  # int16 grid from an int8 theta: 60.3 dB measured


def test_the_affine_grid_runs_in_float_as_coordinate_arithmetic(exported: ExportResult) -> None:
    floats = exported.report["float_ops"]
    reasons = {r["reason"] for r in floats["ops"] if "affine_grid" in str(r.get("source"))}
    assert reasons == {"coordinate arithmetic"}, floats["ops"]
