"""Quantization-aware training through the exporter: the flow-warp demo prepared by
``qat_prepare`` (etkit's exact sampler in the loop), trained a few steps on moving textures with a
known flow, exported for XNNPACK and VGF with ``verify=True``, nothing calibrated again: the
program equals the QAT model's eval forward within 1 step on every output, and its grid sampler is
the QAT model's sampler on the program's own integers (0 steps; observable on XNNPACK, where the
sampler is a delegate call of its own). ``etkit-export --qat-checkpoint`` writes the same program
from the saved state; bad input gets one line."""

from __future__ import annotations

import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import ExportResult, export_model, qat_prepare
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.export.demos import flow_warp, moving_textures
from etkit_exporter.export.qat import check_checkpoint
from etkit_exporter.programs import load_program
from etkit_exporter.programs.runtime import run_with_etdump, runtime_method
from etkit_gridsampler import qat as exact_qat
from etkit_gridsampler.plan import UnsupportedOpError
from etkit_quant import QatGraphModule, fake_quant_params, is_quantize

STEPS = 6


@dataclass
class Trained:
    prepared: QatGraphModule
    inputs: tuple[torch.Tensor, torch.Tensor]  # the example inputs
    held_out: list[tuple[torch.Tensor, torch.Tensor]]
    calibration: list[tuple[torch.Tensor, torch.Tensor]]
    losses: list[float]
    result: ExportResult


def _data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, ...]]]:
    samples = moving_textures(7, 32, 48, max_flow=2.0, seed=3)
    frames = [(frame0, frame1) for frame0, frame1, _ in samples]
    return frames[:4], frames[4:]


def _train(target: str, root: Path) -> Trained:
    model, _ = flow_warp()
    train, rest = _data()
    inputs = (rest[0][0], rest[0][1])
    prepared = qat_prepare(model, inputs, target=target, calibration=train)
    optimizer = torch.optim.Adam(prepared.parameters(), lr=2e-3)
    prepared.train()
    losses = []
    for _ in range(STEPS):
        loss = sum((F.l1_loss(prepared(a, b), b) for a, b in train), torch.zeros(()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    result = export_model(prepared, inputs, target=target, verify=True, artifacts_root=root)
    # The export leaves the trained module as it was: in train mode, its state untouched.
    assert prepared.training
    assert all(torch.equal(v, state[k]) for k, v in prepared.state_dict().items())
    prepared.eval()
    held_out = [(a, b) for a, b in rest[1:]]
    return Trained(prepared, inputs, held_out, train, losses, result)


@pytest.fixture(scope="module")
def xnnpack(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return _train("xnnpack", tmp_path_factory.mktemp("qat") / "flow-warp-xnnpack")


@pytest.fixture(scope="module")
def vgf(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return _train("vgf", tmp_path_factory.mktemp("qat") / "flow-warp-vgf")


def _steps_apart(got: torch.Tensor, want: torch.Tensor, scale: float) -> int:
    return int(torch.round((got.reshape(want.shape) - want).abs() / scale).max())


def _check_export(trained: Trained, program_outputs: Any, runs: int) -> None:
    """What both targets must show: the verdict passes, every output of the program is within 1
    step of the QAT model's eval forward (the export's own comparison on the example inputs, and
    ``runs`` more runs here: held-out frames, then the example inputs), the quantized model
    lowered is ``convert_qat``'s with the trained parameters (nothing re-calibrated)."""
    result = trained.result
    assert trained.losses[-1] < trained.losses[0], trained.losses
    assert result.verification is not None
    assert result.verification["verdict"]["result"] == "pass"
    rows = result.verification["qat_model"]
    assert [r["output"] for r in rows] == [0] and all(r["max_steps"] <= 1 for r in rows), rows
    section = result.report["qat"]
    assert section["recalibrated"] is False and section["float_samplers"] == []
    assert len(section["exact_samplers"]) == 1
    assert all(r["max_steps"] <= 1 for r in section["quantized_model_vs_qat_model"])

    output = result.io_quant_params["outputs"][0]
    for inputs in [*trained.held_out, trained.inputs][:runs]:
        with torch.no_grad():
            want = trained.prepared(*inputs)
        got = float_output(program_outputs(inputs)[0], output)
        assert _steps_apart(got, want, output["scale"]) <= 1

    # Nothing re-calibrated: every quantize of the lowered model holds parameters a fake
    # quantize of the trained module applies, and the IO parameters are its boundaries'.
    held = set()
    for module in trained.prepared.modules():
        try:
            params = fake_quant_params(module)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        held.add((round(params.scale, 9), params.zero_point))
    converted = result.converted_model
    assert converted is not None
    quantizes = [n for n in converted.graph.nodes if is_quantize(n)]  # type: ignore[union-attr]
    used = {(round(float(n.args[1]), 9), int(n.args[2])) for n in quantizes}
    assert quantizes and used <= held, used - held
    for entry in (*result.io_quant_params["inputs"], output):
        assert (round(entry["scale"], 9), entry["zero_point"]) in held


def test_xnnpack_program_is_the_qat_model(xnnpack: Trained) -> None:
    io = xnnpack.result.io_quant_params
    method = runtime_method(xnnpack.result.pte_path)

    def run(inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        args = [program_input(x, e) for x, e in zip(inputs, io["inputs"], strict=True)]
        return list(method.execute(args))

    _check_export(xnnpack, run, runs=3)

    # The grid sampler's delegate call, read from an ETDump's debug buffer: its output is the
    # QAT model's exact sampler on the call's own integer inputs, bit for bit.
    from executorch.devtools import Inspector

    args = [program_input(x, e) for x, e in zip(xnnpack.inputs, io["inputs"], strict=True)]
    folder = xnnpack.result.artifacts_root
    with tempfile.TemporaryDirectory() as scratch:
        etdump, debug = Path(scratch) / "run.etdp", Path(scratch) / "run.debug"
        run_with_etdump(folder / "model.pte", args, etdump, debug, isolated=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inspector = Inspector(
                etdump_path=str(etdump),
                etrecord=str(folder / "etrecord.bin"),
                debug_buffer_path=str(debug),
            )
        calls = [
            [d for d in (event.debug_data or []) if isinstance(d, torch.Tensor)]
            for block in inspector.event_blocks
            for event in block.events
            if event.name == "DELEGATE_CALL" and event.delegate_backend_name == "GridSamplerBackend"
        ]
    assert len(calls) == 1
    image_q, grid_in, out_q = calls[0][0], calls[0][1], calls[0][-1]
    # the grid arrives float32: the delegate quantizes it on entry (XNNPACK has no int16)
    assert (image_q.dtype, grid_in.dtype, out_q.dtype) == (torch.int8, torch.float32, torch.int8)
    sampler = next(
        m for m in xnnpack.prepared.modules() if isinstance(m, exact_qat.PreparedGridSample)
    )
    op = sampler.op
    assert op.image is not None and op.grid is not None and op.output is not None
    grid_q = exact_qat.quantize(grid_in, op.grid)  # as the delegate does, bit for bit
    with torch.no_grad():
        mine = sampler(
            exact_qat.dequantize(image_q, op.image), exact_qat.dequantize(grid_q, op.grid)
        )
    assert torch.equal(exact_qat.quantize(mine, op.output), out_q.reshape(mine.shape))


def test_vgf_program_is_the_qat_model(vgf: Trained) -> None:
    io = vgf.result.io_quant_params
    program = load_program(vgf.result.pte_path)
    assert [d.backend_id for d in program.delegates] == ["VgfBackend"]  # the sampler inside

    def run(inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        args = [program_input(x, e) for x, e in zip(inputs, io["inputs"], strict=True)]
        return list(program.run(args).outputs)

    _check_export(vgf, run, runs=1)  # (each run starts scenario_runner)


def test_cli_exports_the_checkpoint(xnnpack: Trained, tmp_path: Path) -> None:
    """``etkit-export -m mymodel:make --qat-checkpoint trained.pt`` with the options the model
    was prepared with writes the program ``export_model`` wrote from the trained module."""
    from etkit_exporter.cli.export import main

    torch.save(xnnpack.prepared.state_dict(), tmp_path / "trained.pt")
    (tmp_path / "frames").mkdir()
    for k, sample in enumerate(xnnpack.calibration):
        torch.save(sample, tmp_path / "frames" / f"sample_{k}.pt")
    (tmp_path / "mymodel.py").write_text(
        "from etkit_exporter.export.demos import flow_warp, moving_textures\n\n\n"
        "def make():\n"
        "    model, _ = flow_warp()\n"
        "    frame0, frame1, _ = moving_textures(7, 32, 48, max_flow=2.0, seed=3)[4]\n"
        "    return model, (frame0, frame1)\n"
    )
    out = tmp_path / "out"
    argv = ["-m", f"{tmp_path / 'mymodel.py'}:make", "--qat-checkpoint",
            str(tmp_path / "trained.pt"), "--calibration", str(tmp_path / "frames"),
            "-t", "xnnpack", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert (out / "model.pte").read_bytes() == xnnpack.result.pte_path.read_bytes()
    assert 'qat-checkpoint = "' in (out / "export.toml").read_text()

    # A checkpoint of another model (a wider first conv): one line naming the parameter.
    state = dict(xnnpack.prepared.state_dict())
    first = next(k for k in state if k.endswith("weight"))
    state[first] = torch.zeros(32, *state[first].shape[1:])
    torch.save(state, tmp_path / "other.pt")
    argv[3] = str(tmp_path / "other.pt")
    argv[-1] = str(tmp_path / "other")
    import contextlib
    import io

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(argv) == 2
    lines = [line for line in stderr.getvalue().splitlines() if line.startswith("etkit-export")]
    assert len(lines) == 1, stderr.getvalue()
    assert re.search(
        rf"usage error: QAT checkpoint \S+other.pt does not match the prepared model: "
        rf"'{re.escape(first)}' has shape \[32, 6, 3, 3\] there but \[16, 6, 3, 3\] in the model",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "other").exists()


class NoParameters(torch.nn.Module):
    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, align_corners=False)


class BicubicWarp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(image, grid, mode="bicubic", align_corners=False)
        return torch.clamp(self.conv(warped), -1, 1)


def test_bad_input_gets_one_line(xnnpack: Trained) -> None:
    image, grid = torch.rand(1, 3, 8, 8) * 2 - 1, torch.rand(1, 8, 8, 2) * 2 - 1

    def one_line(error: pytest.ExceptionInfo[BaseException], pattern: str) -> None:
        assert "\n" not in str(error.value) and re.fullmatch(pattern, str(error.value)), error.value

    with pytest.raises(ValueError) as caught:
        qat_prepare(NoParameters(), (image, grid), target="xnnpack")
    one_line(
        caught, r"model \(NoParameters\) has no parameters to train .*without --qat-checkpoint\)"
    )

    with pytest.raises(UnsupportedOpError) as caught:
        qat_prepare(BicubicWarp(), (image, grid), target="xnnpack")
    one_line(caught, r"grid sampler grid_sampler(_2d)?: the exact integer sampler cannot mirror "
             r"mode='bicubic' .*")  # fmt: skip

    with pytest.raises(ValueError) as caught:
        export_model(
            xnnpack.prepared, xnnpack.inputs, target="xnnpack", calibration=[xnnpack.inputs]
        )
    one_line(caught, r"calibration does not apply to a QAT-trained model: .* give calibration to "
             r"qat_prepare instead")  # fmt: skip
    with pytest.raises(ValueError) as caught:
        export_model(xnnpack.prepared, xnnpack.inputs, target="vgf")
    one_line(caught, r"the QAT model was prepared for target 'xnnpack' .*, not 'vgf': .*")

    state = xnnpack.prepared.state_dict()
    missing = dict(state)
    name = next(iter(missing))
    del missing[name]
    for changed, pattern in (
        (missing, rf"QAT checkpoint c.pt does not match the prepared model: '{re.escape(name)}' "
                  r"\(\[.*\]\) is missing from it; .*"),
        ({**state, "extra.weight": torch.zeros(1)},
         r"QAT checkpoint c.pt does not match the prepared model: it holds 'extra.weight', "
         r"which the model has not; .*"),
    ):  # fmt: skip
        with pytest.raises(ValueError) as caught:
            check_checkpoint(xnnpack.prepared, changed, "c.pt")
        one_line(caught, pattern)


# On demand (-m extended): CI runs a recipe end to end in test_qat_torchrun.py (torchrun, 2
# processes), and this recipe's steps in this file's tests (QAT, export, the printed command).
@pytest.mark.slow
@pytest.mark.extended
def test_the_recipe_runs(tmp_path: Path) -> None:
    """``examples/qat_flow_warp.py`` (the README's QAT recipe), cut to 2 float and 2 QAT steps:
    trains, saves the checkpoint and calibration frames, exports, verifies, and prints the
    ``etkit-export --qat-checkpoint`` command."""
    import subprocess
    import sys

    recipe = Path(__file__).resolve().parents[1] / "examples" / "qat_flow_warp.py"
    out = tmp_path / "recipe"
    done = subprocess.run(
        [sys.executable, str(recipe), "--float-steps", "2", "--qat-steps", "2", "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verification: pass" in done.stdout, done.stdout[-2000:]
    assert "--qat-checkpoint" in done.stdout
    assert (out / "trained.pt").is_file() and any((out / "calibration").iterdir())
