"""``etkit run``: a real VGF export run from files, its outputs written; bad programs and inputs
refused with one line and no output files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from etkit_exporter import export_model
from etkit_exporter.cli.main import main
from etkit_exporter.export.demos import DEMOS


@pytest.fixture(scope="module")
def stn_vgf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, inputs = DEMOS["stn"]()
    # verified too (test_stn_vgf_verifies_on_vulkan); the scenario check then reuses the
    # verified run's outputs
    root = tmp_path_factory.mktemp("run") / "stn"
    return export_model(model, inputs, artifacts_root=root, scenario=True, verify=True)


def test_stn_vgf_verifies_on_vulkan(stn_vgf: Any) -> None:
    """The VGF program as written, run whole (the VGF on lavapipe through scenario_runner, its
    sampler a compute segment inside it), within one int8 step of the quantized model; the
    float model's picture in report.md and the manifest."""
    result, root = stn_vgf, stn_vgf.artifacts_root
    assert result.verification is not None and "scenario_runner" in result.verification["runner"]
    (quantized,) = [
        c for c in result.verification["comparisons"] if c["reference"] == "quantized PT2E model"
    ]
    assert quantized["max_steps"] <= 1 and sum(quantized["steps_histogram"].values()) > 0
    assert "int8 steps" in (root / "report.md").read_text()
    (floating,) = [c for c in result.verification["comparisons"] if c["reference"] == "float model"]
    picture = root / floating["picture"]
    with Image.open(picture) as panel:  # float model | program | error, side by side
        assert panel.size[0] > 3 * 32 and panel.size[1] > 32
    assert f"]({floating['picture']})" in (root / "report.md").read_text()
    manifest = json.loads((root / "etkit-manifest.json").read_text())
    assert floating["picture"] in manifest["files"]


def test_run_writes_outputs_matching_the_quantized_model(
    stn_vgf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = stn_vgf.example_inputs[0]
    np.save(tmp_path / "in.npy", image.numpy())
    status = main(["run", str(stn_vgf.pte_path), "--input", str(tmp_path / "in.npy"),
                   "--out", str(tmp_path / "out")])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "VgfBackend" in printed and " ms" in printed
    # stn's sampler is a compute segment of its one VGF (its image is also read by the
    # localization net: the segment reads the graph segment's copy of it): no grid-sampler call
    assert [p["path"] for p in stn_vgf.report["grid_sampler_paths"]] == ["vgf-compute-segment"]
    assert "GridSamplerBackend" not in printed, printed
    output = torch.from_numpy(np.load(tmp_path / "out" / "output_0.npy"))
    entry = stn_vgf.io_quant_params["outputs"][0]
    with torch.no_grad():
        reference = stn_vgf.converted_model(*stn_vgf.example_inputs)
    # in integer steps: the reference (dequantized integers) quantized back to the output's qspec
    expected = torch.round(reference / entry["scale"]) + entry["zero_point"]
    assert int((output.to(torch.int32) - expected.to(torch.int32)).abs().max()) <= 1
    with Image.open(tmp_path / "out" / "output_0.png") as picture:
        assert picture.size == (output.shape[3], output.shape[2])


def test_bad_inputs_and_programs_write_nothing(
    stn_vgf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "small.npy", np.zeros((1, 4, 8, 8), dtype=np.float32))
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(stn_vgf.pte_path.read_bytes()[:300])
    cases = [
        ([str(stn_vgf.pte_path), "--input", str(tmp_path / "small.npy")], "shape [1, 4, 8, 8]"),
        ([str(stn_vgf.pte_path)], "takes 1 inputs; 0 --input given"),
        ([str(truncated), "--input", str(tmp_path / "small.npy")], "truncated.pte"),
        ([str(stn_vgf.pte_path), "--input", str(tmp_path / "nope.npy")], "no such file"),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        assert main(["run", *args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


EARLY = """\
import sys
from etkit_exporter.cli.main import main
for args in ARGS:
    status = main(args)
    assert status == 2, (args, status)
    assert "torch" not in sys.modules and "executorch" not in sys.modules, args
"""


def test_usage_errors_are_answered_before_torch_loads(tmp_path: Path) -> None:
    """A missing program, folder or input, a bad --image-range, a used --out: answered at once,
    before torch and ExecuTorch are imported (seconds)."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "m.pte").write_bytes(b"")
    (tmp_path / "in.npy").write_bytes(b"")
    cases = [
        (["run", "missing.pte", "--input", "x.npy"], "missing.pte: no such program file"),
        (["run", "full"], "full is a folder without model.pte"),
        (["run", "m.pte", "--input", "nope.npy"], "--input nope.npy: no such file"),
        (["run", "m.pte", "--input", "in.npy", "--image-range", "1,-1"], "LOW must be below"),
        (["run", "m.pte", "--input", "in.npy", "--out", "full"], "--out full exists"),
        (["run", "m.pte", "--input", "m.pte"], "expected .npy, .pt, .png or .jpg"),
    ]
    code = EARLY.replace("ARGS", repr([args for args, _ in cases]))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == len(cases), done.stderr
    for line, (_, message) in zip(lines, cases, strict=True):
        assert line.startswith("etkit run: ") and message in line, line
    version = subprocess.run(
        [sys.executable, "-c", "from etkit_exporter.cli.main import main; main(['--version'])"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("etkit 0."), version


def test_scenario_folder_runs_with_its_script(stn_vgf: Any, tmp_path: Path) -> None:
    """The command report.md prints runs here (the script loads the ML emulation layers) and
    gives what etkit's scenario run gives; without etkit on PATH it says what to do."""
    from etkit_exporter.vgf.scenario import run_scenario

    folder = stn_vgf.artifacts_root / "scenario"
    report = (stn_vgf.artifacts_root / "report.md").read_text()
    assert "sh scenario/run.sh OUT" in report
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VK_")}
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    done = subprocess.run(
        ["sh", "scenario/run.sh", str(tmp_path / "out")],
        cwd=stn_vgf.artifacts_root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_scenario(folder, output_dir=tmp_path / "etkit")
    for expected in sorted((tmp_path / "etkit").glob("output_*.npy")):
        assert (tmp_path / "out" / expected.name).read_bytes() == expected.read_bytes()
    assert sorted((tmp_path / "etkit").glob("output_*.npy"))
    env["PATH"] = str(Path(shutil.which("sh") or "/bin/sh").parent)
    bare = subprocess.run(
        ["sh", str(folder / "run.sh"), str(tmp_path / "bare")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bare.returncode == 2 and "etkit is not on PATH" in bare.stderr


def test_vulkan_env_prints_what_etkit_gives_scenario_runner() -> None:
    """`eval "$(etkit vulkan-env)"` in a shell sets the environment etkit runs scenario_runner
    with (what scenario/run.sh does)."""
    from etkit_exporter.vgf.vulkan_env import ml_emulation_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("VK_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    names = ("VK_LAYER_PATH", "VK_INSTANCE_LAYERS", "LD_LIBRARY_PATH")
    done = subprocess.run(
        ["sh", "-c", 'eval "$(etkit vulkan-env)" && ' + " && ".join(f'echo "${n}"' for n in names)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = ml_emulation_env(env)
    assert done.stdout.splitlines() == [expected[n] for n in names]
    assert expected["VK_INSTANCE_LAYERS"].startswith("VK_LAYER_ML_Graph_Emulation:")
