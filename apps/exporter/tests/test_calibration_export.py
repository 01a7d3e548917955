"""Honest default quantization: calibrated defaults, saturation reports, calibration files,
exposed grid-sampler qspecs; real exports verified in executorch.runtime."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import export_model
from etkit_exporter.core.calibration_data import CalibrationDataError, read_calibration
from etkit_quant import snorm8, snorm16


def _float_db(result: Any) -> float:
    (entry,) = [c for c in result.verification["comparisons"] if c["reference"] == "float model"]
    return float("inf") if entry["psnr_db"] is None else float(entry["psnr_db"])


class Classifier(torch.nn.Module):
    """An ImageNet-normalized input (values past [-1, 1]) and logits in about [-20, 20]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = F.adaptive_avg_pool2d(torch.relu(self.conv(image)), 1).flatten(1)
        return self.head(features) * 20


def _normalized_images(count: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return [((torch.rand(1, 3, 16, 16, generator=generator) - mean) / std,) for _ in range(count)]


@pytest.fixture(scope="module")
def classifier_default(tmp_path_factory: pytest.TempPathFactory) -> Any:
    samples = _normalized_images(8)
    return export_model(
        Classifier(), samples[0], artifacts_root=tmp_path_factory.mktemp("cls") / "out",
        calibration=samples, target="xnnpack", verify=True,
    )  # fmt: skip


def test_default_quantization_keeps_logits(classifier_default: Any) -> None:
    """Observed parameters where the data leaves [-1, 1]: the logits survive (a fixed SNORM8
    output turned them into garbage, -14.9 dB, before)."""
    io = classifier_default.io_quant_params
    assert io["inputs"][0]["scale"] > 1 / 127 and io["outputs"][0]["scale"] > 1 / 127
    assert _float_db(classifier_default) > 30
    assert all(record.passes() for record in classifier_default.saturation)


def test_a_fixed_range_that_clips_is_reported_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    samples = _normalized_images(4)
    with caplog.at_level(logging.WARNING, logger="etkit_exporter.export"):
        result = export_model(
            Classifier(), samples[0], artifacts_root=tmp_path / "out", calibration=samples,
            quantized_output_qspecs=(snorm8(),), target="xnnpack",
        )  # fmt: skip
    (record,) = [r for r in result.saturation if r.name.startswith("output 0")]
    assert not record.passes() and record.fraction > 0.001 and record.instead() is not None
    assert record.count == sum(int((Classifier()(*s).abs() > 1).sum()) for s in samples)
    warnings = [r.getMessage() for r in caplog.records if "saturation" in r.getMessage()]
    assert any("output 0" in w and "covers them" in w for w in warnings), warnings
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (entry,) = [e for e in report["saturation"] if e["name"].startswith("output 0")]
    assert entry["passes"] is False and entry["instead"]
    assert "**clips**" in (tmp_path / "out" / "report.md").read_text()


class WideWarp(torch.nn.Module):
    """A zeros-padded warp whose grid reaches +-1.5 (sample points outside the image)."""

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid * 1.5, padding_mode="zeros", align_corners=False)


def _wide_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    image = torch.rand(1, 4, 16, 16, generator=generator) * 2 - 1
    grid = torch.rand(1, 12, 12, 2, generator=generator) * 2 - 1
    return image, grid


def test_grid_scale_covers_the_calibrated_range(tmp_path: Path) -> None:
    inputs = _wide_inputs()
    default = export_model(
        WideWarp(), inputs, artifacts_root=tmp_path / "default", target="xnnpack", verify=True
    )
    (sampler,) = default.report["grid_samplers"]
    assert sampler["grid"]["scale"] == pytest.approx(2 / 32767)
    assert _float_db(default) > 35
    clipped = export_model(
        WideWarp(), inputs, artifacts_root=tmp_path / "snorm16", target="xnnpack", verify=True,
        grid_sampler_grid_qspec=snorm16(),
    )  # fmt: skip
    (grid,) = [r for r in clipped.saturation if r.name.endswith("grid")]
    assert not grid.passes() and grid.fraction > 0.2
    assert _float_db(clipped) < _float_db(default) - 5


def test_calibration_files_are_read_and_checked(tmp_path: Path) -> None:
    from PIL import Image

    example = (torch.zeros(1, 3, 4, 4),)
    folder = tmp_path / "cal"
    folder.mkdir()
    np.save(folder / "a.npy", np.full((1, 3, 4, 4), 0.5, dtype=np.float32))
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    pixels[0, 0] = (255, 0, 128)
    Image.fromarray(pixels).save(folder / "b.png")
    samples = read_calibration(str(folder), example, image_range=(-1.0, 1.0))
    assert len(samples) == 2 and torch.equal(samples[0][0], torch.full((1, 3, 4, 4), 0.5))
    assert samples[1][0][0, :, 0, 0].tolist() == pytest.approx(
        [1.0, -1.0, 128 / 255 * 2 - 1], abs=1e-6
    )
    with pytest.raises(CalibrationDataError, match=r"b\.png is an image: give --image-range"):
        read_calibration(str(folder), example)
    np.save(folder / "c.npy", np.zeros((1, 3, 5, 5), dtype=np.float32))
    with pytest.raises(CalibrationDataError, match=r"c\.npy: input 0 is float32 1x3x5x5"):
        read_calibration(str(folder), example, image_range=(0.0, 1.0))
    # an export of several sizes checks the size itself (export.sizes); the rest is checked
    sized = read_calibration(str(folder), example, image_range=(0.0, 1.0), any_size=True)
    assert [tuple(s[0].shape) for s in sized] == [(1, 3, 4, 4), (1, 3, 4, 4), (1, 3, 5, 5)]
    np.save(folder / "c.npy", np.zeros((1, 4, 5, 5), dtype=np.float32))
    with pytest.raises(CalibrationDataError, match=r"c\.npy: input 0 is float32 1x4x5x5"):
        read_calibration(str(folder), example, image_range=(0.0, 1.0), any_size=True)
    (folder / "c.npy").write_bytes(b"not an array")
    with pytest.raises(CalibrationDataError, match=r"c\.npy: not a readable \.npy"):
        read_calibration(str(folder), example, image_range=(0.0, 1.0))
    two = (torch.zeros(1, 3, 4, 4), torch.zeros(1, 2, 2, 2))
    torch.save(
        {"image": torch.ones(1, 3, 4, 4), "grid": torch.zeros(1, 2, 2, 2)}, tmp_path / "s.pt"
    )
    (sample,) = read_calibration(str(tmp_path / "*.pt"), two, input_names=["image", "grid"])
    assert torch.equal(sample[0], torch.ones(1, 3, 4, 4))


def test_cli_calibration_and_sampler_qspecs(tmp_path: Path) -> None:
    from etkit_exporter.cli.export import main

    (tmp_path / "wide_models.py").write_text(
        "import torch, torch.nn.functional as F\n"
        "class WideWarp(torch.nn.Module):\n"
        "    def forward(self, image, grid):\n"
        "        return F.grid_sample(image, grid * 1.5, align_corners=False)\n"
        "def make():\n"
        "    return WideWarp(), (torch.rand(1, 4, 8, 8) * 2 - 1, torch.rand(1, 6, 6, 2) * 2 - 1)\n"
    )
    folder = tmp_path / "cal"
    for k in range(3):
        (folder / f"s{k}").mkdir(parents=True)
        np.save(folder / f"s{k}" / "0_image.npy", np.random.rand(1, 4, 8, 8).astype("float32"))
        np.save(folder / f"s{k}" / "1_grid.npy", np.random.rand(1, 6, 6, 2).astype("float32"))
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        status = main(
            ["--model", "wide_models:make", "--calibration", str(folder), "--quant-grid", "q1.14",
             "--target", "xnnpack", "--out", str(tmp_path / "out")]
        )  # fmt: skip
    finally:
        sys.path.remove(str(tmp_path))
    assert status == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["grid_samplers"][0]["grid"]["scale"] == pytest.approx(2**-14)
    assert any(e["name"].endswith("grid") for e in report["saturation"])


class WarpConcatFeatures(torch.nn.Module):
    """A warped image concatenated with features three times wider than [-1, 1]: Arm's
    quantizer gives the concatenation one scale, the image's fixed SNORM8."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, 1, 1)
        self.fuse = torch.nn.Conv2d(8, 3, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        features = self.conv(image) * 3.0
        warped = F.grid_sample(torch.cat([image, image[:, :1]], 1), grid, align_corners=False)
        return self.fuse(torch.cat([warped, features], 1))


def test_clipping_inside_the_graph_is_reported_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fixed range the backend's quantizer shares over a concatenation clips the other
    inputs: the program matches the quantized model exactly and the float model at ~19 dB, and
    the only trace used to be that PSNR. It is a saturation record and a warning now."""
    torch.manual_seed(0)
    model = WarpConcatFeatures().eval()
    inputs = (torch.rand(1, 3, 16, 16) * 2 - 1, torch.rand(1, 16, 16, 2) * 2 - 1)
    with caplog.at_level(logging.WARNING, logger="etkit_exporter.export"):
        result = export_model(model, inputs, artifacts_root=tmp_path / "out", target="vgf")
    clipped = [r for r in result.saturation if r.name.startswith("tensor ")]
    assert clipped, [r.name for r in result.saturation]
    (record,) = clipped
    assert "cat" in record.name and not record.passes() and 0.2 < record.fraction < 0.5
    assert record.high == pytest.approx(1.0) and record.observed_max > 2
    warnings = [r.getMessage() for r in caplog.records if "saturation" in r.getMessage()]
    assert any(record.name in w for w in warnings), warnings
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any(e["name"] == record.name and not e["passes"] for e in report["saturation"])
    assert "**clips**" in (tmp_path / "out" / "report.md").read_text()


class PlainWarp(torch.nn.Module):
    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, align_corners=False)


def test_samplers_read_a_fixed_input_as_given_unless_its_range_is_far_too_wide(
    tmp_path: Path,
) -> None:
    """By default a grid sampler reads an image input with the input's fixed parameters (no
    requantize before it). An input range 100 times wider than its data would put the
    sampler's image / output scale past the kernel's 32 and leave it undelegated: then the
    sampler requantizes its image with its own calibrated qspec instead, and stays delegated.
    (Images in [-3, 3]: the calibrated image qspec is observed int8, affine, which PT2E does
    not merge with a symmetric input's.)"""
    from etkit_quant import covering, qformat

    generator = torch.Generator().manual_seed(3)
    inputs = (
        torch.rand(1, 4, 16, 16, generator=generator) * 6 - 3,
        torch.rand(1, 8, 8, 2, generator=generator) * 2 - 1,
    )
    for name, image_qspec, read_as_given in (
        ("fits", qformat(5), True),  # +-3.97
        ("too-wide", covering(300.0, torch.int8), False),
    ):
        result = export_model(
            PlainWarp(), inputs, artifacts_root=tmp_path / name, target="xnnpack",
            quantized_input_qspecs=(image_qspec, snorm16()), verify=True,
        )  # fmt: skip
        (sampler,) = result.report["grid_samplers"]  # delegated either way
        image_scale = result.io_quant_params["inputs"][0]["scale"]
        assert (sampler["image"]["scale"] == pytest.approx(image_scale)) == read_as_given
        assert _float_db(result) > (30 if read_as_given else 0)


def test_a_sampler_left_undelegated_is_reported_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Images in [-1, 1] given an input range of +-100: PT2E reads the sampler's image (SNORM8,
    symmetric like the input's) with the input's 100/127 steps, the image / output scale of
    100 is past the kernel's 32, and the sampler stays outside its delegate. The export says
    so on the console, naming the node and the reason, as the report's table does."""
    from etkit_quant import covering

    generator = torch.Generator().manual_seed(4)
    inputs = (
        torch.rand(1, 4, 16, 16, generator=generator) * 2 - 1,
        torch.rand(1, 8, 8, 2, generator=generator) * 2 - 1,
    )
    with caplog.at_level(logging.WARNING, logger="etkit_exporter.export"):
        result = export_model(
            PlainWarp(), inputs, artifacts_root=tmp_path / "wide", target="xnnpack",
            quantized_input_qspecs=(covering(100.0, torch.int8), snorm16()),
        )  # fmt: skip
    assert result.report["grid_samplers"] == []
    (outside,) = [o for o in result.report["outside_delegates"] if "grid_sampler" in o["op"]]
    warnings = [r.getMessage() for r in caplog.records if "is not delegated" in r.getMessage()]
    assert len(warnings) == 1 and outside["node"] in warnings[0]
    assert "exceeds 32" in warnings[0]
