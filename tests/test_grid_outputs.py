"""A sampling grid the program returns (an ``affine_grid`` of a predicted theta, for the
engine's own sampler): an ``affine_grid`` the program returns is coordinate arithmetic. It stays
float and is quantized once, on its way out, with the output's qspec (SNORM8 by default; give
``snorm16()`` for a finer grid). A grid-shaped output in general is not taken for a grid: an
image 2 pixels wide is N x C x H x 2 (that rule gave a clamp's output int16, and XNNPACK's
runtime crashed loading the program). Before, the output's int8 qspec made the
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
    assert output["dtype"] == "int8"  # an output's default: SNORM8 for values in [-1, 1]
    assert output["scale"] == pytest.approx(1 / 127)
    assert exported.verification is not None
    assert exported.verification["verdict"]["result"] == "pass"
    (float_row,) = [
        c for c in exported.verification["comparisons"] if c["reference"] == "float model"
    ]
    assert float_row["psnr_db"] > 40.0  # one int8 rounding of values in [-1, 1]: about 48 dB


def test_the_affine_grid_runs_in_float_as_coordinate_arithmetic(exported: ExportResult) -> None:
    floats = exported.report["float_ops"]
    reasons = {r["reason"] for r in floats["ops"] if "affine_grid" in str(r.get("source"))}
    assert reasons == {"coordinate arithmetic"}, floats["ops"]
