"""The export's profile (``etkit_exporter.export.pass_profile``): exclusive seconds per pass,
partitioner, quantizer, backend and tool; every patch undone; timings.json's ``profile_s`` of a
real export and ``etkit-export --profile``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir.backend.partitioner import Partitioner
from executorch.exir.pass_base import ExportPass
from torch.fx.passes.infra.pass_base import PassBase

from etkit_exporter import export_model
from etkit_exporter.cli.export import main
from etkit_exporter.export import pass_profile
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.export.pass_profile import PassProfile, profile_text, profiled


class _Clock:
    """perf_counter for the profile: advanced by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_call_inside_another_counts_in_its_own_row_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(pass_profile.time, "perf_counter", clock)
    profile = PassProfile(stage="lower_main")
    with profile.measure("partitioner", "Outer", "etkit"):
        clock.now += 1.0
        with profile.measure("partitioner", "Inner", "upstream"):
            clock.now += 3.0
        with profile.measure("partitioner", "Inner", "upstream"):
            clock.now += 2.0
        clock.now += 0.5
    rows = profile.rows["lower_main"]
    assert rows[("partitioner", "Outer", "etkit")].seconds == pytest.approx(1.5)
    inner = rows[("partitioner", "Inner", "upstream")]
    assert (inner.calls, inner.seconds) == (2, pytest.approx(5.0))
    section = profile.section({"lower_main": 7.0, "normalize": 1.0, "serialize": 2.0})
    stage = section["stages"]["lower_main"]
    assert [r["name"] for r in stage["rows"]] == ["Inner", "Outer"]  # most seconds first
    assert stage["unattributed"] == pytest.approx(0.5)
    # etkit's share: a stage of etkit's whole (normalize) and etkit's rows of the others
    assert section["etkit_seconds"] == pytest.approx(2.5)
    assert section["etkit_share"] == pytest.approx(2.5 / 10.0)
    text = profile_text(section)
    assert text[0] == "profile: etkit's own code 2.5 s of 10.0 s (25.0 %)"
    assert "Inner (upstream)" in text[2] and "2x" in text[2]


class _Doubles(ExportPass):
    pass


class _Overrides(ExportPass):
    """A pass with its own ``__call__`` that calls its base's, as Arm's ``ArmPass`` does."""

    def __call__(self, graph_module: Any) -> Any:
        return super().__call__(graph_module)


def test_profiled_times_passes_and_tools_and_undoes_every_patch() -> None:
    originals = (PassBase.__call__, Partitioner.__dict__.get("partition"), subprocess.run)
    profile = PassProfile(stage="lower_main")
    program = torch.export.export(torch.nn.ReLU(), (torch.ones(2),))
    with profiled(profile):
        _Doubles()(program.graph_module)
        _Overrides()(program.graph_module)
        subprocess.run(["true"], check=True)
    rows = profile.rows["lower_main"]
    assert rows[("pass", "_Doubles", "upstream")].calls == 1  # defined in a test, not etkit's
    assert rows[("pass", "_Overrides", "upstream")].calls == 1  # its override and base: once
    assert rows[("tool", "true", "upstream")].calls == 1
    assert (PassBase.__call__, Partitioner.__dict__.get("partition"), subprocess.run) == originals
    with pytest.raises(RuntimeError, match="inside"), profiled(PassProfile()):
        raise RuntimeError("inside")
    assert (PassBase.__call__, Partitioner.__dict__.get("partition"), subprocess.run) == originals


@pytest.fixture(scope="module")
def profiled_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, inputs = DEMOS["flow-warp"]()
    root = tmp_path_factory.mktemp("profile") / "flow-warp"
    return export_model(model, inputs, artifacts_root=root, target="xnnpack")


def test_an_export_profiles_its_lowering_in_timings_json(profiled_export: Any) -> None:
    folder: Path = profiled_export.artifacts_root
    timings = json.loads((folder / "timings.json").read_text())
    assert "profile_s" not in json.loads((folder / "report.json").read_text())  # it varies
    profile = timings["profile_s"]
    lower = profile["stages"]["lower_main"]
    assert lower["seconds"] == timings["timings_s"]["lower_main"]
    rows = {(r["what"], r["name"], r["origin"]): r for r in lower["rows"]}
    assert ("preprocess", "XnnpackBackend", "upstream") in rows
    assert ("partitioner", "PolicyPartitioner", "etkit") in rows  # etkit's policies
    assert ("partitioner", "XnnpackPartitioner", "upstream") in rows  # called by them
    assert ("decompositions", "run_decompositions", "upstream") in rows
    attributed = sum(r["seconds"] for r in lower["rows"])
    rounding = 5e-4 * len(lower["rows"]) + 1e-3  # each row and the stage rounded to 1 ms
    assert attributed <= lower["seconds"] + rounding
    assert lower["unattributed"] == pytest.approx(lower["seconds"] - attributed, abs=rounding)
    grid = profile["stages"]["lower_grid_sampler"]["rows"]
    assert {(r["name"], r["origin"]) for r in grid} >= {
        ("GridSamplerPartitioner", "etkit"),
        ("GridSamplerBackend", "etkit"),
    }
    assert 0 < profile["etkit_share"] < 1
    assert profile["total_seconds"] == pytest.approx(sum(timings["timings_s"].values()), abs=0.01)


def test_etkit_export_profile_prints_the_slowest_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["demo", "resample", "--target", "xnnpack", "--out", str(tmp_path / "out"),
                   "--profile"])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    lines = printed.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("profile: etkit's own code"))
    assert any(line.startswith("  lower_main: ") for line in lines[start:])
    assert any("preprocess" in line and "XnnpackBackend (upstream)" in line for line in lines)
