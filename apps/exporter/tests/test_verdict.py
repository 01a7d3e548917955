"""The verification verdict: each output judged against the quantized PT2E model with a written
tolerance; a failure exits 1, names the output, by how much and the first delegate whose output
diverges, and is kept beside the artifacts folder, never in its place; a sabotaged grid sampler
is found at its own delegate; a program the runtime refuses is named with its reason."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import VerifyTolerance, export_model
from etkit_exporter.artifact.staging import MANIFEST, foreign_content
from etkit_exporter.check.envelope import HALF_SLACK
from etkit_exporter.check.judgement import judge_outputs, judge_tensor
from etkit_exporter.check.tolerance import parse_tolerance
from etkit_exporter.check.verdict import VerificationError, failed_folder
from etkit_exporter.export.demos import DEMOS

STEP = 1 / 127  # an SNORM8 output's scale


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=dict(os.environ),
        timeout=900,
    )


# -- the tolerance, on tensors shaped like the outputs it judges ------------------------------


def _smooth(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(
        shape[0], shape[1], shape[2] // 4 + 2, shape[3] // 4 + 2, generator=generator
    )
    image = F.interpolate(noise, size=shape[2:], mode="bicubic", align_corners=False)
    return torch.round(image.clamp(0, 1) * 127) * STEP  # a conv + ReLU output: [0, 1], int8 steps


def test_tolerance_text_round_trips_and_keeps_defaults() -> None:
    tolerance = parse_tolerance("samples=32, band=0.05,coordinate-bias=0.25,max-steps=3")
    assert tolerance == VerifyTolerance(samples=32, band=0.05, coordinate_bias_px=0.25, max_steps=3)
    off = parse_tolerance("max-steps=off")
    assert off.max_steps is None and parse_tolerance(off.text()) == off
    assert parse_tolerance(tolerance.text()) == tolerance
    assert parse_tolerance("") == VerifyTolerance()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("samples", "'samples' is not KEY=NUMBER"),
        ("dB=30", "'dB=30' is not KEY=NUMBER"),
        ("max-steps=1.5", "max_steps must be a whole number"),
        ("samples=2", r"samples must be in \[4, 64\]"),
        ("band=0.7", "at most 0.5 steps"),
        ("band=-1", ">= 0"),
        ("band=x", "'x' is not a number"),
        ("psnr=36", "'psnr' is gone: the verdict judges by the rounding envelope"),
        ("float-margin=off", "'float-margin' is gone"),
    ],
)
def test_tolerance_text_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_tolerance(text)
    assert len(str(caught.value).splitlines()) == 1


# -- the rounding envelope ------------------------------------------------------------------------


def _quantized_graph() -> torch.fx.GraphModule:
    """x -> quantize (a graph input: not dithered) -> dequantize -> *1.37 + 0.05 -> quantize
    (dithered) -> dequantize: a one-op quantized model."""
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed)

    ops = torch.ops.quantized_decomposed

    def model(x: torch.Tensor) -> torch.Tensor:
        q = ops.quantize_per_tensor.default(x, 0.01, 0, -128, 127, torch.int8)
        y = ops.dequantize_per_tensor.default(q, 0.01, 0, -128, 127, torch.int8) * 1.37 + 0.05
        q2 = ops.quantize_per_tensor.default(y, 0.02, 0, -128, 127, torch.int8)
        return ops.dequantize_per_tensor.default(q2, 0.02, 0, -128, 127, torch.int8)

    return torch.fx.symbolic_trace(model)


def test_envelope_rounds_the_other_way_only_near_a_boundary() -> None:
    from etkit_exporter.check.envelope import quantize_bands, rounding_envelope

    module = _quantized_graph()
    x = torch.linspace(-0.9, 0.9, 4001).reshape(1, 1, 1, -1)
    with torch.no_grad():
        reference = module(x)
    assert len(quantize_bands(module, 0.1)) == 1  # the graph input's quantize is left alone
    envelope = rounding_envelope(module, [x], samples=8, band=0.1)
    # the value before rounding, in float32 as the model computes it
    exact = (torch.round(x * (1.0 / 0.01)) * 0.01 * 1.37 + 0.05) * (1.0 / 0.02)
    near = ((exact - exact.floor()) - 0.5).abs() < 0.1  # within the band of a boundary
    flips = torch.zeros_like(near)
    for outputs, _ in envelope.dithered:
        steps = ((outputs[0] - reference) / 0.02).round()
        assert steps.abs().max() <= 1  # the other neighbour, never further
        flips |= steps != 0
    assert not (flips & ~near).any()  # only near a boundary
    assert flips.sum() > 0.3 * near.sum()  # and there, often
    up, down = (outputs[0] for outputs, _ in envelope.modes)
    halves = ((exact - exact.floor()) - 0.5).abs() <= HALF_SLACK + exact.abs() * 2**-21
    assert torch.equal(up >= down, torch.ones_like(up, dtype=torch.bool))
    assert not ((up != down) & ~halves).any()
    again = rounding_envelope(module, [x], samples=8, band=0.1)  # one seed: reproducible
    assert all(
        torch.equal(a[0][0], b[0][0])
        for a, b in zip(envelope.dithered, again.dithered, strict=True)
    )


def test_halves_runs_take_a_half_the_float_model_missed_by_float32_error_as_a_half() -> None:
    """A value the quantized model computes a float32 error away from a half (a bilinear
    resize's exact quarters, 1.5e-5 steps off) is a half a backend computing on integers rounds
    by its rule: the up run takes it up, the down run down; a value 0.01 steps off is not."""
    from etkit_exporter.check.envelope import rounding_envelope

    ops = torch.ops.quantized_decomposed

    def model(y: torch.Tensor) -> torch.Tensor:  # the quantize reads a computed value
        q = ops.quantize_per_tensor.default(y * 1.0, 0.02, 0, -128, 127, torch.int8)
        return ops.dequantize_per_tensor.default(q, 0.02, 0, -128, 127, torch.int8)

    graph = torch.fx.symbolic_trace(model)
    y = (10.5 + torch.tensor([0.0, 1.5e-5, -1.5e-5, 0.01, -0.01])) * 0.02  # 10.5 steps + offset
    envelope = rounding_envelope(graph, [y], samples=4, band=0.005)
    up, down = (outputs[0] / 0.02 for outputs, _ in envelope.modes)
    assert up.round().tolist() == [11, 11, 11, 11, 10]
    assert down.round().tolist() == [10, 10, 10, 11, 10]


def test_prediction_bound_is_the_t_bound_of_one_more_draw() -> None:
    from etkit_exporter.check.envelope import prediction_bound

    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, sd 1.5811, t(0.999, 4) = 7.173
    assert prediction_bound(values) == pytest.approx(3 + 7.173 * 1.5811388 * (1.2**0.5), rel=1e-4)
    with pytest.raises(ValueError, match="at least 4 samples"):
        prediction_bound([1.0, 2.0])


def _legit(reference: torch.Tensor, seed: int, rate: float) -> torch.Tensor:
    """``reference`` with ``rate`` of its values one step up or down at random: rounding."""
    generator = torch.Generator().manual_seed(seed)
    flip = torch.rand(reference.shape, generator=generator) < rate
    sign = torch.where(torch.rand(reference.shape, generator=generator) < 0.5, -1.0, 1.0)
    return reference + flip * sign * STEP


@pytest.fixture(scope="module")
def picture() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A reference picture and a 16-run envelope flipping 5 % of its values a step."""
    reference = _smooth((1, 3, 24, 24), seed=1) * 2 - 1
    return reference, [_legit(reference, 100 + k, 0.05) for k in range(16)]


def test_rounding_inside_the_envelope_passes(picture: Any) -> None:
    reference, envelope = picture
    judged = judge_tensor(
        _legit(reference, 7, 0.03), reference, STEP, VerifyTolerance(), envelope=envelope
    )
    assert judged["passes"], judged
    assert judged["power_steps2"] < judged["power_bound_steps2"]


@pytest.mark.parametrize(
    ("name", "wrong", "reason"),
    [
        ("one step up everywhere", lambda r: r + STEP, "mean error"),
        (
            "truncated",
            lambda r: (
                r - STEP * (torch.rand(r.shape, generator=torch.Generator().manual_seed(3)) < 0.5)
            ),
            "mean error",
        ),
        (
            "3 steps on 40 % of values",
            lambda r: (
                r
                + 3
                * STEP
                * torch.where(
                    torch.rand(r.shape, generator=torch.Generator().manual_seed(4)) < 0.4,
                    torch.randint(0, 2, r.shape, generator=torch.Generator().manual_seed(5)) * 2.0
                    - 1,
                    torch.zeros(r.shape),
                )
            ),
            "error power",
        ),
        ("a one-pixel shift", lambda r: torch.roll(r, 1, -1), "error power"),
        ("twice the envelope's flips", lambda r: _legit(r, 9, 0.2), "error power"),
    ],
)
def test_outside_the_envelope_fails(picture: Any, name: str, wrong: Any, reason: str) -> None:
    reference, envelope = picture
    judged = judge_tensor(wrong(reference), reference, STEP, VerifyTolerance(), envelope=envelope)
    assert not judged["passes"], (name, judged)
    assert any(r.startswith(reason) for r in judged["reasons"]), judged["reasons"]


def test_a_few_logits_off_by_rounding_pass_and_a_cap_is_a_cap() -> None:
    """Four logits, one a step down where the envelope flips them too: the program's own
    standard error keeps a mean of four values from reading as a shift; ``max-steps`` caps."""
    logits = torch.tensor([[0.81, -0.62], [0.05, -0.94]])
    envelope = [_legit(logits, 200 + k, 0.25) for k in range(16)]
    off = logits + torch.tensor([[-1, 0], [0, 0]]) * STEP
    assert judge_tensor(off, logits, STEP, VerifyTolerance(), envelope=envelope)["passes"]
    capped = judge_tensor(off, logits, STEP, VerifyTolerance(max_steps=0), envelope=envelope)
    assert not capped["passes"] and capped["reasons"] == ["1 steps off (at most 0)"]


def test_one_value_one_step_off_passes_whatever_its_float32_rounding() -> None:
    """The fuzzer's seed 6017 (XNNPACK): two output values, one a step off where the envelope
    moved none; the dequantized step reads 1.0000012 steps in float32, and the rule "one value
    one step off" (power 1/n) must not fail on that rounding. Two steps off still fails."""
    scale = 0.0018559098243713379
    reference = torch.tensor([37 * scale, -90 * scale], dtype=torch.float32)
    envelope = [reference.clone() for _ in range(16)]
    off = reference.clone()
    off[0] = torch.tensor(36 * scale * (1 - 1e-5), dtype=torch.float32)  # the scale's rounding
    judged = judge_tensor(off, reference, scale, VerifyTolerance(), envelope=envelope)
    assert judged["power_steps2"] > 0.5 and judged["passes"], judged
    off[0] = 35 * scale
    judged = judge_tensor(off, reference, scale, VerifyTolerance(), envelope=envelope)
    assert not judged["passes"] and "error power" in judged["reasons"][0], judged


def test_a_float_export_is_held_to_the_float_model() -> None:
    reference = torch.randn(2, 10, generator=torch.Generator().manual_seed(5))
    assert judge_tensor(reference + 1e-7, reference, None, VerifyTolerance(), float_reference=True)[
        "passes"
    ]
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(6))
    slightly = reference + 0.01 * noise  # 55 dB
    judged = judge_tensor(slightly, reference, None, VerifyTolerance(), float_reference=True)
    assert not judged["passes"] and judged["reasons"][0].startswith("PSNR")
    shifted = judge_tensor(
        reference + 1e-3, reference, None, VerifyTolerance(), float_reference=True
    )
    assert not shifted["passes"] and any(r.startswith("mean error") for r in shifted["reasons"])


def test_outputs_verdict_names_the_failing_output(picture: Any) -> None:
    from etkit_exporter.check.envelope import Envelope

    reference, envelope = picture
    runs = [([e, e], {}) for e in envelope]
    spread = Envelope(runs, [([reference, reference], {})] * 2, 0.02, 3)
    entries = [{"scale": STEP}, {"scale": STEP}]
    verdict = judge_outputs(
        [_legit(reference, 7, 0.03), torch.roll(reference, 1, -1)], [reference, reference],
        entries, VerifyTolerance(), envelope=spread,
    )  # fmt: skip
    assert verdict["result"] == "fail" and verdict["failing_outputs"] == [1]
    assert verdict["tolerance"]["samples"] == VerifyTolerance().samples
    assert verdict["envelope"] == {"samples": 16, "band_steps": 0.02, "dithered_quantizes": 3}


def test_sampling_positions_in_pixels_of_the_image_sampled() -> None:
    from etkit_exporter.check.coordinates import SamplerSite

    grid = torch.tensor([[[[0.1, -0.2]]]])
    expected = torch.tensor([[[[2.4, -3.2]]]], dtype=torch.float64)
    assert torch.allclose(SamplerSite("s", "g", 32, 48, False).pixels(grid), expected)
    assert torch.allclose(SamplerSite("s", "g", 33, 49, True).pixels(grid), expected)


# -- a failed verification, end to end (etkit-export) -----------------------------------------


@pytest.fixture(scope="module")
def failed_cli(tmp_path_factory: pytest.TempPathFactory, cli_batch: Any) -> tuple[Path, Any]:
    """``etkit-export`` with a tolerance the program does not meet (no value may be a step
    off; the flow-warp demo is 1 step off at some pixels), into an absolute --out; then, in the
    same process, an export into that --out without --force (``{"code", "stderr", "stdout"}``
    of each)."""
    cwd = tmp_path_factory.mktemp("failed")
    out = cwd / "warp"
    runs = cli_batch(
        [
            ["demo", "flow-warp", "-t", "xnnpack", "--out", str(out),
             "--verify-tolerance", "max-steps=0"],
            ["demo", "resample", "-t", "xnnpack", "--out", str(out), "--verify"],
        ],
        cwd,
    )  # fmt: skip
    return out, runs


def test_failed_verification_exits_1_with_one_line_per_fact(failed_cli: tuple[Path, Any]) -> None:
    out, (done, _) = failed_cli
    assert done["code"] == 1, done["stderr"][-3000:]
    lines = [line for line in done["stderr"].splitlines() if line.startswith("etkit-export: ")]
    assert lines[0].startswith("etkit-export: verification failed")
    assert any(
        line.startswith("etkit-export: output 0 vs the quantized PT2E model") for line in lines
    )
    assert any("first divergence: instruction" in line for line in lines), lines
    kept = failed_folder(out)
    assert any(str(kept) in line for line in lines)
    assert "Traceback" not in done["stderr"]


def test_failed_verification_is_kept_beside_never_in_place(failed_cli: tuple[Path, Any]) -> None:
    out, _ = failed_cli
    kept = failed_folder(out)
    assert not out.exists()  # no program known to be wrong where a good one would be
    assert foreign_content(kept) == []  # a whole export, with its own manifest
    manifest = json.loads((kept / MANIFEST).read_text())
    assert manifest["producer"]["verification"] == "failed"
    report_md = (kept / "report.md").read_text().splitlines()
    assert report_md[2].startswith("**Verification failed**")
    verdict = json.loads((kept / "report.json").read_text())["verification"]["verdict"]
    assert verdict["result"] == "fail" and verdict["failing_outputs"] == [0]
    assert verdict["tolerance"]["max_steps"] == 0
    assert verdict["divergence"]["backend"] in ("XnnpackBackend", "GridSamplerBackend")
    assert any(row.get("first_failing") for row in verdict["delegate_calls"])
    assert "**first to fail**" in (kept / "report.md").read_text()
    assert not (kept / "model.bpte").exists()


def test_export_toml_holds_no_absolute_path(failed_cli: tuple[Path, Any]) -> None:
    out, _ = failed_cli
    config = (failed_folder(out) / "export.toml").read_text()
    assert str(out.parent) not in config and "out =" not in config
    assert 'verify-tolerance = "max-steps=0"' in config


def test_earlier_failed_export_replaced_only_with_force(failed_cli: tuple[Path, Any]) -> None:
    """The failed folder is an etkit export like any other: an export that would keep another
    failure there is refused before any work without --force."""
    out, (_, refused) = failed_cli  # (the fixture's second run)
    assert refused["code"] == 2, refused["stderr"][-2000:]
    assert "failed-verification holds an earlier etkit export" in refused["stderr"]
    assert not out.exists()


def test_etkit_inspect_shows_the_verdict(
    failed_cli: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from etkit_exporter.cli.main import main

    out, _ = failed_cli
    kept = failed_folder(out)
    assert main(["inspect", str(kept), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "verification verdict: fail" in printed
    assert "first divergence: instruction" in printed


# -- a sabotaged grid sampler: found at its own delegate --------------------------------------


@pytest.fixture(scope="module")
def flow_warp_vgf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The flow-warp demo for VGF with its grid sampler in etkit's own delegate (VGF graphs
    before and after it), verified; the caller's model was in train mode."""
    model, inputs = DEMOS["flow-warp"]()
    model.train()
    result = export_model(
        model,
        inputs,
        artifacts_root=tmp_path_factory.mktemp("vgf") / "flow-warp",
        target="vgf",
        verify=True,
        sampler_delegate=True,
    )
    return model, inputs, result


def _shifted_grid_sampler(steps: int) -> Any:
    """etkit's own CPU grid-sampler kernel, its output moved by ``steps``: a sabotaged kernel."""
    from etkit_gridsampler import cpu
    from etkit_gridsampler.delegate_format import decode

    def sampler(processed: bytes, _specs: list[Any], inputs: list[torch.Tensor]) -> torch.Tensor:
        blob = decode(processed)
        image, grid = inputs[blob.roles.image], inputs[blob.roles.grid]
        exact = cpu.grid_sample(image, grid, blob.op)
        return (exact.to(torch.int16) + steps).clamp(-128, 127).to(exact.dtype)

    return sampler


def test_export_restores_the_callers_train_mode(flow_warp_vgf: Any) -> None:
    model, _, result = flow_warp_vgf
    assert model.training and all(m.training for m in model.modules())
    assert result.verification["verdict"]["result"] == "pass"


def test_sabotaged_grid_sampler_fails_at_its_delegate(flow_warp_vgf: Any, tmp_path: Path) -> None:
    from etkit_exporter.artifact.report import render_markdown
    from etkit_exporter.check.verify import verify_export

    model, _, result = flow_warp_vgf
    folder = tmp_path / "copy"
    shutil.copytree(result.artifacts_root, folder)
    run = verify_export(
        folder,
        model.eval(),
        result.converted_model,
        result.example_inputs,
        result.io_quant_params,
        "vgf",
        delegates={"GridSamplerBackend": _shifted_grid_sampler(4)},
    )
    verdict = run.verification["verdict"]
    assert verdict["result"] == "fail", verdict["outputs"]
    divergence = verdict["divergence"]
    assert divergence["backend"] == "GridSamplerBackend", verdict["delegate_calls"]
    assert divergence["max_steps"] >= 4
    assert "grid_sample" in (divergence.get("source") or ""), divergence
    assert divergence["own_inputs"]["passes"] is False  # wrong on its own inputs: starts here
    calls = verdict["delegate_calls"]
    before = calls[: next(k for k, c in enumerate(calls) if c.get("first_failing"))]
    assert any(c["backend"] == "VgfBackend" and c.get("passes") for c in before), calls
    report = dict(result.report, verification=run.verification)
    assert "**first to fail**" in render_markdown(report)
    node_data = json.loads((folder / "model_explorer_node_data.json").read_text())
    assert any("FIRST TO FAIL" in v["value"] for v in node_data["forward"]["results"].values())
    # the same program with etkit's own kernel passed (the export's own verification, of the
    # same program, model and inputs): the sabotage is what fails it
    assert result.verification["verdict"]["result"] == "pass"


# -- a program the runtime refuses is no export -------------------------------------------------


class PadAfterSampler(torch.nn.Module):
    """A sampler's output through a constant pad, a nearest resize and a concatenation into a
    conv: XNNPACK 1.5.1 refuses its int8 constant pad node at load time."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 4, 3, 1, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(image, grid, align_corners=False)
        padded = F.pad(warped, (1, 1, 1, 1), value=0.0)
        up = F.interpolate(padded, scale_factor=2, mode="nearest")
        skip = F.interpolate(image, size=up.shape[-2:], mode="nearest")
        return self.conv(torch.cat([up, skip], 1))


def _without_pad_policy(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    """The program etkit made before its partitioner kept requantizing pads out of XNNPACK:
    etkit's quantization (calibrated defaults) and grid-sampler lowering, XNNPACK taking the
    rest."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower

    from etkit_gridsampler import GridSamplerPartitioner
    from etkit_partition import DetagOps, DetagQuantizeDtypes, PolicyPartitioner
    from etkit_quant import BoundaryQuantizer, default_qspecs, observe_ranges, quantize

    exported = torch.export.export(model, inputs, strict=True)
    defaults = default_qspecs(observe_ranges(exported, (inputs,)))
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        input_qspecs=defaults.input_qspecs,
        output_qspecs=defaults.output_qspecs,
        grid_sampler_image_qspec=defaults.grid_sampler_image_qspec,
        grid_sampler_grid_qspec=defaults.grid_sampler_grid_qspec,
        grid_sampler_output_qspec=defaults.grid_sampler_output_qspec,
    )
    converted = quantize(exported.module(check_guards=False), inputs, quantizer)
    partitioner = PolicyPartitioner(
        XnnpackPartitioner(),
        [DetagOps([torch.ops.aten.grid_sampler_2d.default]), DetagQuantizeDtypes([torch.int16])],
    )
    manager = to_edge_transform_and_lower(
        torch.export.export(converted, inputs, strict=True), partitioner=[partitioner]
    ).to_backend(GridSamplerPartitioner())
    return bytes(manager.to_executorch().buffer)


def test_program_the_runtime_refuses_is_named_with_its_reason(tmp_path: Path) -> None:
    """A program XNNPACK refuses at load time (its int8 constant pad after a sampler, without
    etkit's pad policy) is refused by the check every export runs, in one line that holds the
    runtime's own reason, not only its error code; the same model through export_model loads
    (its load stage ran) and verifies."""
    from etkit_exporter.check.verify import check_program_loads

    torch.manual_seed(0)
    model = PadAfterSampler().eval()
    inputs = (torch.rand(1, 4, 7, 9) * 2 - 1, torch.rand(1, 7, 9, 2) * 2 - 1)
    refused = tmp_path / "refused.pte"
    refused.write_bytes(_without_pad_policy(model, inputs))
    with pytest.raises(RuntimeError) as caught:
        check_program_loads(refused, "xnnpack")
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("executorch.runtime refuses the written program")
    assert "Failed to create StaticConstantPad node" in message, message
    result = export_model(
        model, inputs, artifacts_root=tmp_path / "pad", target="xnnpack", verify=True
    )
    timings = json.loads((result.artifacts_root / "timings.json").read_text())["timings_s"]
    assert "load" in timings and result.verification["verdict"]["result"] == "pass"


# -- reproducible, path-free artifacts; names too long ------------------------------------------


# Two exports of one model in two processes, every file of both targets the same bytes:
# test_diagnostics.py::test_exports_are_byte_identical_and_hold_no_build_path


def test_out_name_too_long_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = _cli("demo", "resample", "-t", "xnnpack", "--out", "x" * 300, cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "choose a name of at most" in done.stderr


def test_a_call_off_only_against_pt2e_values_is_told_apart_from_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fuzzer's class N (seed 1070, XNNPACK): a nearest sampler at a theta computed by an
    XNNPACK mean and linear. Its program was 20-30 dB from PT2E, whole pixels picked elsewhere,
    and passed inside the rounding envelope; since the quantized model adds the biases XNNPACK
    adds and clamps int8 where XNNPACK does, the theta is PT2E's and so are the pixels: the
    program is within a step of PT2E. Capped at 0 steps it fails, and the failure names the
    call where the first value a step off appears."""
    spec = importlib.util.spec_from_file_location(
        "n_case", Path(__file__).parents[3] / "bench/fuzz_findings/N-xnnpack-nearest-after-theta.py"
    )
    assert spec is not None and spec.loader is not None
    case = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "n_case", case)  # torch.export reads its source
    spec.loader.exec_module(case)
    result = export_model(
        case.ModelUnderTest, case.ModelInputs, artifacts_root=tmp_path / "n",
        target="xnnpack", verify=True,
    )  # fmt: skip
    verdict = result.verification["verdict"]
    (output,) = verdict["outputs"]
    assert verdict["result"] == "pass" and output["psnr_db"] > 50, output
    assert output["max_steps"] <= 1 and output["power_steps2"] < output["power_bound_steps2"]
    assert verdict["coordinates"] and all(c["passes"] for c in verdict["coordinates"])
    with pytest.raises(VerificationError) as caught:
        export_model(
            case.ModelUnderTest, case.ModelInputs, artifacts_root=tmp_path / "strict",
            target="xnnpack", verify=True, verify_tolerance="max-steps=0",
        )  # fmt: skip
    divergence = caught.value.divergence
    # the first value a step off: one step, at a delegate call of the program
    assert divergence is not None and divergence["backend"], divergence
    assert divergence["max_steps"] == pytest.approx(1, abs=0.01), divergence


def _two_branch_graph() -> torch.fx.GraphModule:
    """Two dithered quantizes on branches of one input, the second one's value the output."""
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed)

    ops = torch.ops.quantized_decomposed

    def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = ops.quantize_per_tensor.default(x * 1.3, 0.01, 0, -128, 127, torch.int8)
        b = ops.quantize_per_tensor.default(x * 0.7, 0.01, 0, -128, 127, torch.int8)
        return (
            ops.dequantize_per_tensor.default(a, 0.01, 0, -128, 127, torch.int8),
            ops.dequantize_per_tensor.default(b, 0.01, 0, -128, 127, torch.int8),
        )

    graph = torch.fx.symbolic_trace(model)
    x = torch.linspace(-0.9, 0.9, 999)
    for node in graph.graph.nodes:  # the shapes a skipped quantize draws its noise by
        if node.op == "call_function" and "quantize_per_tensor" in str(node.target):
            node.meta["val"] = x
    return graph


def test_envelope_runs_keep_figures_and_skip_what_no_judged_tensor_needs() -> None:
    """A reducer's figures in place of the runs' tensors; a run computing only what a captured
    node needs gives that node the values of a run of the whole graph (a skipped quantize still
    draws its noise), so the figures do not depend on what else is judged."""
    from etkit_exporter.check.envelope import ancestors, rounding_envelope
    from etkit_exporter.check.judgement import RunFigures, output_reducer

    graph = _two_branch_graph()
    x = torch.linspace(-0.9, 0.9, 999)
    names = [n.name for n in graph.graph.nodes if "dequantize" in str(n.target)]
    whole = rounding_envelope(graph, [x], samples=6, band=0.2, capture=names)
    second = names[1]
    part = rounding_envelope(
        graph, [x], samples=6, band=0.2, capture={second: None},
        needed=ancestors(graph.graph, [second]),
    )  # fmt: skip
    assert all(run[0] == [] and set(run[1]) == {second} for run in part.dithered)
    for full, partial in zip(whole.dithered, part.dithered, strict=True):
        assert torch.equal(full[1][second], partial[1][second])
    pairs = zip(whole.dithered[:-1], whole.dithered[1:], strict=True)
    assert not all(torch.equal(a[1][second], b[1][second]) for a, b in pairs)  # runs differ
    with torch.no_grad():
        reference = list(graph(x))
    entries = [{"scale": None}, {"scale": None}]
    reduced = rounding_envelope(
        graph, [x], samples=6, band=0.2, outputs=output_reducer(reference, entries)
    )
    for kept, figures in zip(whole.dithered, reduced.dithered, strict=True):
        assert all(isinstance(f, RunFigures) for f in figures[0])
        expected = output_reducer(reference, entries)(1, kept[0][1])
        assert figures[0][1] == expected and figures[0][1].power > 0
