"""The conventions users of ExecuTorch's Arm compiler expect from ``etkit-export``: --version,
models from .py and .pt2 files, example inputs from a file, --tosa-spec, -i/--intermediates,
--config FILE and the export.toml that reproduces an export, short flags; and ``etkit doctor``
reusing ExecuTorch's own VGF preflight."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import torch

from etkit_exporter.cli import doctor

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


FILE_CASES: Final = [
    ("warp.py", [], [[1, 6, 10, 2], [1, 4, 12, 12]]),  # ModelUnderTest and ModelInputs
    ("warp.py:make", ["--inputs", "inputs.pt"], [[2, 5, 7, 2], [2, 4, 9, 9]]),
    ("warp.pt2", [], [[1, 6, 10, 2], [1, 4, 12, 12]]),  # the program's example inputs
    ("warp.pt2", ["--model_input", "same.npz"], [[1, 6, 10, 2], [1, 4, 12, 12]]),
]


def _file_out(model: str, extra: list[str]) -> str:
    return f"out-{model.replace(':', '-')}-{len(extra)}"


@pytest.fixture(scope="module")
def file_exports(models: Path, cli_batch: Any) -> list[dict[str, Any]]:
    """``etkit-export -m MODEL ... --verify`` for each of ``FILE_CASES``, in one process."""
    cases = [
        ["-m", model, *extra, "-t", "xnnpack", "-o", _file_out(model, extra), "--verify"]
        for model, extra, _ in FILE_CASES
    ]
    runs: list[dict[str, Any]] = cli_batch(cases, models)
    return runs


@pytest.mark.parametrize("case", range(len(FILE_CASES)), ids=lambda i: FILE_CASES[i][0])
def test_models_and_inputs_from_files(
    models: Path, file_exports: list[dict[str, Any]], case: int
) -> None:
    model, extra, shapes = FILE_CASES[case]
    out, done = _file_out(model, extra), file_exports[case]
    assert done["code"] == 0, done["stderr"][-2000:]
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
    from etkit_exporter.cli.export import main  # in-process: these fail before any lowering

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
    from etkit_exporter.cli.export import main

    (tmp_path / "c.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["--config", "c.toml"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_config_reproduces_an_export(tmp_path: Path, cli_batch: Any) -> None:
    """Every export writes export.toml; exporting from it gives the same program, and options
    on the command line override it. Also: --tosa-spec reaches the VGF lowering and -i moves
    the intermediates. (The four calls run one after another in one process.)"""
    (tmp_path / "c.toml").write_text('demo = "resample"\ntarget = "vgf"\nout = "third"\n')
    first, again, overridden, done = cli_batch(
        [
            ["demo", "resample", "-t", "vgf", "--tosa-spec", "TOSA-1.0+INT+int16",
             "--quant-output", "snorm8", "--quant-output", "q0.7", "-o", "first", "-i", "inter"],
            ["--config", "first/export.toml", "-o", "second", "-i", "inter2"],
            ["--config", "first/export.toml", "-t", "xnnpack", "-o", "x"],
            ["--config", "c.toml", "-t", "xnnpack"],
        ],
        tmp_path,
    )  # fmt: skip
    assert first["code"] == 0, first["stderr"][-2000:]
    config = (tmp_path / "first" / "export.toml").read_text()
    assert 'demo = "resample"' in config and 'tosa-spec = "TOSA-1.0+INT+int16"' in config
    assert 'quant-output = ["snorm8", "q0.7"]' in config and 'intermediates = "inter"' in config
    manifest = json.loads((tmp_path / "first" / "etkit-manifest.json").read_text())
    assert "export.toml" in manifest["files"]
    assert any("TOSA-1.0+INT+int16" in p.name for p in (tmp_path / "inter").iterdir())
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    assert report["tosa_spec"] == "TOSA-1.0+INT+int16"
    assert "partitions:" in first["stdout"] and "artifacts:" in first["stdout"]
    # each sampler inside the VGF or, with the reason, in etkit's delegate
    paths = report["grid_sampler_paths"]
    assert paths and {p["path"] for p in paths} <= {"vgf-compute-segment", "etkit-delegate"}
    own = [p for p in paths if p["path"] == "etkit-delegate"]
    assert all(p["reason"] for p in own) and len(own) == len(report["grid_samplers"])

    assert again["code"] == 0, again["stderr"][-2000:]
    for name in ("model.pte", "io_quant_params.json"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()
    second = (tmp_path / "second" / "export.toml").read_text()
    assert second == config.replace('"first"', '"second"').replace('"inter"', '"inter2"')

    assert overridden["code"] == 2  # --tosa-spec from the file does not apply to xnnpack
    assert "--tosa-spec applies to --target vgf only" in overridden["stderr"]
    assert not (tmp_path / "x").exists()
    assert done["code"] == 0, done["stderr"][-2000:]
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


def _value_options(parser: argparse.ArgumentParser) -> list[str]:
    """The long option of every optional argument of ``parser`` that takes one value."""
    return [
        max(action.option_strings, key=len)
        for action in parser._actions
        if action.option_strings and action.nargs in (None, "?") and action.type is not bool
        and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
        and action.const is None
    ]  # fmt: skip


def test_every_option_takes_a_value_that_starts_with_a_dash() -> None:
    """`--image-range -1,1`, as README, --help and the hints print it: a value such as -1,1 or
    -.5,.5 is the option's value, for every option of both commands (plain argparse reads
    it as an unknown option: "expected one argument")."""
    from etkit_exporter.cli import export as export_cli
    from etkit_exporter.cli import main as cli

    export_parser = export_cli._parser()
    options = _value_options(export_parser)
    assert "--image-range" in options and "--target" in options
    for option in options:
        for value in ("-1,1", "-.5,.5", "-2"):
            try:
                parsed = export_parser.parse_args(["demo", option, value])
            except export_cli.UsageError as error:  # -t -1,1: not a target, but read as one
                assert "invalid choice: '" + value in str(error), (option, error)
                continue
            dest = next(a.dest for a in export_parser._actions if option in a.option_strings)
            given = getattr(parsed, dest)
            assert str(given[-1] if isinstance(given, list) else given).endswith(value), option
    run_parser = cli._parser()
    run = run_parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    for option in _value_options(run):
        for value in ("-1,1", "-.5,.5"):
            try:
                parsed = run_parser.parse_args(["run", "m.pte", option, value])
            except SystemExit:  # --backend-impl -1,1: not a choice
                assert option == "--backend-impl", option
                continue
            dest = next(a.dest for a in run._actions if option in a.option_strings)
            given = getattr(parsed, dest)
            assert str(given[-1] if isinstance(given, list) else given).endswith(value)
    args = export_cli._parse(["demo", "--calibration", "c", "--image-range", "-1,1"])
    assert args.image_range == "-1,1"
    assert run_parser.parse_args(["run", "m.pte", "--image-range", "-1,1"]).image_range == "-1,1"


def test_target_has_help_and_shows_its_default() -> None:
    from etkit_exporter.cli import export as export_cli

    text = " ".join(export_cli._parser().format_help().split())
    assert "-t {vgf,xnnpack}, --target {vgf,xnnpack} vgf:" in text
    assert "(default: vgf)" in text


HELPERS = """\
import torch


def conv(c_in, c_out):
    return torch.nn.Conv2d(c_in, c_out, 3, padding=1)
"""

USER_MODEL = """\
import torch
import torch.nn.functional as F
from {helpers} import conv


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.flow = conv(3, 2)

    def forward(self, image):
        grid = torch.tanh(self.flow(image)).permute(0, 2, 3, 1)
        return F.grid_sample(image, grid, align_corners=False)


def make():
    return Net(), (torch.rand(1, 3, 8, 8) * 2 - 1,)
"""


def test_models_import_from_the_working_folder_and_beside_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-m mymodel:make` from the folder holding mymodel.py, and FILE.py importing a module
    beside it from anywhere, as `python -m` and `python FILE.py` import; a failure names where
    it looked."""
    from etkit_exporter.cli.export import UsageError, load_model

    monkeypatch.setattr(sys, "path", list(sys.path))
    project = tmp_path / "project"
    project.mkdir()
    (project / "fh_helpers_a.py").write_text(HELPERS)
    (project / "fh_model_a.py").write_text(USER_MODEL.format(helpers="fh_helpers_a"))
    (project / "fh_helpers_b.py").write_text(HELPERS)
    (project / "fh_model_b.py").write_text(USER_MODEL.format(helpers="fh_helpers_b"))
    (project / "fh_broken.py").write_text(USER_MODEL.format(helpers="fh_helpers_missing"))
    monkeypatch.chdir(project)
    model, inputs = load_model("fh_model_a:make", [])
    assert type(model).__name__ == "Net" and inputs[0].shape == (1, 3, 8, 8)
    monkeypatch.chdir(tmp_path)
    model, _ = load_model("project/fh_model_b.py:make", [])
    assert type(model).__name__ == "Net"
    with pytest.raises(UsageError) as missing_module:
        load_model("fh_nowhere:make", [])
    assert f"looked in the working folder {tmp_path}" in str(missing_module.value)
    with pytest.raises(UsageError) as missing_import:
        load_model("project/fh_broken.py:make", [])
    message = str(missing_import.value)
    assert "No module named 'fh_helpers_missing'" in message
    assert f"looked in {project}, the working folder {tmp_path}" in message
    assert "fix the file" not in message


def test_qspec_count_error_names_the_options(
    models: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from etkit_exporter.cli.export import main

    monkeypatch.chdir(models)
    args = ["-m", "warp.py", "-t", "xnnpack", "-o", str(tmp_path / "out")]
    assert main([*args, "--quant-output", "snorm8", "--quant-output", "snorm8"]) == 2
    err = capsys.readouterr().err
    assert (
        "--quant-output is given 2 times but the model has 1 output: give one --quant-output" in err
    )
    assert "qspecs" not in err and len(err.strip().splitlines()) == 1, err
    assert main([*args, "--quant-input", "snorm8"]) == 2
    assert "--quant-input is given 1 time but the model has 2 inputs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


BRANCHY = """\
import torch


class Branchy(torch.nn.Module):
    def forward(self, a):
        if a.sum() > 0:
            return a * 2
        return a - 1


def make():
    return Branchy(), (torch.rand(1, 3, 8, 8),)
"""


def test_data_dependent_branch_is_a_short_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.export prints the partial graph before it raises; the command shows the one-line
    error (--verbose shows everything)."""
    from etkit_exporter.cli.export import main

    (tmp_path / "branchy.py").write_text(BRANCHY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["-m", "branchy.py:make", "-t", "xnnpack", "-o", "out"]) == 1
    captured = capsys.readouterr()
    assert "class GraphModule" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 2 and "stage 'capture' failed" in lines[0], captured.err
    assert "Data-dependent" in lines[0]


def test_summary_lists_samplers_outside_delegates_and_no_empty_folder(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from etkit_exporter.cli.export import _summary

    (tmp_path / "model.pte").write_bytes(b"x")
    (tmp_path / "intermediates").mkdir()
    report = {
        "partitions": [{"name": "lowered_module_0", "backend": "XnnpackBackend", "nodes": 4}],
        "io": {"inputs": [], "outputs": []},
        "outside_delegates": [
            {"node": "aten_grid_sampler_2d_default", "op": "aten::grid_sampler_2d.out",
             "reason": "grid-sampler backend: interpolation mode 2 (bicubic) is not supported"},
            {"node": "q", "op": "quantized_decomposed::quantize_per_tensor.out",
             "reason": "kept outside by DetagInputQuantize"},
        ],
    }  # fmt: skip
    result = SimpleNamespace(
        report=report, saturation=(), verification=None, artifacts_root=tmp_path
    )
    text = _summary(result, 1.0)
    assert "aten_grid_sampler_2d_default: grid-sampler backend: interpolation mode 2" in text
    assert "DetagInputQuantize" not in text
    assert "intermediates" not in text and str(tmp_path / "model.pte") in text
    (tmp_path / "intermediates" / "x.vgf").write_bytes(b"x")
    assert str(tmp_path / "intermediates") in _summary(result, 1.0)
