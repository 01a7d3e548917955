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
from etkit_exporter.check.verdict import (
    VerificationError,
    failed_folder,
    judge_outputs,
    judge_tensor,
    parse_tolerance,
)
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
    tolerance = parse_tolerance("psnr=30, steps=4,fraction=5%,float-margin=0.5")
    assert tolerance == VerifyTolerance(
        min_psnr_db=30, steps=4, max_fraction=0.05, float_margin_db=0.5
    )
    off = parse_tolerance("float-margin=off")
    assert off.float_margin_db is None and parse_tolerance(off.text()) == off
    assert parse_tolerance(tolerance.text()) == tolerance
    assert parse_tolerance("") == VerifyTolerance()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("psnr", "'psnr' is not KEY=NUMBER"),
        ("dB=30", "'dB=30' is not KEY=NUMBER"),
        ("steps=1.5", "steps must be a whole number"),
        ("fraction=2", "fraction"),
        ("psnr=-1", ">= 0"),
        ("psnr=x", "'x' is not a number"),
    ],
)
def test_tolerance_text_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_tolerance(text)
    assert len(str(caught.value).splitlines()) == 1


def test_scrambled_layout_fails() -> None:
    """A spatial-transformer front end's 1->4-channel conv + ReLU output whose NHWC bytes are
    read as NCHW (what a layout mix-up gives) is far from the reference: it fails."""
    reference = _smooth((1, 4, 28, 28), seed=1)
    scrambled = reference.permute(0, 2, 3, 1).contiguous().reshape(reference.shape)
    judged = judge_tensor(scrambled, reference, STEP, VerifyTolerance())
    assert not judged["passes"]
    assert judged["psnr_db"] < 20 and judged["max_steps"] > 64
    assert judged["reasons"][0].startswith("PSNR")


def test_rounding_along_a_network_passes() -> None:
    """RAFT-shaped: a warp by a flow one step off moves a few textured pixels by many steps
    (26 measured) and leaves about a tenth of the values one or two steps off: it passes."""
    reference = _smooth((1, 3, 32, 32), seed=2)
    generator = torch.Generator().manual_seed(3)
    off = torch.randint(-2, 3, reference.shape, generator=generator) * (
        torch.rand(reference.shape, generator=generator) < 0.1
    )
    actual = reference + off * STEP
    actual.view(-1)[[10, 300, 301, 900, 2000]] += 26 * STEP
    judged = judge_tensor(actual, reference, STEP, VerifyTolerance())
    assert judged["passes"], judged
    assert judged["max_steps"] >= 26


def test_a_few_steps_everywhere_fails_though_psnr_is_high() -> None:
    """A kernel that moves every value by 3 steps keeps 38 dB, more than the PSNR floor: the
    share of values more than 2 steps off and the mean error fail it."""
    reference = _smooth((1, 4, 16, 16), seed=4) * 2 - 1
    judged = judge_tensor(reference + 3 * STEP, reference, STEP, VerifyTolerance())
    assert judged["psnr_db"] > VerifyTolerance().min_psnr_db
    assert not judged["passes"]
    assert any("more than 2 steps" in r for r in judged["reasons"])
    assert any("mean error" in r for r in judged["reasons"])


def test_a_few_logits_rounding_one_way_pass_and_a_picture_shifted_so_does_not() -> None:
    """The fuzzer's seed 2218 (XNNPACK): two logits of a batch of two after a global average
    pool, 38.7 dB, one value two steps down and one a step down (mean -0.75). Rounding, not a
    shift: the mean of four differences wanders by half a step. The same mean over a picture
    is a shift."""
    logits = torch.tensor([[0.81, -0.62], [0.05, -0.94]])
    off = torch.tensor([[-2, -1], [0, 0]]) * STEP
    judged = judge_tensor(logits + off, logits, STEP, VerifyTolerance())
    assert judged["mean_steps"] == -0.75 and judged["psnr_db"] > 36 and judged["passes"], judged
    picture = _smooth((1, 1, 16, 16), seed=7) * 2 - 1
    generator = torch.Generator().manual_seed(8)
    down = torch.rand(picture.shape, generator=generator) < 0.75
    shifted = judge_tensor(picture - down * STEP, picture, STEP, VerifyTolerance())
    assert not shifted["passes"] and shifted["reasons"] == [
        r for r in shifted["reasons"] if r.startswith("mean error")
    ], shifted


def test_one_of_two_logits_off_passes_unless_no_value_may_be() -> None:
    """The fuzzer's seed 2302 (XNNPACK): a linear head after a global average pool, two
    logits, one 3 steps off (a pooled value's one-step rounding, amplified by the head's
    scales), 41.3 dB. Half of two values is no share; a user's ``fraction=0`` still means no
    value, and two values off is a share again."""
    logits = torch.tensor([[0.9, -0.95]])
    one = judge_tensor(logits + torch.tensor([[-3, 0]]) * STEP, logits, STEP, VerifyTolerance())
    assert one["fraction_over"] == 0.5 and one["passes"], one
    strict = VerifyTolerance(max_fraction=0.0)
    assert not judge_tensor(logits + torch.tensor([[-3, 0]]) * STEP, logits, STEP, strict)["passes"]
    both = judge_tensor(logits + torch.tensor([[-3, 3]]) * STEP, logits, STEP, VerifyTolerance())
    assert not both["passes"]


def test_one_step_on_a_tensor_spanning_few_steps_passes_and_two_do_not() -> None:
    """A correlation lookup whose values span 6 steps, one step off at random places, is 33 dB
    from its reference: rounding, so it passes; the same places 2 steps off fail on PSNR."""
    generator = torch.Generator().manual_seed(6)
    reference = torch.randint(-3, 4, (1, 18, 16, 16), generator=generator) * STEP
    where = torch.rand(reference.shape, generator=generator) < 0.08
    signs = torch.where(torch.rand(reference.shape, generator=generator) < 0.5, -1.0, 1.0)
    one_off = judge_tensor(reference + where * signs * STEP, reference, STEP, VerifyTolerance())
    assert one_off["psnr_db"] < VerifyTolerance().min_psnr_db and one_off["max_steps"] == 1
    assert one_off["passes"], one_off
    two_off = judge_tensor(reference + 2 * where * signs * STEP, reference, STEP, VerifyTolerance())
    assert not two_off["passes"] and two_off["reasons"][0].startswith("PSNR")


def test_a_16_bit_delegate_output_is_judged_in_8_bit_steps() -> None:
    """An int16 lookup grid 16 of its own steps off in places (two backends' float coordinate
    arithmetic) is within tolerance in the steps its range has in 8 bits; an int8 tensor with
    the same integer errors is not."""
    from etkit_exporter.check.verdict import _judged_step

    scale = 2 / 32767
    assert _judged_step(torch.zeros(1, dtype=torch.int16), scale) == scale * 256
    assert _judged_step(torch.zeros(1, dtype=torch.int8), scale) == scale
    generator = torch.Generator().manual_seed(7)
    reference = (torch.rand(1, 8, 8, 2, generator=generator) * 2 - 1).div(scale).round() * scale
    actual = reference + (torch.rand(reference.shape, generator=generator) < 0.2) * 16 * scale
    grid = judge_tensor(
        actual, reference, _judged_step(torch.zeros(1, dtype=torch.int16), scale), VerifyTolerance()
    )
    assert grid["passes"], grid
    assert not judge_tensor(actual, reference, scale, VerifyTolerance())["passes"]


def test_float_outputs_in_their_own_terms() -> None:
    reference = torch.randn(2, 10, generator=torch.Generator().manual_seed(5))
    close = reference + 1e-6
    assert judge_tensor(close, reference, None, VerifyTolerance(), float_reference=True)["passes"]
    half_off = reference.clone()
    half_off[:, :5] += 0.1 * float(reference.max() - reference.min())
    judged = judge_tensor(half_off, reference, None, VerifyTolerance())
    assert not judged["passes"] and "of the reference's range" in judged["reasons"][-1]
    # a float export is held to the float model more tightly than a quantized one
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(6))
    slightly = reference + 0.01 * noise  # 55 dB
    assert judge_tensor(slightly, reference, None, VerifyTolerance())["passes"]
    assert not judge_tensor(slightly, reference, None, VerifyTolerance(), float_reference=True)[
        "passes"
    ]


def test_outputs_verdict_names_the_failing_output() -> None:
    good = _smooth((1, 4, 8, 8), seed=6)
    bad = _smooth((1, 4, 8, 8), seed=7)
    entries = [{"scale": STEP}, {"scale": STEP}]
    verdict = judge_outputs([good, bad], [good, good], entries, VerifyTolerance())
    assert verdict["result"] == "fail" and verdict["failing_outputs"] == [1]
    assert verdict["tolerance"]["min_psnr_db"] == VerifyTolerance().min_psnr_db


def _rounded(values: torch.Tensor, seed: int, spread: float) -> torch.Tensor:
    """``values`` with a rounding walk of ``spread`` steps (std) added, in int8 steps: one
    quantized realization of a deep network."""
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.round(values / STEP + spread * torch.randn(values.shape, generator=generator)) * STEP
    )


def test_accumulated_rounding_passes_and_a_wrong_or_shifted_program_does_not() -> None:
    """Eight residual blocks (the RIFE IFBlock's, measured: the VGF program 44.0 dB and 13.3 %
    of values more than 2 steps from PT2E, 45.8 dB from the float model, PT2E 46.1 dB): the
    program and the PT2E model are two roundings of the float model, equally far from it and
    further from each other. A program with an error of its own is further from the float
    model; a shifted one is biased: both fail."""
    real = _smooth((1, 8, 16, 16), seed=9) * 2 - 1
    model, program = _rounded(real, 10, 1.6), _rounded(real, 11, 1.6)
    entries = [{"scale": STEP}]
    alone = judge_outputs([program], [model], entries, VerifyTolerance())
    assert alone["result"] == "fail"  # the step rules alone
    verdict = judge_outputs([program], [model], entries, VerifyTolerance(), float_references=[real])
    (output,) = verdict["outputs"]
    assert verdict["result"] == "pass", output
    assert output["fraction_over"] > 0.1 and "accumulated rounding" in output["accepted"]
    assert output["psnr_vs_float_db"] >= output["reference_psnr_vs_float_db"] - 1
    wrong = _rounded(program, 12, 1.6)  # its own error on top
    verdict = judge_outputs([wrong], [model], entries, VerifyTolerance(), float_references=[real])
    assert verdict["result"] == "fail" and "accepted" not in verdict["outputs"][0]
    shifted = program + 2 * STEP
    verdict = judge_outputs([shifted], [model], entries, VerifyTolerance(), float_references=[real])
    assert verdict["result"] == "fail" and verdict["outputs"][0]["biased"]
    strict = VerifyTolerance(float_margin_db=0.0)
    farther = judge_outputs(
        [_rounded(real, 13, 1.75)], [model], entries, strict, float_references=[real]
    )
    assert farther["result"] == "fail"  # a little further from the float model than PT2E


# -- a failed verification, end to end (etkit-export) -----------------------------------------


@pytest.fixture(scope="module")
def failed_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``etkit-export`` with a tolerance the program does not meet (no value may be a step
    off; the flow-warp demo is 1 step off at some pixels), into an absolute --out."""
    cwd = tmp_path_factory.mktemp("failed")
    out = cwd / "warp"
    done = _cli(
        "demo", "flow-warp", "-t", "xnnpack", "--out", str(out),
        "--verify-tolerance", "steps=0,fraction=0,float-margin=off",
        cwd=cwd,
    )  # fmt: skip
    return out, done


def test_failed_verification_exits_1_with_one_line_per_fact(failed_cli: tuple[Path, Any]) -> None:
    out, done = failed_cli
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("etkit-export: ")]
    assert lines[0].startswith("etkit-export: verification failed")
    assert any(
        line.startswith("etkit-export: output 0 vs the quantized PT2E model") for line in lines
    )
    assert any("first divergence: instruction" in line for line in lines), lines
    kept = failed_folder(out)
    assert any(str(kept) in line for line in lines)
    assert "Traceback" not in done.stderr


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
    assert verdict["tolerance"]["steps"] == 0 and verdict["tolerance"]["max_fraction"] == 0
    assert verdict["divergence"]["backend"] in ("XnnpackBackend", "GridSamplerBackend")
    assert any(row.get("first_failing") for row in verdict["delegate_calls"])
    assert "**first to fail**" in (kept / "report.md").read_text()
    assert not (kept / "model.bpte").exists()


def test_export_toml_holds_no_absolute_path(failed_cli: tuple[Path, Any]) -> None:
    out, _ = failed_cli
    config = (failed_folder(out) / "export.toml").read_text()
    assert str(out.parent) not in config and "out =" not in config
    assert 'verify-tolerance = "steps=0,fraction=0,float-margin=off"' in config


def test_earlier_failed_export_replaced_only_with_force(failed_cli: tuple[Path, Any]) -> None:
    """The failed folder is an etkit export like any other: an export that would keep another
    failure there is refused before any work without --force."""
    out, _ = failed_cli
    refused = _cli(
        "demo", "resample", "-t", "xnnpack", "--out", str(out), "--verify", cwd=out.parent
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "failed-verification holds an earlier etkit export" in refused.stderr
    assert not out.exists()


def test_etkit_inspect_shows_the_verdict(failed_cli: tuple[Path, Any]) -> None:
    out, _ = failed_cli
    kept = failed_folder(out)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "etkit"), "inspect", str(kept), "--no-report"],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "verification verdict: fail" in done.stdout
    assert "first divergence: instruction" in done.stdout


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
    # the same program with etkit's own kernel passes: the sabotage is what fails it
    again = verify_export(
        folder, model.eval(), result.converted_model, result.example_inputs,
        result.io_quant_params, "vgf",
    )  # fmt: skip
    assert again.passed


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


def test_two_identical_exports_give_identical_artifacts(tmp_path: Path) -> None:
    model, inputs = DEMOS["resample"]()
    model.train()
    for name in ("a", "b"):
        export_model(model, inputs, artifacts_root=tmp_path / name, target="xnnpack")
    assert model.training  # the caller's mode, as it was
    for name in ("model.pte", "etrecord.bin", "etrecord.json", MANIFEST):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_out_name_too_long_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = _cli("demo", "resample", "-t", "xnnpack", "--out", "x" * 300, cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "choose a name of at most" in done.stderr


def test_a_call_off_only_against_pt2e_values_is_told_apart_from_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fuzzer's class N (seed 1070, XNNPACK): a nearest sampler at a theta computed by an
    XNNPACK mean and linear (55.9 dB from PT2E's theta) picks other pixels where the grid is
    near a pixel boundary: the output is 27.6 dB from PT2E, and the first call off is etkit's
    sampler. On its own inputs (the quantized model's ops run on the program's values upstream)
    the sampler is exact, and so is every call and the output: the program is right op by op,
    and the verdict passes it as amplified rounding. With the rules beyond the step rules off,
    it fails, and the divergence says what it is."""
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
    assert verdict["result"] == "pass" and output["psnr_db"] < 30, output
    assert "amplifies per-op rounding" in output["accepted"]
    sampler = next(c for c in verdict["delegate_calls"] if c.get("first_failing"))
    assert sampler["backend"] == "GridSamplerBackend" and sampler["own_inputs"]["max_steps"] == 0
    with pytest.raises(VerificationError) as caught:
        export_model(
            case.ModelUnderTest, case.ModelInputs, artifacts_root=tmp_path / "strict",
            target="xnnpack", verify=True, verify_tolerance="float-margin=off",
        )  # fmt: skip
    divergence = caught.value.divergence
    assert divergence is not None and divergence["backend"] == "GridSamplerBackend"
    assert divergence["own_inputs"]["passes"] and divergence["first_wrong_on_own_inputs"] is None
    assert "carries and amplifies a difference from upstream" in str(caught.value)
