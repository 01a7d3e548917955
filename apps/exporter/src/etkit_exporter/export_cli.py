"""``etkit-export``: export a built-in demo or your own model from the command line."""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import math
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

from etkit_exporter.diagnostics import root_cause

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


class UsageError(Exception):
    """A mistake in the command line."""


class ModelError(Exception):
    """The user's model could not be built (its factory raised)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    from etkit_exporter.demos import DEMOS
    from etkit_exporter.pipeline import TARGETS

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
    parser.add_argument("--model", metavar="MODULE:FACTORY", help="your model's factory")
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
    parser.add_argument("--target", choices=TARGETS, default="vgf")
    parser.add_argument("--out", type=Path, help="artifacts folder (default artifacts/NAME-TARGET)")
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier etkit export at --out (never other files: see the README)",
    )  # fmt: skip
    parser.add_argument(
        "--verify", action="store_true",
        help="run the written program and compare it with the float and quantized models "
        "(xnnpack: executorch.runtime; vgf: etkit's runner, VGF on Vulkan)",
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


def load_model(
    spec: str, shapes: list[tuple[int, ...]]
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Imports ``module:factory`` and calls it; the factory returns the module, or the module
    and its example inputs. Random example inputs in [-1, 1] are made from ``shapes``."""
    if ":" not in spec:
        raise UsageError(f"--model '{spec}' must be package.module:factory")
    module_name, factory_name = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import --model module '{module_name}': {error}") from error
    except Exception as error:
        raise UsageError(
            f"importing --model module '{module_name}' raised {root_cause(error)}; fix the module"
        ) from error
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise UsageError(f"--model module '{module_name}' has no '{factory_name}'")
    if not callable(factory):
        raise UsageError(
            f"--model '{spec}' is a {type(factory).__name__}, not a callable factory that returns "
            "the model (or the model and its example inputs)"
        )
    for shape in shapes:
        _check_fits_in_memory(shape)
    try:
        made = factory()
    except Exception as error:
        raise ModelError(f"--model factory '{spec}' raised {root_cause(error)}") from error
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, inputs = made
        inputs = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
        if shapes:
            inputs = tuple(torch.rand(shape) * 2 - 1 for shape in shapes)
        return model, inputs
    if not isinstance(made, torch.nn.Module):
        raise UsageError(f"--model factory returned {type(made).__name__}, not a torch.nn.Module")
    if not shapes:
        raise UsageError("--model factory returned only the module: give --input-shape per input")
    torch.manual_seed(0)
    return made, tuple(torch.rand(shape) * 2 - 1 for shape in shapes)


def _check_fits_in_memory(shape: tuple[int, ...]) -> None:
    """Refuses an ``--input-shape`` whose float32 tensor alone exceeds this machine's memory."""
    needed = 4 * math.prod(shape)
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return
    if needed > available:
        text = "x".join(map(str, shape))
        raise UsageError(
            f"--input-shape {text} needs {needed / 2**30:.1f} GiB for one float32 tensor; this "
            f"machine has {available / 2**30:.1f} GiB: give a smaller shape"
        )


class _TerminalOutput:
    """Where progress goes, and whether it is a terminal (one updating line) or not."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())


class _Progress(_TerminalOutput):
    """Stage progress: one updating line on a terminal, plain lines otherwise."""

    def __call__(self, stage: str, seconds: float) -> None:
        if self.tty:
            self.stream.write(f"\r\033[K  {stage:<26} done in {seconds:6.2f} s")
            self.stream.write("\n" if stage in ("serialize", "verify") else "")
        else:
            self.stream.write(f"stage {stage}: {seconds:.2f} s\n")
        self.stream.flush()


def _summary(result: Any, seconds: float) -> str:
    from etkit_quant import describe_qspec

    report = result.report
    lines = ["", "partitions:"]
    for p in report["partitions"]:
        lines.append(f"  {p['name']:<20} {p['backend']:<20} {p['nodes']:>4} nodes")
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
    if result.saturation:
        lines.append("saturation (calibration values outside each fixed range):")
        for record in result.saturation:
            verdict = "ok" if record.passes() else f"CLIPS: use {describe_qspec(record.instead())}"
            lines.append(
                f"  {record.name}: {record.qspec}, {100 * record.fraction:.3g} % outside: {verdict}"
            )
    if result.verification:
        runner = result.verification.get("runner", "executorch.runtime")
        lines.append(f"verification ({runner}):")
        for c in result.verification["comparisons"]:
            steps = f", {c['max_steps']} steps max" if "max_steps" in c else ""
            lines.append(
                f"  output {c['output']} vs {c['reference']:<22} max abs error "
                f"{c['max_abs_error']:.4g}, PSNR "
                + ("inf (identical)" if c["psnr_db"] is None else f"{c['psnr_db']:.2f} dB")
                + steps
            )
    lines.append("artifacts:")
    for name in ("model.pte", "io_quant_params.json", "report.json", "report.md", "intermediates"):
        path = result.artifacts_root / name
        if path.exists():
            lines.append(f"  {path}")
    lines.append(f"exported in {seconds:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``etkit-export``; returns the exit status."""
    from etkit_exporter.artifacts import check_destination
    from etkit_exporter.cli import quiet_third_party_noise

    quiet_third_party_noise()  # before torch and torchao are imported
    try:
        args = _parser().parse_args(argv)
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
        out = args.out if args.out is not None else Path("artifacts") / f"{name}-{args.target}"
        destination = check_destination(out, args.force)
    except (UsageError, ValueError, FileExistsError) as error:
        print(f"etkit-export: usage error: {error}", file=sys.stderr)
        return 2
    except ModelError as error:
        print(f"etkit-export: export failed: {error}", file=sys.stderr)
        return 1
    from etkit_exporter.pipeline import ExportError, export_model

    start = time.perf_counter()
    print(f"exporting {name} for {args.target} into {out}", flush=True)
    for note in destination.notes:
        print(f"note: {note}", flush=True)
    try:
        result = export_model(
            model,
            inputs,
            artifacts_root=out,
            quantized_input_qspecs=ins,
            quantized_output_qspecs=outs,
            calibration=calibration,
            on_calibration_sample=_SampleProgress(sys.stdout),
            enable_pt2e_quantization=not args.no_quant,
            **samplers,
            target=args.target,
            verify=args.verify,
            force=args.force,
            on_stage=_Progress(sys.stdout),
        )
    except (TypeError, ValueError, FileExistsError) as error:
        print(f"etkit-export: usage error: {error}", file=sys.stderr)
        return 2
    except ExportError as error:
        if args.verbose:
            traceback.print_exception(error, file=sys.stderr)
        print(f"etkit-export: export failed: {error}".splitlines()[0], file=sys.stderr)
        if not args.verbose:
            print("  (--verbose shows the whole chain of errors)", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit) as stop:
        if isinstance(stop, SystemExit) and stop.code != 128 + signal.SIGTERM:
            raise
        what = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated"
        print(f"etkit-export: {what}; nothing was written and {out} is as it was", file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else 128 + signal.SIGTERM
    print(_summary(result, time.perf_counter() - start))
    return 0


def _calibration_from(
    args: argparse.Namespace, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> list[tuple[torch.Tensor, ...]] | None:
    from etkit_exporter.calibration_data import (
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
        return read_calibration(
            args.calibration, inputs, input_names=names, image_range=image_range
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
    from etkit_exporter.demos import DEMOS

    shapes = [parse_shape(s) for s in args.input_shape]
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
        if shapes:
            raise UsageError(
                "--input-shape applies to --model only: a demo has its own example inputs"
            )
        name = args.demo[1] if len(args.demo) == 2 else "flow-warp"
        if name not in DEMOS:
            raise UsageError(f"unknown demo '{name}' (one of {', '.join(DEMOS)})")
        model, inputs = DEMOS[name]()
        return model, inputs, name
    if not args.model:
        raise UsageError("nothing to export: give demo [NAME] or --model MODULE:FACTORY")
    model, inputs = load_model(args.model, shapes)
    return model, inputs, args.model.split(":")[-1]


if __name__ == "__main__":
    sys.exit(main())
