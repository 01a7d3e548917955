"""export_model and etkit-export on the built-in demos: artifacts, reports, verification, and
every bad-input case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest
import torch

from etkit_exporter import ExportError, export_model
from etkit_exporter.artifact.staging import DestinationError
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.programs import load_program
from etkit_quant import snorm8, snorm16

SNORM8_SCALE = float(torch.tensor(1 / 127))


def _db(comparison: dict[str, Any]) -> float:
    """PSNR in dB; ``None`` in a report means identical."""
    return float("inf") if comparison["psnr_db"] is None else float(comparison["psnr_db"])


def _run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


@pytest.fixture(scope="module")
def flow_warp_xnnpack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, inputs = DEMOS["flow-warp"]()
    root = tmp_path_factory.mktemp("api") / "flow-warp-xnnpack"
    return export_model(
        model,
        inputs,
        artifacts_root=root,
        quantized_input_qspecs=(snorm8(), snorm8()),
        quantized_output_qspecs=(snorm8(),),
        target="xnnpack",
        verify=True,
    )


def test_flow_warp_xnnpack_verifies(flow_warp_xnnpack: Any) -> None:
    comparisons = flow_warp_xnnpack.verification["comparisons"]
    quantized = [c for c in comparisons if c["reference"] == "quantized PT2E model"]
    floating = [c for c in comparisons if c["reference"] == "float model"]
    assert quantized and all(_db(c) >= 40 for c in quantized), quantized
    assert floating and all(_db(c) > 25 for c in floating), floating


def test_the_report_counts_the_seams_between_delegates(flow_warp_xnnpack: Any) -> None:
    """XNNPACK (the flow head), etkit's sampler, XNNPACK (the tail): the sampler's output goes
    straight into the tail, and its float32 grid straight from the head (the sampler's delegate
    quantizes it on entry: XNNPACK has no int16, and the quantize ran outside before); its image
    comes from the program's input."""
    seams = flow_warp_xnnpack.report["delegate_seams"]
    assert seams == {"delegate_calls": 3, "values_between_delegates": 2}
    assert (
        "3 delegate calls; 2 values pass straight"
        in (flow_warp_xnnpack.artifacts_root / "report.md").read_text()
    )


def test_artifacts_and_io_params(flow_warp_xnnpack: Any) -> None:
    root = flow_warp_xnnpack.artifacts_root
    assert {p.name for p in root.iterdir()} >= {
        "model.pte", "io_quant_params.json", "report.json", "report.md", "intermediates",
    }  # fmt: skip
    assert flow_warp_xnnpack.pte_path == root / "model.pte"
    io = json.loads((root / "io_quant_params.json").read_text())
    assert [e["name"] for e in io["inputs"]] == ["frame0", "frame1"]
    for entry in (*io["inputs"], *io["outputs"]):
        assert entry["dtype"] == "int8" and entry["scale"] == pytest.approx(SNORM8_SCALE)
        assert (entry["zero_point"], entry["quant_min"], entry["quant_max"]) == (0, -127, 127)
        assert entry["texture"]["format"] == "R8_SNORM"
        assert entry["dim_order"] == [0, 1, 2, 3] and len(entry["shape"]) == 4  # CPU: NCHW
    assert io == flow_warp_xnnpack.io_quant_params
    # nothing half-written beside it
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]


def test_report_contents(flow_warp_xnnpack: Any) -> None:
    report = json.loads((flow_warp_xnnpack.artifacts_root / "report.json").read_text())
    backends = {p["backend"] for p in report["partitions"]}
    assert {"XnnpackBackend", "GridSamplerBackend"} <= backends
    (sampler,) = report["grid_samplers"]
    assert (sampler["mode"], sampler["padding_mode"], sampler["align_corners"]) == (
        "bilinear", "border", False,
    )  # fmt: skip
    assert sampler["image"]["dtype"] == "int8" and sampler["grid"]["dtype"] == "int16"
    assert sampler["grid_quantized_in_delegate"]  # no quantize of the grid outside the delegates
    assert not [o for o in report["outside_delegates"] if "quantize_per_tensor" in o["op"]]
    # the flow moves sample points past the unit square: the default grid scale covers them
    assert sampler["grid"]["scale"] == pytest.approx(2 / 32767)
    (grid,) = [s for s in report["saturation"] if s["name"].endswith(" grid")]
    assert grid["outside"] == 0 and grid["observed"][1] > 1
    assert sampler["image_shape"][1] == 3  # RGB as it is: RGBA textures are for a GPU (VGF)
    assert all(o["reason"] for o in report["outside_delegates"])
    timings = json.loads((flow_warp_xnnpack.artifacts_root / "timings.json").read_text())
    assert "timings_s" not in report  # apart: measured times differ from run to run
    assert {
        "capture",
        "quantize",
        "lower_main",
        "lower_grid_sampler",
        "serialize",
        "load",
        "verify",
    } <= set(timings["timings_s"])
    # each stage's peak resident memory beside its time, the verification's own stages too;
    # none of it in report.json (measured figures differ from run to run)
    assert set(timings["peak_memory_mb"]) == set(timings["timings_s"])
    assert all(mb is None or mb > 100 for mb in timings["peak_memory_mb"].values())
    verification_stages = timings["verification_stages"]
    assert list(verification_stages)[:3] == [
        "program run", "references", "envelope of the outputs",
    ]  # fmt: skip
    assert all(v["seconds"] >= 0 for v in verification_stages.values())
    assert "stages" not in report["verification"] and "peak_memory_mb" not in report
    assert report["versions"]["executorch"] == "1.5.1"
    markdown = (flow_warp_xnnpack.artifacts_root / "report.md").read_text()
    for heading in (
        "## Partitions",
        "## Grid samplers",
        "## Inputs and outputs",
        "## Verification",
    ):
        assert heading in markdown


def test_stn_xnnpack_api_verifies(tmp_path: Path) -> None:
    """The STN for XNNPACK, verified; its ``affine_grid`` is elementwise ops on small tensors
    inside the XNNPACK delegate (``etkit_quant.affine_grids``): no base grid built at run time
    and no ``sum`` over the grid in portable kernels, as lowering's decomposition would give."""
    model, inputs = DEMOS["stn"]()
    result = export_model(
        model, inputs, artifacts_root=tmp_path / "stn", target="xnnpack", verify=True
    )
    assert all(
        _db(c) >= 40
        for c in result.verification["comparisons"]  # type: ignore[index]
        if c["reference"] == "quantized PT2E model"
    )
    assert result.converted_model is not None
    converted = {str(n.target) for n in result.converted_model.graph.nodes}
    assert not {t for t in converted if "affine_grid" in t or "sum" in t}, sorted(converted)
    outside = load_program(result.pte_path).method().operators  # run outside every delegate
    assert not [op for op in outside if "sum" in op or "arange" in op or "where" in op], outside
    float_ops = {op["op"] for op in result.report["float_ops"]["ops"]}
    assert {"aten::mul.Tensor", "aten::add.Tensor"} <= float_ops, sorted(float_ops)


# (the STN for VGF through the API, verified: test_stn_vgf_verifies_on_vulkan; resample for VGF
# from the CLI, its samplers' paths checked: test_cli_conventions' config round trip)
DEMO_CASES: Final = [("stn", "xnnpack", []), ("resample", "xnnpack", ["--verify"])]


@pytest.fixture(scope="module")
def demo_cli_runs(
    tmp_path_factory: pytest.TempPathFactory, cli_batch: Any
) -> tuple[Path, list[dict[str, Any]]]:
    """``etkit-export demo ...`` for each of ``DEMO_CASES``, one after another in one process."""
    folder = tmp_path_factory.mktemp("demos")
    cases = [
        ["demo", demo, "--target", target, "--out", f"{demo}-{target}", *extra]
        for demo, target, extra in DEMO_CASES
    ]
    return folder, cli_batch(cases, folder)


@pytest.mark.parametrize("case", range(len(DEMO_CASES)), ids=lambda i: "-".join(DEMO_CASES[i][:2]))
def test_cli_exports_demo(demo_cli_runs: tuple[Path, list[dict[str, Any]]], case: int) -> None:
    demo, target, extra = DEMO_CASES[case]
    folder, runs = demo_cli_runs
    done, out = runs[case], folder / f"{demo}-{target}"
    assert done["code"] == 0, done["stderr"][-2000:]
    assert "partitions:" in done["stdout"] and "artifacts:" in done["stdout"]
    assert (out / "model.pte").stat().st_size > 0
    report = json.loads((out / "report.json").read_text())
    assert report["target"] == target and report["grid_samplers"]
    if "--verify" in extra:
        assert "PSNR" in done["stdout"]
        quantized = [
            c
            for c in report["verification"]["comparisons"]
            if c["reference"] == "quantized PT2E model"
        ]
        assert len(quantized) == 2 and all(_db(c) >= 40 for c in quantized)


def test_cli_user_model_with_qspecs_and_float(tmp_path: Path) -> None:
    (tmp_path / "user_models.py").write_text(
        "import torch, torch.nn.functional as F\n"
        "class Warp(torch.nn.Module):\n"
        "    def forward(self, image, grid):\n"
        "        return F.grid_sample(image, grid, align_corners=True)\n"
        "def make():\n"
        "    return Warp()\n"
    )
    done = _run_cli(
        "--model", "user_models:make", "--input-shape", "1x4x16x16", "--input-shape", "1x8x8x2",
        "--quant-input", "snorm8", "--quant-input", "snorm16", "--quant-output", "float",
        "--target", "xnnpack", "--out", "user", "--verify",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    io = json.loads((tmp_path / "user" / "io_quant_params.json").read_text())
    assert [e["texture"]["format"] for e in io["inputs"]] == ["R8_SNORM", "R16_SNORM"]
    assert io["outputs"][0]["scale"] is None and io["outputs"][0]["dtype"] == "float32"


# -- bad input ----------------------------------------------------------------------------


def test_api_bad_input(tmp_path: Path) -> None:
    model, inputs = DEMOS["resample"]()
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="at least one input"):
        export_model(model, (), artifacts_root=out)
    with pytest.raises(TypeError, match=r"example_inputs\[1\] must be a torch.Tensor"):
        export_model(model, (inputs[0], [1, 2]), artifacts_root=out)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="example_inputs must be a tuple"):
        export_model(model, list(inputs), artifacts_root=out)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target must be one of vgf, xnnpack"):
        export_model(model, inputs, artifacts_root=out, target="metal")
    with pytest.raises(ValueError, match="etrecord must be one of slim, full, not 'fat'"):
        export_model(model, inputs, artifacts_root=out, etrecord="fat")
    with pytest.raises(ValueError, match="input_qspecs has 1 entries but the model has 2"):
        export_model(model, inputs, artifacts_root=out, quantized_input_qspecs=(snorm8(),))
    with pytest.raises(ValueError, match="output_qspecs has 1 entries but the model has 2"):
        export_model(
            model, inputs, artifacts_root=out,
            quantized_input_qspecs=(snorm8(), snorm16()), quantized_output_qspecs=(snorm8(),),
        )  # fmt: skip
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(DestinationError, match="not an etkit export"):
            export_model(model, inputs, artifacts_root=out, force=force)
    assert (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing half-written


def test_failed_export_leaves_nothing(tmp_path: Path) -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, image: torch.Tensor) -> torch.Tensor:
            if image.sum() > 0:  # strict export cannot capture this
                return image * 2
            return image

    with pytest.raises(ExportError, match="stage 'capture' failed"):
        export_model(DataDependent(), (torch.ones(1, 3, 4, 4),), artifacts_root=tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


USAGE_ERRORS = [
    (["demo", "nosuch"], "unknown demo 'nosuch'"),
    (["demo", "--quant-input", "snorm9"], "unknown qspec 'snorm9'"),
    (["--model", "torch.nn:Identity"], "give --inputs FILE or --input-shape"),
    (["--model", "os:getcwd", "--input-shape", "1x2"], "returned str, not a torch.nn.Module"),
    (["--model", "user_models"], "must be package.module:factory"),
    (["--model", "x:y", "--input-shape", "1x0x3"], "bad --input-shape"),
    ([], "nothing to export"),
    (["demo", "--target", "metal"], "invalid choice"),
    (
        ["demo", "resample", "--quant-input", "snorm8"],
        "--quant-input is given 1 time but the model has 2",
    ),
]


@pytest.fixture(scope="module")
def usage_runs(cli_batch: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every case of ``USAGE_ERRORS`` run by ``etkit-export``'s main in one fresh process."""
    runs: list[dict[str, Any]] = cli_batch(
        [args for args, _ in USAGE_ERRORS], tmp_path_factory.mktemp("usage")
    )
    return runs


@pytest.mark.parametrize("case", range(len(USAGE_ERRORS)))
def test_cli_usage_errors(usage_runs: list[dict[str, Any]], case: int) -> None:
    args, message = USAGE_ERRORS[case]
    run = usage_runs[case]
    assert run["code"] == 2, (args, run)
    assert message in run["stderr"] and len(run["stderr"].strip().splitlines()) == 1, run


def test_a_usage_error_in_its_own_process_is_one_line(tmp_path: Path) -> None:
    """The installed command itself (not main() called in a loop): exit 2, one line."""
    done = _run_cli("demo", "nosuch", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown demo 'nosuch'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_refuses_existing_folder_and_reports_failed_export(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("mine")
    done = _run_cli("demo", "stn", "--out", "out", "--force", cwd=tmp_path)
    assert done.returncode == 2 and "not an etkit export" in done.stderr
    assert (tmp_path / "out" / "mine.txt").read_text() == "mine"
    (tmp_path / "bad_models.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2 if x.sum() > 0 else x\n"
        "def make():\n"
        "    return M(), (torch.ones(1, 3, 4, 4),)\n"
    )
    done = _run_cli(
        "--model",
        "bad_models:make",
        "--out",
        "bad",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1
    (reason,) = [line for line in done.stderr.splitlines() if line.startswith("etkit-export:")]
    assert "export failed: stage 'capture' failed" in reason
    assert not (tmp_path / "bad").exists()


_HELP_WITHOUT_EXECUTORCH = """
import contextlib, io, sys
from etkit_exporter.cli.export import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["--help"])
    except SystemExit as stop:
        assert stop.code == 0, stop.code
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("executorch", "torchao"))
assert not loaded, loaded[:5]
print(out.getvalue())
"""


def test_help_has_examples_and_imports_no_executorch(tmp_path: Path) -> None:
    """--help lists the options and examples, answered without importing ExecuTorch or torchao
    (about 4 s of this machine's 6.6 s when the parser read its targets from
    ``export.arguments``)."""
    done = _run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0 and "examples:" in done.stdout and "--quant-input" in done.stdout
    alone = subprocess.run(
        [sys.executable, "-c", _HELP_WITHOUT_EXECUTORCH],
        capture_output=True, text=True, check=False, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert "--target {vgf,xnnpack}" in alone.stdout


_USER_MODELS = """
import torch, torch.nn.functional as F

class Warp(torch.nn.Module):
    def forward(self, image, grid):
        return F.grid_sample(image, grid, align_corners=True)

class Volume(torch.nn.Module):
    def forward(self, volume, grid):
        return F.grid_sample(volume, grid, align_corners=True)

def raises():
    raise OSError("weights.pt not found")

not_callable = 42

def float64():
    return Warp(), (torch.rand(1, 4, 8, 8, dtype=torch.float64), torch.rand(1, 4, 4, 2))

def nan_input():
    image = torch.rand(1, 4, 8, 8)
    image[0, 0, 0, 0] = float("nan")
    return Warp(), (image, torch.rand(1, 4, 4, 2))

def volume():
    return Volume(), (torch.rand(1, 2, 4, 4, 4), torch.rand(1, 3, 3, 3, 3) * 2 - 1)

def warp():
    return Warp()
"""


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--model", "user_bad:raises"], 1, "raised OSError: weights.pt not found"),
        (["--model", "user_bad:not_callable"], 2, "not a callable factory"),
        (["--model", "user_broken:make"], 2, "raised ZeroDivisionError"),
        (["--model", "user_bad:float64"], 2, "example_inputs[0] is float64"),
        (["--model", "user_bad:nan_input"], 2, "example_inputs[0] holds 1 NaN or infinite"),
        (["--model", "user_bad:volume"], 1, "etkit exports 2-D grid_sample only"),
        (["--model", "user_bad:warp", "--input-shape", "1x4x8", "--input-shape", "1x4x4x2"], 2,
         "forward fails on the example inputs (1x4x8, 1x4x4x2)"),
        (["--model", "user_bad:warp", "--input-shape", "1x4x99999x99999",
          "--input-shape", "1x4x4x2"], 2, "GiB for one float32 tensor"),
        (["demo", "--quant-input", "q0.32"], 2, "a Q-format fits a sign bit and at most 15"),
        (["demo", "--quant-input", "q99999999999999999999.1"], 2, "is out of range"),
        (["demo", "--input-shape", "1x3x8x8"], 2, "and --inputs apply to --model only"),
        (["demo", "--quant-output", "unorm8"], 2, "output 0 asks for uint8 (unorm8)"),
        (["demo", "--no-quant", "--quant-output", "snorm8"], 2, "no effect with --no-quant"),
    ],
)  # fmt: skip
def test_cli_mistakes_name_their_cause(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    status: int,
    message: str,
) -> None:
    """Each mistake: one line naming the cause (plus at most a hint), the right exit status,
    nothing written. In-process: these fail before any lowering."""
    from etkit_exporter.cli.export import main

    (tmp_path / "user_bad.py").write_text(_USER_MODELS)
    (tmp_path / "user_broken.py").write_text("x = 1 / 0\ndef make(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--out", "out"]) == status
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("etkit-export:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py") in (
        [],
        ["__pycache__"],
    )


def test_cli_read_only_out_is_a_usage_error(tmp_path: Path) -> None:
    """--out in a read-only file system (a read-only tmpfs where this user may mount one, else a
    folder without write permission)."""
    place = tmp_path / "ro"
    place.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(place)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not mounted:
        place.chmod(0o555)
    try:
        done = _run_cli("demo", "resample", "--out", "ro/out", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "choose" in done.stderr and "ro" in done.stderr and "Traceback" not in done.stderr
        assert list(place.iterdir()) == []
    finally:
        if mounted:
            subprocess.run(["umount", str(place)], check=False)
