"""Bundled programs: ``--bundle``/``bundle=True`` writes ``model.bpte`` (the program, its
example inputs in its own integer IO types, its own verified outputs) that ExecuTorch's bundled
program verifier and ``etkit run model.bpte`` accept, and reject once one expected value is
changed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from etkit_exporter import ExportResult, export_model
from etkit_exporter.check.bundle import (
    BundleCase,
    BundleError,
    bundle_bytes,
    read_bundle,
    run_bundle,
)
from etkit_exporter.export.demos import DEMOS


def _etkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``etkit ARGS`` run by its ``main`` in this process (no new interpreter: 8 s of imports
    each), in ``cwd``: its exit status, stdout and stderr."""
    from etkit_exporter.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["etkit", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExportResult]:
    root = tmp_path_factory.mktemp("bundles")
    made = {}
    for name, demo, target in (("vgf", "resample", "vgf"), ("xnnpack", "stn", "xnnpack")):
        model, inputs = DEMOS[demo]()
        made[name] = export_model(
            model, inputs, artifacts_root=root / name, target=target, bundle=True
        )
    return made


def _mutated(result: ExportResult, folder: Path) -> Path:
    """The export's bundle with one expected value moved by one step."""
    bundle = read_bundle(result.artifacts_root / "model.bpte")
    inputs, expected = bundle.cases["forward"][0]
    changed = [e.clone() for e in expected]
    first = changed[0].flatten()
    first[3] = first[3] + 1 if first[3] < 100 else first[3] - 1
    changed[0] = first.reshape(changed[0].shape)
    (folder / "model.pte").write_bytes(bundle.program)
    (folder / "model.bpte").write_bytes(
        bundle_bytes(folder / "model.pte", [BundleCase("forward", inputs, changed)])
    )
    return folder / "model.bpte"


@pytest.mark.parametrize("name", ["vgf", "xnnpack"])
def test_bundle_holds_the_program_its_integer_inputs_and_its_own_outputs(
    exports: dict[str, ExportResult], name: str
) -> None:
    result = exports[name]
    folder = result.artifacts_root
    assert result.verification is not None  # bundle implies verify
    manifest = json.loads((folder / "etkit-manifest.json").read_text())
    assert {"model.bpte", "model.bpte.json"} <= set(manifest["files"])
    bundle = read_bundle(folder / "model.bpte")
    assert bundle.program == (folder / "model.pte").read_bytes()
    ((inputs, expected),) = bundle.cases["forward"]
    io = result.io_quant_params
    for x, entry in zip(inputs, io["inputs"], strict=True):
        assert str(x.dtype).removeprefix("torch.") == entry["dtype"]
        assert list(x.shape) == entry["shape"]
        if entry["dim_order"] == [0, 2, 3, 1]:
            assert x.is_contiguous(memory_format=torch.channels_last)
    assert [str(y.dtype).removeprefix("torch.") for y in expected] == [
        e["dtype"] for e in io["outputs"]
    ]
    side = json.loads((folder / "model.bpte.json").read_text())
    assert [o["tolerance_steps"] for o in side["outputs"]] == [0] * len(expected)
    runner, checks = run_bundle(folder / "model.bpte")
    assert checks and all(c.passes and c.max_steps == 0 for c in checks), checks
    assert ("VGF" in runner) == (name == "vgf")


def test_vgf_bundle_checks_with_the_vulkan_grid_sampler(exports: dict[str, ExportResult]) -> None:
    runner, checks = run_bundle(
        exports["vgf"].artifacts_root / "model.bpte", grid_sampler_impl="vulkan"
    )
    assert "grid sampler vulkan" in runner and all(c.passes for c in checks)


def test_executorchs_own_verifier_accepts_the_bundle_and_rejects_a_changed_value(
    exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    """What a device runner does (ExecuTorch's bundled-program verification, here through its
    pybindings), exact: rtol 0, atol 0."""
    from executorch.extension.pybindings import portable_lib

    from etkit_gridsampler import runtime

    runtime.register()
    good = exports["xnnpack"].artifacts_root / "model.bpte"
    loaded = portable_lib._load_bundled_program_from_buffer(good.read_bytes())
    outputs = loaded.verify_result_with_bundled_expected_output("forward", 0, 0.0, 0.0)
    assert len(outputs) == 1
    bad = portable_lib._load_bundled_program_from_buffer(
        _mutated(exports["xnnpack"], tmp_path).read_bytes()
    )
    with pytest.raises(RuntimeError, match="verification failed"):
        bad.verify_result_with_bundled_expected_output("forward", 0, 0.0, 0.0)


@pytest.mark.parametrize("name", ["vgf", "xnnpack"])
def test_etkit_run_checks_a_bundle(
    exports: dict[str, ExportResult], tmp_path: Path, name: str
) -> None:
    good = exports[name].artifacts_root / "model.bpte"
    done = _etkit("run", str(good), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "all outputs match" in done.stdout and "0 steps" not in done.stderr
    bad = _mutated(exports[name], tmp_path)
    done = _etkit("run", str(bad), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "case 0 output 0: 1 of" in done.stdout and "MISMATCH" in done.stdout
    assert list(tmp_path.glob("run-outputs*")) == []


def test_bad_bundles_are_one_line_errors(exports: dict[str, ExportResult], tmp_path: Path) -> None:
    folder = exports["vgf"].artifacts_root
    (tmp_path / "pte.bpte").write_bytes((folder / "model.pte").read_bytes())
    (tmp_path / "cut.bpte").write_bytes((folder / "model.bpte").read_bytes()[:2000])
    for name, message in (
        ("pte.bpte", "is not a bundled program"),
        ("cut.bpte", "is a damaged bundled program"),
    ):
        with pytest.raises(BundleError, match=message):
            run_bundle(tmp_path / name)
        done = _etkit("run", name, cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = _etkit("run", str(folder / "model.bpte"), "--input", "x.npy", cwd=tmp_path)
    assert done.returncode == 2 and "holds its own inputs" in done.stderr
