"""``etkit-export``: export a built-in demo or your own model from the command line."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from etkit_exporter.artifact.sizes_text import size_lines
from etkit_exporter.artifact.staging import raise_stop_signal
from etkit_exporter.artifact.verdict_text import envelope_lines, tolerance_text
from etkit_exporter.cli.config import CONFIG_NAME, OPTIONS, render_config
from etkit_exporter.cli.failures import (
    OpenLine,
    WithoutPartialGraphs,
    cli_words,
    print_failure,
    refusal,
)
from etkit_exporter.cli.main import ArgumentParser, quiet_third_party_noise
from etkit_exporter.cli.main import version_line as _version_line
from etkit_exporter.cli.models import (
    ModelError,
    UsageError,
    load_inputs,
    load_model,
)
from etkit_exporter.core.diagnostics import reason_line

# The pipeline and the modules that import ExecuTorch's backends are imported in the functions
# that use them: importing them takes 11 s beyond torch here, and prints torchao's and ExecuTorch's
# import-time messages unless quiet_third_party_noise() runs first; `etkit-export --help` and
# every usage error answer without them.

EXAMPLES = """examples:
  etkit-export demo                # the flow-warp demo, for VGF, into artifacts/flow-warp-vgf
  etkit-export demo stn --target xnnpack --verify
  etkit-export --model mypkg.models:make_warp --input-shape 1x3x256x256 --input-shape 1x3x256x256 \\
               --quant-input snorm8 --quant-input snorm8 --quant-output snorm8 --out out/warp
  etkit-export demo resample --quant-input snorm8 --quant-input snorm16 \\
               --quant-output q0.7 --quant-output float --force
  etkit-export --model mypkg.models:make_warp --calibration frames/ --image-range -1,1 \\
               --quant-grid q1.14

defaults: every boundary and grid-sampler qspec not given is chosen from the calibration data
(the example inputs when --calibration is absent): snorm8 for values in [-1, 1], snorm16 for grids
in [-1, 1], a power-of-two int16 scale covering wider grids, observed int8 otherwise. Each fixed
range is checked against the calibration data: the share outside it is reported (saturation),
with a warning past 0.1 %.

qspecs: snorm8 (int8, 1/127), snorm16 (int16, 1/32767), unorm8 (uint8, 1/255: refused for now,
ExecuTorch 1.5.1 computes uint8 wrongly in XNNPACK and cannot lower it for VGF), qM.N (a Q-format:
M integer and N fraction bits, 8 bits when M+N < 8, else 16), float (leave that input/output float).
exit status: 0 exported, 1 the export failed, 2 usage error (each with a one-line reason on stderr).
"""


class _Parser(ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    from etkit_exporter.core.targets import TARGETS, VGF_TOSA_SPEC
    from etkit_exporter.export.demos import DEMOS

    parser = _Parser(
        prog="etkit-export",
        description="Export a grid-sampling PyTorch model to an integer-IO ExecuTorch program "
        "(VGF or XNNPACK, with etkit's grid sampler), with its artifacts and report.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "demo", nargs="*", metavar="demo [NAME]",
        help=f"export a built-in demo: {', '.join(DEMOS)} (default flow-warp)",
    )  # fmt: skip
    parser.add_argument(
        "-m", "--model", metavar="MODEL",
        help="your model: MODULE:FACTORY, FILE.py:FACTORY, FILE.py (defining ModelUnderTest and "
        "ModelInputs, as ExecuTorch's Arm compiler reads it) or FILE.pt2 (torch.export.save)",
    )  # fmt: skip
    parser.add_argument(
        "--inputs", "--model_input", metavar="FILE",
        help="example inputs: a .pt (a tensor, or a tuple or list of them) or a .npz (arrays in "
        "the order saved)",
    )  # fmt: skip
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="NxCxHxW",
        help="shape of one example input (repeat per input; needed when the factory returns "
        "only the module)",
    )  # fmt: skip
    parser.add_argument("--quant-input", action="append", metavar="QSPEC", help="per input")
    parser.add_argument("--quant-output", action="append", metavar="QSPEC", help="per output")
    parser.add_argument(
        "--quant-grid", metavar="QSPEC",
        help="the grid samplers' grid qspec (default: from the calibration data)",
    )  # fmt: skip
    parser.add_argument("--quant-sampler-image", metavar="QSPEC", help="grid samplers' image")
    parser.add_argument("--quant-sampler-output", metavar="QSPEC", help="grid samplers' output")
    parser.add_argument(
        "--calibration", metavar="PATH",
        help="calibration samples: a folder or glob of .npy/.npz/.pt files or images",
    )  # fmt: skip
    parser.add_argument(
        "--image-range", metavar="LOW,HIGH",
        help="the value range images in --calibration map to, e.g. -1,1 or 0,1",
    )  # fmt: skip
    parser.add_argument("--no-quant", action="store_true", help="export in float")
    parser.add_argument(
        "-t", "--target", choices=TARGETS, default="vgf",
        help="vgf: Arm's ML extensions for Vulkan (a GPU), with etkit's grid sampler inside "
        "the VGF; xnnpack: CPUs, the grid sampler on etkit's CPU kernel (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--tosa-spec", metavar="SPEC",
        help=f"the TOSA specification VGF lowers to (default {VGF_TOSA_SPEC}; vgf only)",
    )  # fmt: skip
    parser.add_argument(
        "--grid-math", choices=("float", "int"),
        help="float (default): only the coordinate arithmetic between the last conv/linear/"
        "pooling/resize and each grid sampler's grid input runs in float, quantized once at the "
        "sampler; every layer before it in int8. int: quantize the coordinate arithmetic too",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--out", "--output", type=Path,
        help="artifacts folder (default artifacts/NAME-TARGET)",
    )  # fmt: skip
    parser.add_argument(
        "-i", "--intermediates", type=Path, metavar="DIR",
        help="where the VGF/TOSA intermediates go (default OUT/intermediates)",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, metavar="FILE",
        help="a TOML file of these options (the command line overrides it); every export "
        "writes the one that reproduces it as OUT/export.toml",
    )  # fmt: skip
    parser.add_argument("--version", action="store_true", help="print the versions and exit")
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier etkit export at --out (never other files: the docs' "
        "reference, 'Where exports go')",
    )  # fmt: skip
    parser.add_argument(
        "--verify", action="store_true",
        help="run the written program and compare it with the float and quantized models "
        "(xnnpack: executorch.runtime; vgf: etkit's runner, VGF on Vulkan)",
    )  # fmt: skip
    parser.add_argument(
        "--verify-tolerance", metavar="KEY=N,...",
        help="the verdict's settings (implies --verify): samples (runs of the rounding "
        "envelope), band (steps from a rounding boundary a quantize may round the other way), "
        "coordinate-bias (px), float-psnr (float exports), max-steps (a cap on every value, or "
        "off); default samples=16,band=0.02,coordinate-bias=0.125,float-psnr=60,max-steps=off",
    )  # fmt: skip
    parser.add_argument(
        "--bundle", "--bundleio", action="store_true",
        help="also write model.bpte: the program with the example inputs in its IO types and "
        "its own verified outputs (implies --verify)",
    )  # fmt: skip
    parser.add_argument(
        "--scenario", action="store_true",
        help="also write scenario/: the whole program as one Vulkan scenario "
        "(scenario_runner --scenario scenario/scenario.json; target vgf)",
    )  # fmt: skip
    parser.add_argument(
        "--sampler-delegate", action="store_true",
        help="vgf: keep the grid samplers in etkit's own delegate between VGF delegates (the "
        "device then needs etkit's C++ backend) instead of inside the VGF as compute segments",
    )  # fmt: skip
    parser.add_argument(
        "--qat-checkpoint", metavar="FILE",
        help="export a QAT-trained model: FILE holds the state_dict() of the module "
        "etkit_exporter.qat_prepare made from --model with these options (target, "
        "--calibration, --quant-*); nothing is calibrated again",
    )  # fmt: skip
    parser.add_argument(
        "--state", action="append", metavar="INPUT=OUTPUT",
        help="a state the model takes and returns: OUTPUT goes back into INPUT each frame, "
        "e.g. history=new_history (repeat for each; a buffer forward writes needs none)",
    )  # fmt: skip
    parser.add_argument(
        "--calibration-sequences", metavar="FOLDER",
        help="a model with state: a folder of sequences, one sub-folder each, its frames in "
        "name order as --calibration reads samples; calibrated with the state fed back, and "
        "the first sequence is the loop --verify runs",
    )  # fmt: skip
    parser.add_argument(
        "--loop-frames", metavar="N",
        help="a model with state: frames --verify runs the loop for (default 16; a shorter "
        "sequence holds its last frame)",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", metavar="HxW,...",
        help="export for these input sizes, one method each in one program (forward_540x960, "
        "...; forward is the first), e.g. 540x960,720x1280",
    )  # fmt: skip
    parser.add_argument(
        "--dynamic-size", metavar="HMIN-HMAXxWMIN-WMAX[/M]",
        help="xnnpack: one method for every height and width in the range (a multiple of M), "
        "e.g. 256-1088x256-1920/64",
    )  # fmt: skip
    parser.add_argument(
        "--etrecord", choices=("slim", "full"),
        help="what etrecord.bin holds: slim (default) what ExecuTorch's Inspector and etkit "
        "inspect need; full also the ATen program and the float model (etkit inspect then "
        "compares every value with the float model's)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="print where the time went: each stage's slowest passes, partitioners, backend "
        "preprocess calls and tools, and etkit's own share (timings.json's profile_s)",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="debug logs of etkit and Arm")
    return parser


def parse_qspec(text: str) -> Any:
    """A qspec from its command-line name; ``None`` for ``float``."""
    from etkit_quant import qformat, snorm8, snorm16, unorm8

    named = {"snorm8": snorm8, "snorm16": snorm16, "unorm8": unorm8}
    if text in named:
        return named[text]()
    if text == "float":
        return None
    match = re.fullmatch(r"q(\d{1,3})\.(\d{1,3})", text)
    if match:
        integer, fraction = int(match[1]), int(match[2])
        if integer + fraction > 15:
            raise UsageError(
                f"qspec '{text}' has {integer + fraction} integer and fraction bits; a Q-format "
                "fits a sign bit and at most 15 more in int16 (e.g. q3.12, q0.7)"
            )
        return qformat(fraction, bits=8 if integer + fraction < 8 else 16)
    if re.fullmatch(r"q\d+\.\d+", text):
        raise UsageError(f"qspec '{text}' is out of range: a Q-format has M + N <= 15 (e.g. q3.12)")
    raise UsageError(f"unknown qspec '{text}' (snorm8, snorm16, unorm8, qM.N or float)")


def parse_shape(text: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(x\d+)*", text) or "x0" in f"x{text}":
        raise UsageError(f"bad --input-shape '{text}': expected positive sizes like 1x3x256x256")
    return tuple(int(part) for part in text.split("x"))


class _TerminalOutput:
    """Where progress goes, and whether it is a terminal (one updating line) or not."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())


class _Progress(_TerminalOutput):
    """Stage progress: one updating line on a terminal, plain lines otherwise. A Ctrl-C whose
    ``KeyboardInterrupt`` Python lost inside the stage (in a finalizer) stops the export here,
    before the next stage (``raise_stop_signal``)."""

    def __call__(self, stage: str, seconds: float) -> None:
        raise_stop_signal()
        if self.tty:
            self.stream.write(f"\r\033[K  {stage:<26} done in {seconds:6.2f} s")
            self.stream.write("\n" if stage in ("serialize", "verify", "bundle") else "")
        else:
            self.stream.write(f"stage {stage}: {seconds:.2f} s\n")
        self.stream.flush()

    def step(self, what: str, done: int, total: int) -> None:
        """A long stage's progress (``export_model``'s ``on_progress``): on a terminal the line
        says which part of the verification runs and how many of its runs are done; otherwise
        one line as each part starts."""
        raise_stop_signal()
        if self.tty:
            count = f" {done}/{total} runs" if total else ""
            self.stream.write(f"\r\033[K  verify: {what}{count}")
        elif not total:
            self.stream.write(f"verify: {what}\n")
        self.stream.flush()


def _summary(result: Any, seconds: float) -> str:
    from etkit_quant import describe_qspec

    report = result.report
    lines = ["", "partitions:"]
    for p in report["partitions"]:
        lines.append(f"  {p['name']:<20} {p['backend']:<20} {p['nodes']:>4} nodes")
    outside = [
        entry for entry in report.get("outside_delegates", []) if "grid_sampler" in entry["op"]
    ]
    if outside:
        lines.append("grid samplers outside the delegates (ExecuTorch's portable float kernel):")
        lines += [f"  {entry['node']}: {entry['reason']}" for entry in outside]
    paths = report.get("grid_sampler_paths", [])
    if paths:
        lines.append("grid samplers:")
        for path in paths:
            why = f" ({path['reason']})" if path.get("reason") else ""
            lines.append(f"  {path['node']}: {path['path']}{why}")
    lines.append("io quantization:")
    for kind in ("inputs", "outputs"):
        for e in report["io"][kind]:
            q = (
                "float"
                if e["scale"] is None
                else f"{e['dtype']} scale {e['scale']:.6g} zp {e['zero_point']}"
            )
            texture = f" ({e['texture']['format']})" if e.get("texture") else ""
            lines.append(f"  {kind[:-1]:<6} {e['index']} {e['name']:<12} {q}{texture}")
    float_section = report.get("float_ops")
    if float_section:  # every op the program runs in float, in one line; heavy ones warned
        lines.append(float_section["summary"])
        lines += [f"warning: {warning}" for warning in float_section["warnings"]]
    if result.saturation:
        lines.append("saturation (calibration values outside each fixed range):")
        for record in result.saturation:
            instead = record.instead()
            clips = (
                "ok"
                if record.passes()
                else "CLIPS" + (f": use {describe_qspec(instead)}" if instead else "")
            )
            lines.append(
                f"  {record.name}: {record.qspec}, {100 * record.fraction:.3g} % outside: {clips}"
            )
    if result.verification:
        runner = result.verification.get("runner", "executorch.runtime")
        verdict = result.verification.get("verdict") or {}
        tolerance = verdict.get("tolerance") or {}
        lines.append(
            f"verification ({runner}): {verdict.get('result', 'no verdict')} "
            f"({tolerance_text(tolerance)})"
        )
        for c in result.verification["comparisons"]:
            steps = f", {c['max_steps']} steps max" if "max_steps" in c else ""
            lines.append(
                f"  output {c['output']} vs {c['reference']:<22} max abs error "
                f"{c['max_abs_error']:.4g}, PSNR "
                + ("inf (identical)" if c["psnr_db"] is None else f"{c['psnr_db']:.2f} dB")
                + steps
            )
        lines += [f"  {line}" for line in envelope_lines(verdict)]
        for row in result.verification.get("qat_model", []):  # a QAT-trained model (qat.py)
            steps = f"{row['max_steps']} steps max" if "max_steps" in row else "float output"
            lines.append(f"  output {row['output']} vs the QAT model's eval forward: {steps}")
    sizes = getattr(result, "sizes", None)
    if sizes:  # an export of several sizes: its methods, their bytes, each verdict
        lines.append("sizes:")
        lines += [f"  {line}" for line in size_lines(sizes)]
    lines.append("artifacts:")
    names = ("model.pte", "model.bpte", "io_quant_params.json", "report.json", "report.md",
             "export.toml")  # fmt: skip
    for name in (*names, "intermediates"):
        path = result.artifacts_root / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            lines.append(f"  {path}")
    lines.append(f"exported in {seconds:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``etkit-export``; returns the exit status."""
    from etkit_exporter.artifact.staging import check_destination

    quiet_third_party_noise()  # before torch and torchao are imported
    try:
        args = _parse(argv)
        if args.version:
            print(version_line())
            return 0
        if args.verbose or os.environ.get("EXPORT_EXECUTORCH_VERBOSE") == "1":
            logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
            for name in ("etkit_quant", "etkit_layout", "etkit_partition", "etkit_gridsampler",
                         "etkit_exporter", "executorch.backends.arm"):  # fmt: skip
                logging.getLogger(name).setLevel(logging.DEBUG)
        model, inputs, name = _model_from(args)
        ins = None if args.quant_input is None else [parse_qspec(q) for q in args.quant_input]
        outs = None if args.quant_output is None else [parse_qspec(q) for q in args.quant_output]
        samplers = {
            f"grid_sampler_{role}_qspec": parse_qspec(text)
            for role, text in (
                ("image", args.quant_sampler_image),
                ("grid", args.quant_grid),
                ("output", args.quant_sampler_output),
            )
            if text is not None
        }
        calibration = _calibration_from(args, model, inputs)
        stateful = _state_options(args, model, inputs, calibration)
        qat = _qat_options(args, ins, outs, samplers, calibration)  # these prepare a QAT model
        if qat is not None:
            ins = outs = calibration = None
            samplers = {}
        tolerance = _tolerance_from(args)
        from etkit_exporter.export.sizes import size_options

        sized = size_options(args.sizes, args.dynamic_size)
        out = args.out if args.out is not None else Path("artifacts") / f"{name}-{args.target}"
        destination = check_destination(out, args.force)
    except (UsageError, ValueError, FileExistsError) as error:
        print(f"etkit-export: usage error: {error}".splitlines()[0], file=sys.stderr)
        return 2
    except ModelError as error:
        print(f"etkit-export: export failed: {error}", file=sys.stderr)
        return 1
    from etkit_exporter.check.verdict import VerificationError
    from etkit_exporter.core.errors import ExportError
    from etkit_exporter.export.pipeline import export_model

    start = time.perf_counter()
    stderr = sys.stderr
    if not args.verbose:
        sys.stderr = WithoutPartialGraphs(stderr)
    print(f"exporting {name} for {args.target} into {out}", flush=True)
    for note in destination.notes:
        print(f"note: {note}", flush=True)
    progress = OpenLine(sys.stdout)
    stage_progress = _Progress(progress)
    try:
        if qat is not None:  # the float model prepared as it trained, the checkpoint loaded
            model = _qat_model(args, model, inputs, qat, _SampleProgress(progress))
        result = export_model(
            model,
            inputs,
            artifacts_root=out,
            quantized_input_qspecs=ins,
            quantized_output_qspecs=outs,
            **({} if "calibration" in stateful else {"calibration": calibration}),
            on_calibration_sample=_SampleProgress(progress),
            enable_pt2e_quantization=not args.no_quant,
            **samplers,
            target=args.target,
            tosa_spec=args.tosa_spec,
            grid_math=args.grid_math or "float",
            etrecord=args.etrecord or "slim",
            intermediate_artifacts_root=args.intermediates,
            verify=args.verify or tolerance is not None,
            verify_tolerance=tolerance,
            bundle=args.bundle,
            scenario=args.scenario,
            sampler_delegate=args.sampler_delegate,
            **sized,
            **stateful,
            force=args.force,
            on_stage=stage_progress,
            on_progress=stage_progress.step,
            extra_artifacts={CONFIG_NAME: render_config(_config_of(args, name, out)).encode()},
        )
    except (TypeError, ValueError, FileExistsError) as error:
        print_failure(stderr, progress, [f"usage error: {reason_line(cli_words(error))}"])
        return 2
    except VerificationError as error:  # one line per fact: what failed, by how much, where
        print_failure(stderr, progress, str(error).splitlines())
        return 1
    except ExportError as error:
        refused = refusal(error)
        if refused is not None:  # an option the target cannot honour, refused before calibration
            print_failure(stderr, progress, [f"usage error: {refused}"])
            return 2
        progress.end_line()
        if args.verbose:
            traceback.print_exception(error, file=stderr)
        print_failure(stderr, progress, [f"export failed: {reason_line(str(error))}"])
        if not args.verbose:
            print("  (--verbose shows the whole chain of errors)", file=stderr, flush=True)
        return 1
    except (KeyboardInterrupt, SystemExit) as stop:
        if isinstance(stop, SystemExit) and stop.code != 128 + signal.SIGTERM:
            raise
        what = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated"
        print(f"etkit-export: {what}; nothing was written and {out} is as it was", file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        sys.stderr = stderr
    print(_summary(result, time.perf_counter() - start))
    if args.profile and "profile_s" in result.report:
        from etkit_exporter.export.pass_profile import profile_text

        print("\n".join(profile_text(result.report["profile_s"])))
    return 0


def _qat_options(
    args: argparse.Namespace,
    ins: list[Any] | None,
    outs: list[Any] | None,
    samplers: dict[str, Any],
    calibration: list[tuple[torch.Tensor, ...]] | None,
) -> dict[str, Any] | None:
    """With ``--qat-checkpoint``: the quantization options, which prepare the model for QAT as
    ``qat_prepare`` prepared it for training (``None`` without it)."""
    if args.qat_checkpoint is None:
        return None
    if args.no_quant:
        raise UsageError("--qat-checkpoint exports a quantized model: drop --no-quant")
    if not Path(args.qat_checkpoint).is_file():
        raise UsageError(f"--qat-checkpoint {args.qat_checkpoint} does not exist")
    return {
        "quantized_input_qspecs": ins,
        "quantized_output_qspecs": outs,
        "calibration": calibration,
        **samplers,
    }


def _qat_model(
    args: argparse.Namespace,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    options: dict[str, Any],
    on_sample: Any,
) -> torch.nn.Module:
    """The QAT module ``qat_prepare`` makes of ``model`` with the export's options, the trained
    state of ``--qat-checkpoint`` loaded (``export.qat.prepared_from_checkpoint``)."""
    from etkit_exporter.export.qat import prepared_from_checkpoint

    return prepared_from_checkpoint(
        model,
        inputs,
        args.qat_checkpoint,
        target=args.target,
        tosa_spec=args.tosa_spec,
        grid_math=args.grid_math or "float",
        on_calibration_sample=on_sample,
        **options,
    )


def _tolerance_from(args: argparse.Namespace) -> Any:
    """``--verify-tolerance`` as a ``VerifyTolerance`` (``None`` when not given)."""
    if args.verify_tolerance is None:
        return None
    from etkit_exporter.check.tolerance import parse_tolerance

    try:
        return parse_tolerance(args.verify_tolerance)
    except ValueError as error:
        raise UsageError(f"--verify-tolerance: {error}") from error


def _state_options(
    args: argparse.Namespace,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    calibration: list[tuple[torch.Tensor, ...]] | None,
) -> dict[str, Any]:
    """``export_model``'s ``state``, ``calibration`` (as sequences) and ``loop_frames`` from
    --state, --calibration-sequences and --loop-frames."""
    options: dict[str, Any] = {}
    if args.state:
        pairs = {}
        for text in args.state:
            name_in, sep, name_out = text.partition("=")
            if not sep or not name_in.strip() or not name_out.strip():
                raise UsageError(f"--state {text}: give INPUT=OUTPUT, e.g. history=new_history")
            pairs[name_in.strip()] = name_out.strip()
        options["state"] = pairs
    if args.loop_frames is not None:
        try:
            frames = int(args.loop_frames)
        except ValueError:
            frames = 0
        if frames < 1:
            raise UsageError(
                f"--loop-frames {args.loop_frames}: give a whole number of frames, 1 or more"
            )
        options["loop_frames"] = frames
    if args.calibration_sequences is not None:
        if calibration is not None:
            raise UsageError("--calibration and --calibration-sequences: give one of them")
        folder = Path(args.calibration_sequences)
        parts = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        if not parts:
            raise UsageError(
                f"--calibration-sequences {folder}: give a folder with one sub-folder per sequence"
            )
        sequences = []
        for part in parts:
            args.calibration = str(part)
            sequences.append(_calibration_from(args, model, inputs))
        args.calibration = None
        options["calibration"] = sequences
    return options


def _calibration_from(
    args: argparse.Namespace, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> list[tuple[torch.Tensor, ...]] | None:
    from etkit_exporter.core.calibration_data import (
        CalibrationDataError,
        parse_image_range,
        read_calibration,
    )

    if args.calibration is None:
        return None
    try:
        names = [
            name
            for name, parameter in inspect.signature(model.forward).parameters.items()
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        ]
        image_range = parse_image_range(args.image_range) if args.image_range else None
        sized = args.sizes is not None or args.dynamic_size is not None  # any of its sizes
        return read_calibration(
            args.calibration, inputs, input_names=names, image_range=image_range, any_size=sized
        )
    except CalibrationDataError as error:
        raise UsageError(str(error)) from error


class _SampleProgress(_TerminalOutput):
    """Calibration progress: a bar on a terminal, one line at the end otherwise."""

    def __call__(self, done: int, total: int) -> None:
        if self.tty:
            filled = round(24 * done / total)
            bar = "#" * filled + "." * (24 - filled)
            self.stream.write(f"\r\033[K  calibration [{bar}] {done}/{total} samples")
            self.stream.write("\n" if done == total else "")
        elif done == total:
            self.stream.write(f"calibration: {total} samples\n")
        self.stream.flush()


def _model_from(args: argparse.Namespace) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    from etkit_exporter.export.demos import DEMOS

    shapes = [parse_shape(s) for s in args.input_shape]
    if args.tosa_spec is not None:
        if args.target != "vgf":  # answered before the Arm backend is imported (seconds)
            raise UsageError("--tosa-spec applies to --target vgf only")
        from etkit_exporter.export.arguments import check_tosa_spec

        check_tosa_spec(args.tosa_spec, args.target, not args.no_quant)
    if args.inputs is not None and shapes:
        raise UsageError("give --inputs or --input-shape, not both")
    quant_options = (
        args.quant_input, args.quant_output, args.quant_grid, args.quant_sampler_image,
        args.quant_sampler_output, args.calibration,
    )  # fmt: skip
    if args.no_quant and any(option is not None for option in quant_options):
        raise UsageError(
            "--quant-*/--calibration options have no effect with --no-quant: drop one or the other"
        )
    if args.image_range is not None and args.calibration is None:
        raise UsageError("--image-range applies to images in --calibration: give --calibration")
    if args.demo:
        if args.demo[0] != "demo" or len(args.demo) > 2:
            raise UsageError(f"unexpected arguments {' '.join(args.demo)} (try: demo [NAME])")
        if args.model:
            raise UsageError("give either demo [NAME] or --model, not both")
        if shapes or args.inputs is not None:
            raise UsageError(
                "--input-shape and --inputs apply to --model only: a demo has its own example "
                "inputs"
            )
        name = args.demo[1] if len(args.demo) == 2 else "flow-warp"
        if name not in DEMOS:
            raise UsageError(f"unknown demo '{name}' (one of {', '.join(DEMOS)})")
        model, inputs = DEMOS[name]()
        return model, inputs, name
    if not args.model:
        raise UsageError("nothing to export: give demo [NAME] or --model MODULE:FACTORY")
    given = load_inputs(Path(args.inputs)) if args.inputs is not None else None
    model, inputs = load_model(args.model, shapes, given)
    return model, inputs, _model_name(args.model)


def _config_of(args: argparse.Namespace, name: str, out: Path) -> dict[str, Any]:
    """The options of this export as ``export.toml`` holds them: the demo by name, the
    artifacts folder as resolved (not the flags that only steer the command: --force,
    --verbose, --config)."""
    options = {key: value for key, value in vars(args).items() if key in OPTIONS}
    options["demo"] = name if args.demo else None
    # Paths as given, relative to where it ran; an absolute one (this machine's) is left out
    options["out"] = None if out.is_absolute() else str(out)
    if args.intermediates is not None and not args.intermediates.is_absolute():
        options["intermediates"] = str(args.intermediates)
    else:
        options["intermediates"] = None
    return options


def _model_name(spec: str) -> str:
    """The name of the default artifacts folder: the factory, or the file's stem."""
    if ":" in spec:
        return spec.rsplit(":", 1)[-1]
    return Path(spec).stem


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line over the options of ``--config FILE``, if given."""
    from etkit_exporter.cli.config import ConfigError, read_config

    parser = _parser()
    args = parser.parse_args(argv)
    if args.config is None:
        return args
    try:
        options = read_config(args.config)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    demo = options.pop("demo", None)
    for key in ("out", "intermediates"):
        if key in options:
            options[key] = Path(options[key])
    parser.set_defaults(**options)
    args = parser.parse_args(argv)
    if demo is not None and not args.demo and args.model is None:
        args.demo = ["demo", demo]
    return args


def version_line() -> str:
    """``etkit-export``'s version and those of the toolchain it runs on."""
    return _version_line("etkit-export")


if __name__ == "__main__":
    sys.exit(main())
