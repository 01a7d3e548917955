"""The conventions users of ExecuTorch's Arm compiler expect from ``etkit-export``: --version,
models from .py and .pt2 files, example inputs from a file, --tosa-spec, -i/--intermediates,
--config FILE and the export.toml that reproduces an export, short flags; and ``etkit doctor``
reusing ExecuTorch's own VGF preflight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch

from etkit_exporter import doctor

WARP = """\
import torch
import torch.nn.functional as F


class Warp(torch.nn.Module):
    def forward(self, grid, image):
        return F.grid_sample(image, grid, align_corners=False)


def make():
    return Warp()


torch.manual_seed(3)
ModelUnderTest = Warp()
ModelInputs = (torch.rand(1, 6, 10, 2) * 2 - 1, torch.rand(1, 4, 12, 12) * 2 - 1)
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=dict(os.environ),
        timeout=600,
    )


def _io_shapes(folder: Path) -> list[list[int]]:
    io = json.loads((folder / "io_quant_params.json").read_text())
    return [e["shape"] for e in io["inputs"]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with warp.py (factory, ModelUnderTest/ModelInputs), warp.pt2 and input files."""
    folder = tmp_path_factory.mktemp("models")
    (folder / "warp.py").write_text(WARP)
    grid, image = torch.rand(2, 5, 7, 2) * 2 - 1, torch.rand(2, 4, 9, 9) * 2 - 1
    torch.save((grid, image), folder / "inputs.pt")
    np.savez(folder / "inputs.npz", grid=grid.numpy(), image=image.numpy())
    namespace: dict[str, object] = {}
    exec(compile(WARP, "warp.py", "exec"), namespace)  # the test's own model
    model, example = namespace["ModelUnderTest"], namespace["ModelInputs"]
    assert isinstance(model, torch.nn.Module) and isinstance(example, tuple)
    torch.export.save(torch.export.export(model, example), folder / "warp.pt2")
    np.savez(folder / "same.npz", *(torch.rand_like(x).numpy() for x in example))
    torch.save({"grid": grid}, folder / "dict.pt")
    (folder / "garbage.pt2").write_bytes(b"not a program")
    return folder


def test_version(tmp_path: Path) -> None:
    done = _cli("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"etkit-export {version('etkit-exporter')} (")
    assert f"executorch {version('executorch')}" in line and f"torch {version('torch')}" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "extra", "shapes"),
    [
        ("warp.py", [], [[1, 6, 10, 2], [1, 4, 12, 12]]),  # ModelUnderTest and ModelInputs
        ("warp.py:make", ["--inputs", "inputs.pt"], [[2, 5, 7, 2], [2, 4, 9, 9]]),
        ("warp.pt2", [], [[1, 6, 10, 2], [1, 4, 12, 12]]),  # the program's example inputs
        ("warp.pt2", ["--model_input", "same.npz"], [[1, 6, 10, 2], [1, 4, 12, 12]]),
    ],
)
def test_models_and_inputs_from_files(
    models: Path, model: str, extra: list[str], shapes: list[list[int]]
) -> None:
    out = f"out-{model.replace(':', '-')}-{len(extra)}"
    done = _cli("-m", model, *extra, "-t", "xnnpack", "-o", out, "--verify", cwd=models)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _io_shapes(models / out) == shapes
    report = json.loads((models / out / "report.json").read_text())
    assert report["target"] == "xnnpack" and len(report["grid_samplers"]) == 1
    quantized = [
        c for c in report["verification"]["comparisons"] if c["reference"] == "quantized PT2E model"
    ]
    assert quantized and all(c["max_steps"] <= 1 for c in quantized)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "nope.py"], "--model file nope.py does not exist"),
        (["-m", "warp.py:nope"], "has no 'nope'"),
        (["-m", "garbage.pt2"], "is not a program written by torch.export.save"),
        (["-m", "warp.py:make", "--inputs", "dict.pt"], "must hold tensors"),
        (["-m", "warp.py:make", "--inputs", "missing.npz"], "--inputs missing.npz does not exist"),
        (["-m", "warp.py:make", "--inputs", "warp.py"], "give a .pt or .npz file"),
        (["-m", "warp.py", "--inputs", "inputs.pt", "--input-shape", "1x2"], "not both"),
        (["-m", "warp.pt2", "--inputs", "inputs.pt"], "forward fails on the example inputs"),
        (["demo", "--inputs", "inputs.pt"], "apply to --model only"),
        (["demo", "--tosa-spec", "TOSA-9"], "is not a TOSA specification"),
        (["demo", "--tosa-spec", "TOSA-1.0+FP"], "has no INT profile"),
        (["demo", "-t", "xnnpack", "--tosa-spec", "TOSA-1.0+INT"], "vgf only"),
        (["--config", "missing.toml"], "no such file"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    models: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    from etkit_exporter.export_cli import main  # in-process: these fail before any lowering

    monkeypatch.chdir(models)
    assert main([*args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("target = 3\n", "'target' must be a string"),
        ("verify = 'yes'\n", "'verify' must be true or false"),
        ("quant-input = [1]\n", "'quant-input' must be a list of strings"),
        ("nonsense = 'x'\n", "unknown option 'nonsense'"),
        ("force = true\n", "force is given on the command line only"),
        ("target = \n", "is not valid TOML"),
    ],
)
def test_bad_config_files(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
) -> None:
    from etkit_exporter.export_cli import main

    (tmp_path / "c.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["--config", "c.toml"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_config_reproduces_an_export(tmp_path: Path) -> None:
    """Every export writes export.toml; exporting from it gives the same program, and options
    on the command line override it. Also: --tosa-spec reaches the VGF lowering and -i moves
    the intermediates."""
    first = _cli(
        "demo", "resample", "-t", "vgf", "--tosa-spec", "TOSA-1.0+INT+int16",
        "--quant-output", "snorm8", "--quant-output", "q0.7", "-o", "first", "-i", "inter",
        cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    config = (tmp_path / "first" / "export.toml").read_text()
    assert 'demo = "resample"' in config and 'tosa-spec = "TOSA-1.0+INT+int16"' in config
    assert 'quant-output = ["snorm8", "q0.7"]' in config and 'intermediates = "inter"' in config
    manifest = json.loads((tmp_path / "first" / "etkit-manifest.json").read_text())
    assert "export.toml" in manifest["files"]
    assert any("TOSA-1.0+INT+int16" in p.name for p in (tmp_path / "inter").iterdir())
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    assert report["tosa_spec"] == "TOSA-1.0+INT+int16"

    again = _cli("--config", "first/export.toml", "-o", "second", "-i", "inter2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    for name in ("model.pte", "io_quant_params.json"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()
    second = (tmp_path / "second" / "export.toml").read_text()
    assert second == config.replace('"first"', '"second"').replace('"inter"', '"inter2"')

    overridden = _cli("--config", "first/export.toml", "-t", "xnnpack", "-o", "x", cwd=tmp_path)
    assert overridden.returncode == 2  # --tosa-spec from the file does not apply to xnnpack
    assert "--tosa-spec applies to --target vgf only" in overridden.stderr
    (tmp_path / "c.toml").write_text('demo = "resample"\ntarget = "vgf"\nout = "third"\n')
    done = _cli("--config", "c.toml", "-t", "xnnpack", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "third" / "report.json").read_text())["target"] == "xnnpack"


def test_doctor_rows_come_from_executorchs_check_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure ExecuTorch's VGF preflight finds fails etkit's row, with its action as the
    fix; what it passes, etkit's row shows."""
    from executorch.backends.arm.vgf import check_env

    assert "check_env: Imported tosa_serializer" in doctor.check_tosa_serializer()
    failing = check_env.VgfEnvironmentCheck(
        "TOSA serializer", check_env.STATUS_FAIL, "cannot import it", "pip install tosa-tools"
    )
    monkeypatch.setattr(check_env, "_check_tosa_serializer", lambda: failing)
    with pytest.raises(doctor.CheckFailedError, match="cannot import it") as raised:
        doctor.check_tosa_serializer()
    assert raised.value.fix == "pip install tosa-tools"
