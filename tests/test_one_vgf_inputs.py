"""A grid sampler that reads a VGF input directly (its image or grid, looking through
quantize/dequantize and layout ops, comes from outside the VGF partition) stays inside the VGF as
a compute segment: the graph segment before it computes an identity copy of that input (a
RESCALE of scale 1) for it to read. Without the copy, model-converter 0.11 gives such a compute
segment an input resource the VGF never declares when other VGF ops read the same input
(scenario_runner: "No resource found for VGF binding"), and exits 255 when both the image and
the grid are VGF inputs. Both fuzzer-found shapes must export as one VGF delegate and compute
the quantized PT2E model's integers exactly. Real toolchain throughout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import ExportResult, export_model
from etkit_exporter.programs import load_program
from etkit_gridsampler.vgf_shader import IN_VGF


def _flow_to_grid(flow: torch.Tensor) -> torch.Tensor:
    """RIFE's warp arithmetic (align_corners=False): pixel grid + flow in pixels, normalized."""
    n, _, height, width = flow.shape
    xs = (torch.arange(width) + 0.5) * (2.0 / width) - 1.0
    ys = (torch.arange(height) + 0.5) * (2.0 / height) - 1.0
    base = torch.cat(
        [
            xs.view(1, 1, 1, width).expand(n, -1, height, -1),
            ys.view(1, 1, height, 1).expand(n, -1, -1, width),
        ],
        1,
    )
    normalized = torch.cat([flow[:, 0:1] / (width / 2.0), flow[:, 1:2] / (height / 2.0)], 1)
    return (base + normalized).permute(0, 2, 3, 1)


def _random(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


class _WarpsItsInput(torch.nn.Module):
    """A 1x1 conv predicts a flow from the image; the sampler warps that same input image (the
    input feeds a graph op and the sampler)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(158360665)
        self.flow = torch.nn.Conv2d(9, 2, 1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor]:
        grid = _flow_to_grid(self.flow(image) * 4.0)
        warped = F.grid_sample(
            image, grid, mode="nearest", padding_mode="border", align_corners=True
        )
        return (warped,)


class _SamplesTwoInputs(torch.nn.Module):
    """The image and grid inputs go straight into the sampler; a conv and a sigmoid follow."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(859016936)
        self.conv = torch.nn.Conv2d(4, 1, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor]:
        sampled = F.grid_sample(
            image, grid, mode="nearest", padding_mode="border", align_corners=True
        )
        return (torch.sigmoid(self.conv(sampled)) * 10.0,)


class _WarpsASliceOfItsInput(torch.nn.Module):
    """As ``_WarpsItsInput``, through a slice of the whole input (``x[:, 0:4]`` of 4 channels),
    which the Arm lowering folds away: the sampler reads the VGF input itself."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(110267531)
        self.flow = torch.nn.Conv2d(4, 2, 1)
        self.head = torch.nn.Conv2d(4, 13, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        grid = torch.tanh(self.flow(x)).permute(0, 2, 3, 1)
        warped = F.grid_sample(
            x[:, 0:4], grid, mode="bilinear", padding_mode="border", align_corners=True
        )
        return (self.head(warped),)


def _warps_a_slice_of_its_input() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _WarpsASliceOfItsInput().eval(), (_random((1, 4, 17, 20), 568981297),)


def _warps_its_input() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _WarpsItsInput().eval(), (_random((1, 9, 4, 4), 651359108),)


def _samples_two_inputs() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    image, grid = _random((1, 4, 9, 12), 12570483), _random((1, 10, 3, 2), 719543061)
    return _SamplesTwoInputs().eval(), (image, grid)


@pytest.fixture(
    scope="module",
    params=[  # a sampler reading a VGF input: a slice of it and two inputs in CI
        pytest.param(_warps_its_input, marks=pytest.mark.extended),
        _samples_two_inputs,
        _warps_a_slice_of_its_input,
    ],
)
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ExportResult:
    model, inputs = request.param()
    root = tmp_path_factory.mktemp("vgf-input") / "out"
    return export_model(model, inputs, target="vgf", artifacts_root=root, verify=True)


def test_sampler_reading_a_vgf_input_is_a_compute_segment_of_the_one_vgf(
    exported: ExportResult,
) -> None:
    (path,) = exported.report["grid_sampler_paths"]
    assert (path["path"], path["reason"]) == (IN_VGF, None)
    assert exported.pte_path is not None
    assert [d.backend_id for d in load_program(exported.pte_path).delegates] == ["VgfBackend"]
    assert exported.verification is not None
    (compared,) = exported.verification["verdict"]["outputs"]
    assert compared["reference"] == "quantized PT2E model"
    assert compared["max_steps"] <= 1  # the conv after the slice case: 1 step (rounding)
