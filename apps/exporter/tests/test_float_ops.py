"""The "Float ops" report: every op the lowered program runs in float, where and why, on both
targets, for a flow estimator (three convs predict a flow in pixels; frame 0 is warped by it):
by default exactly the coordinate arithmetic, no conv."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter.artifact.float_ops import (
    COORDINATE_ARITHMETIC,
    USER_CHOICE,
    heavy_warnings,
    summary,
)
from etkit_exporter.cli.export import _summary
from etkit_exporter.export.pipeline import ExportResult, export_model


def warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    _, _, height, width = flow.shape
    ys, xs = torch.meshgrid(
        torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij"
    )
    grid = torch.stack((xs, ys), 0).unsqueeze(0)
    scale = torch.tensor([(width - 1) / 2, (height - 1) / 2]).view(1, 2, 1, 1)
    positions = (grid + flow / scale).permute(0, 2, 3, 1)
    return F.grid_sample(image, positions, padding_mode="border", align_corners=True)


def _lines_of(function: Any) -> range:
    source, first = inspect.getsourcelines(function)
    return range(first, first + len(source))


def _line(source: str) -> int:
    """The line number of a float op's ``file:line: code``, in this file (-1 elsewhere)."""
    name, line, _ = source.split(":", 2)
    return int(line) if name == Path(__file__).name else -1


class FlowEstimator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(6, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 3, padding=1),
        )
        with torch.no_grad():  # a flow of tens of pixels: int8 costs a tenth of a pixel
            self.net[4].weight.mul_(16.0)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        return warp(frame0, self.net(torch.cat([frame0, frame1], 1)) * 16)


def _export(target: str, folder: Path, **kwargs: Any) -> ExportResult:
    torch.manual_seed(5)
    model = FlowEstimator().eval()
    frames = (torch.rand(1, 3, 12, 16) * 2 - 1, torch.rand(1, 3, 12, 16) * 2 - 1)
    return export_model(model, frames, artifacts_root=folder / target, target=target, **kwargs)


@pytest.fixture(scope="module", params=["xnnpack", "vgf"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ExportResult:
    return _export(request.param, tmp_path_factory.mktemp("float-ops"))


def test_the_float_ops_are_exactly_the_coordinate_arithmetic(exported: ExportResult) -> None:
    section = exported.report["float_ops"]
    ops = section["ops"]
    assert ops, "the coordinate arithmetic runs in float"
    assert section["warnings"] == []
    for op in ops:
        assert op["reason"] == COORDINATE_ARITHMETIC, op
        assert op["kind"] is None, op  # no conv, linear, matmul, pooling or resize
        # the model's coordinate arithmetic: warp(), and the flow's scaling after the last conv
        assert _line(op["source"]) in (*_lines_of(warp), _lines_of(FlowEstimator.forward)[-1]), op
    sources = {op["source"] for op in ops}
    assert any("positions = (grid + flow / scale)" in s for s in sources)


def test_the_report_shows_them(exported: ExportResult) -> None:
    folder = exported.artifacts_root
    written = json.loads((folder / "report.json").read_text())
    assert written["float_ops"]["ops"] == exported.report["float_ops"]["ops"]
    markdown = (folder / "report.md").read_text()
    assert "## Float ops" in markdown
    assert "| op | node | where | source line | why float |" in markdown
    assert markdown.count(f"| {COORDINATE_ARITHMETIC} |") == len(written["float_ops"]["ops"])
    line = summary_line(exported)
    assert line.startswith(f"{len(written['float_ops']['ops'])} ops run in float: ")
    assert line.endswith(f"({COORDINATE_ARITHMETIC})")


def summary_line(result: ExportResult) -> str:
    (line,) = [x for x in _summary(result, 1.0).splitlines() if "run in float" in x]
    return line


def test_the_vgf_tosa_has_no_float_conv(exported: ExportResult) -> None:
    if exported.report["target"] != "vgf":  # no TOSA: nothing to read
        assert "tosa" not in exported.report["float_ops"]
        return
    tosa = exported.report["float_ops"]["tosa"]
    assert tosa
    for counts in tosa.values():
        assert "CONV2D" not in counts and "MATMUL" not in counts, counts


def test_grid_math_int_and_a_float_output(tmp_path: Path) -> None:
    """``grid_math="int"``: nothing is float for being coordinate arithmetic; a float output
    asked for by the user makes the conv computing it float, and that is warned about."""
    torch.manual_seed(5)

    class Refined(FlowEstimator):
        def __init__(self) -> None:
            super().__init__()
            self.refine = torch.nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
            return self.refine(super().forward(frame0, frame1))

    frames = (torch.rand(1, 3, 12, 16) * 2 - 1, torch.rand(1, 3, 12, 16) * 2 - 1)
    result = export_model(
        Refined().eval(),
        frames,
        artifacts_root=tmp_path / "int",
        target="xnnpack",
        grid_math="int",
        quantized_output_qspecs=(None,),
    )
    section = result.report["float_ops"]
    assert section["grid_math"] == "int"
    assert not [op for op in section["ops"] if op["reason"] == COORDINATE_ARITHMETIC]
    convs = [op for op in section["ops"] if op["kind"] == "conv"]
    assert len(convs) == 1 and convs[0]["reason"] == USER_CHOICE
    assert "self.refine(" in convs[0]["source"]
    (warning,) = section["warnings"]
    assert warning.startswith("a conv runs in float (aten::convolution")


def test_grid_math_is_checked_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="grid_math must be one of 'float', 'int', got 'int8'"):
        export_model(
            FlowEstimator().eval(),
            (torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8)),
            artifacts_root=tmp_path / "x",
            grid_math="int8",
        )
    assert not (tmp_path / "x").exists()


def test_summary_and_warnings_of_nothing() -> None:
    assert summary([]) == "no op runs in float"
    assert heavy_warnings([]) == []


def test_the_report_says_how_the_flow_is_quantized(exported: ExportResult) -> None:
    """The flow (pixels, up to a few) entering the coordinate arithmetic: int8 moves sampling
    positions by a measurable fraction of a pixel; VGF takes int16 for it past the tolerance,
    XNNPACK has no int16 activations and stays int8, saying so."""
    entering = exported.report["float_ops"]["coordinate_inputs"]
    assert entering["inputs"] == ["conv2d_2"]  # the flow conv; its scaling (* 16) is float
    assert entering["int8_position_error_px"] > entering["tolerance_px"]
    if exported.report["target"] == "vgf":
        assert entering["qspec"].startswith("int16")
    else:
        assert entering["qspec"].startswith("int8") and "no int16 activations" in entering["why"]


def test_the_cli_takes_grid_math_and_prints_the_float_ops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from etkit_exporter.cli.export import main

    assert (
        main(
            ["demo", "flow-warp", "-t", "xnnpack", "--grid-math", "int", "-o", str(tmp_path / "a")]
        )
        == 0
    )
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "in float" in x]
    assert "coordinate arithmetic" not in line
    assert 'grid-math = "int"' in (tmp_path / "a" / "export.toml").read_text()
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["float_ops"]["grid_math"] == "int"
    (tmp_path / "bad.toml").write_text('demo = "flow-warp"\ngrid-math = "fp16"\n')
    assert main(["--config", str(tmp_path / "bad.toml"), "-o", str(tmp_path / "b")]) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert "grid_math must be one of 'float', 'int', got 'fp16'" in error
    assert not (tmp_path / "b").exists()


class RifeWarp(FlowEstimator):
    """The flow converted to grid units channel by channel, as RIFE's warplayer writes it."""

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        flow = self.net(torch.cat([frame0, frame1], 1)) * 16
        _, _, height, width = flow.shape
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij"
        )
        normalized = torch.cat(
            [flow[:, 0:1] / ((width - 1) / 2), flow[:, 1:2] / ((height - 1) / 2)], 1
        )
        positions = (torch.stack((xs, ys), 0).unsqueeze(0) + normalized).permute(0, 2, 3, 1)
        return F.grid_sample(frame0, positions, padding_mode="border", align_corners=True)


@pytest.mark.parametrize("grid_math", ["float", "int"])
def test_channel_by_channel_scaling_is_one_op_where_it_stays_float(
    tmp_path: Path, grid_math: str
) -> None:
    """Float coordinate arithmetic: RIFE's per-channel slices, divides and cat are one divide by
    a per-channel constant (``etkit_quant.channel_ops``), reported at the cat's line, and the
    program verifies; int grid math keeps them as written (each quantized as the model has it)."""
    torch.manual_seed(5)
    frames = (torch.rand(1, 3, 12, 16) * 2 - 1, torch.rand(1, 3, 12, 16) * 2 - 1)
    result = export_model(RifeWarp().eval(), frames, artifacts_root=tmp_path / grid_math,
                          target="xnnpack", grid_math=grid_math, verify=True)  # fmt: skip
    assert result.verification is not None and result.verification["verdict"]["result"] == "pass"
    assert result.converted_model is not None  # the quantized model the program computes
    converted = [str(n.target) for n in result.converted_model.graph.nodes]
    slices = [t for t in converted if "slice" in t]
    ops = {op["op"]: op for op in result.report["float_ops"]["ops"]}
    if grid_math == "float":
        assert not slices and not [op for op in ops if "slice" in op or "cat" in op], sorted(ops)
        divides = [op for name, op in ops.items() if "div" in name]
        assert len(divides) == 1 and "normalized = torch.cat(" in divides[0]["source"], divides
    else:
        assert len(slices) == 2, converted  # flow[:, 0:1], flow[:, 1:2], each divided alone
