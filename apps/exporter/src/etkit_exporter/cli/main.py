"""The ``etkit`` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
import warnings
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from etkit_exporter.cli import doctor
from etkit_exporter.core.version import __version__

# The commands import torch, ExecuTorch and the pipeline inside the functions that use them:
# importing torch takes 2.4 s on this project's machines and the pipeline 11 s more, while this
# module imports in 0.2 s, so that `etkit --help` and every usage error answer at once.


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` that reads a value starting with ``-`` and a digit (``--image-range -1,1``,
    ``--image-range -.5,.5``) as the option's value. Plain argparse takes only ``-1`` or
    ``-0.5`` for a value and ``-1,1`` for an unknown option (``expected one argument``); no
    etkit option starts with ``-`` and a digit, so nothing else changes. Subparsers inherit
    it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def version_line(prog: str) -> str:
    """``prog``'s version and those of the toolchain it runs on (read from the installed
    distributions: nothing is imported)."""

    parts = []
    for name in ("etkit-exporter", "etkit-gridsampler", "etkit-quant", "etkit-partition",
                 "etkit-layout", "etkit-pterunner", "executorch", "torch", "torchao"):  # fmt: skip
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return f"{prog} {__version__} ({'; '.join(parts)})"


class _VersionAction(argparse.Action):
    """``--version``: the versions are read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line(parser.prog))
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="etkit",
        description="etkit: export grid-sampling image models to ExecuTorch (VGF, XNNPACK).",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the versions and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "doctor",
        help="check that every part of the toolchain is present and working",
        description="One line per component: whether it is present and working, with the fix "
        "when it is not. Exit status 0 only when all are working.",
    )
    check.add_argument(
        "--only",
        action="append",
        choices=[name for name, _ in doctor.CHECKS],
        metavar="COMPONENT",
        help="run only this check (repeatable): " + ", ".join(n for n, _ in doctor.CHECKS),
    )
    run = commands.add_parser(
        "run",
        help="run an etkit export (.pte) on input files and write its outputs",
        description="Runs MODEL.pte in etkit's runner (VGF delegates on the Vulkan device "
        "through scenario_runner, the grid sampler on etkit's kernels) on --input files (.npy, "
        ".pt, .png, .jpg; float values of quantized inputs are quantized with the parameters in "
        "io_quant_params.json beside the program) and writes output_K.npy and, for image-like "
        "outputs, output_K.png into --out. Exit status 0 run, 2 bad input.",
    )
    run.add_argument("pte", type=Path, metavar="MODEL.pte", nargs="?",
                     help="an etkit export's model.pte (or its folder, as etkit inspect takes "
                     "it), or a model.bpte to check its test cases")  # fmt: skip
    run.add_argument("--scenario", type=Path, metavar="DIR",
                     help="run an export's scenario/ folder with scenario_runner instead "
                     "(its own inputs unless --input is given)")  # fmt: skip
    run.add_argument("--input", action="append", type=Path, default=[], metavar="FILE",
                     help="one per program input, in order")  # fmt: skip
    run.add_argument("--frames", type=Path, metavar="DIR",
                     help="an export with state: run it over the frames in DIR (files, or "
                     "sub-folders with one file per input, in name order), each state output "
                     "fed back; writes frame_NNN/output_K.* into --out")  # fmt: skip
    run.add_argument("--out", type=Path, default=Path("run-outputs"), metavar="DIR")
    run.add_argument("--backend-impl", choices=("cpu", "vulkan"), default="cpu",
                     help="the grid sampler's implementation")  # fmt: skip
    run.add_argument("--image-range", default="-1,1", metavar="LOW,HIGH",
                     help="value range of images read and written (default -1,1)")  # fmt: skip
    run.add_argument("--etdump", type=Path, metavar="PATH",
                     help="profile the run: an ETDump at PATH (and PATH.debug) where "
                     "executorch.runtime runs the program (XNNPACK exports), else a Chrome "
                     "trace at PATH with suffix .json (VGF exports, run by etkit's "
                     "runner)")  # fmt: skip
    run.add_argument("--method", metavar="NAME",
                     help="the method to run (default forward; an export of several sizes "
                     "has forward_540x960 and the like: etkit inspect lists them)")  # fmt: skip
    run.add_argument("--size", metavar="HxW",
                     help="run the method of this size (an export of several sizes), or check "
                     "the inputs are this size (a size range)")  # fmt: skip
    inspect = commands.add_parser(
        "inspect",
        help="per operator and delegate of an export: time, and error against the quantized "
        "and the float model",
        description="Runs ARTIFACTS/model.pte on the example inputs recorded in its "
        "etrecord.bin (XNNPACK exports: in executorch.runtime with an ETDump read by "
        "ExecuTorch's Inspector; VGF exports: in etkit's runner) and prints one row per "
        "operator, delegate call and delegate event: time, and its output against the "
        "quantized graph and the float model (docs/inspect.md). Writes the table into the "
        "export's report.json and report.md. Exit status 0 done, 2 not an export.",
    )
    inspect.add_argument("artifacts", type=Path, metavar="ARTIFACTS")
    inspect.add_argument("--no-report", action="store_true",
                         help="print only; leave report.json and report.md as they "
                         "are")  # fmt: skip
    inspect.add_argument("--json", action="store_true", help="print the table as JSON")
    commands.add_parser(
        "vulkan-env",
        help="print the shell lines that load Arm's ML emulation layers (for scenario_runner)",
        description="Prints `export NAME=VALUE` lines that make a shell load Arm's ML emulation "
        "layers for Vulkan in the right order (Graph above Tensor), as etkit does for "
        'scenario_runner: eval "$(etkit vulkan-env)". A driver that implements VK_ARM_tensors '
        "and VK_ARM_data_graph itself needs none of this.",
    )
    return parser


def _run(args: argparse.Namespace) -> int:
    # Only light modules until the arguments are checked: torch and ExecuTorch take seconds
    # to import, and a mistake is answered at once.
    from etkit_exporter.cli.run import RunUsageError, check_arguments, resolve_program
    from etkit_exporter.core.calibration_data import CalibrationDataError, parse_image_range

    if (args.pte is None) == (args.scenario is None):
        print("etkit run: give MODEL.pte (or model.bpte) or --scenario DIR, one of them",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        args.image_range = parse_image_range(args.image_range)
        if args.scenario is not None:
            return _run_scenario(args)
        pte = args.pte = resolve_program(args.pte)
        if pte.suffix != ".bpte":
            check_arguments(args.input, args.out, args.etdump)
    except (RunUsageError, CalibrationDataError) as error:
        print(f"etkit run: {error}".splitlines()[0], file=sys.stderr)
        return 2
    if pte.suffix == ".bpte":
        return _run_bundle(args)
    if args.frames is not None:
        return _run_frames(args)
    from etkit_exporter.cli.run import run_export

    try:
        summary = run_export(
            pte,
            args.input,
            args.out,
            backend_impl=args.backend_impl,
            image_range=args.image_range,
            etdump=args.etdump,
            method=args.method,
            size=args.size,
        )
    except (RunUsageError, CalibrationDataError) as error:
        print(f"etkit run: {error}".splitlines()[0], file=sys.stderr)
        return 2
    _print_warnings(summary["warnings"])
    for backend, implementation, seconds in summary["delegate_calls"]:
        print(f"  {backend:<20} {implementation:<34} {1000 * seconds:9.2f} ms")
    if "etdump" in summary:
        print(
            f"ETDump ({summary['etdump_events']} events): {summary['etdump']}, intermediate "
            f"outputs: {summary['debug_buffer']} (open with executorch.devtools.Inspector and "
            "the export's etrecord.bin, or: etkit inspect)"
        )
    if "trace" in summary:
        print(
            f"executorch.runtime cannot run this program: trace of etkit's runner "
            f"({summary['trace_events']} events): {summary['trace']} (open in "
            "https://ui.perfetto.dev or chrome://tracing)"
        )
    ran = "" if summary.get("method", "forward") == "forward" else f" {summary['method']}"
    print(
        f"ran{ran} in {summary['runner']} in {summary['seconds']:.3f} s; wrote "
        f"{', '.join(summary['outputs'])} to {args.out}"
    )
    return 0


def _print_warnings(warnings: Sequence[str]) -> None:
    for warning in warnings:
        print(f"etkit run: warning: {warning}", file=sys.stderr)


def _inspect(args: argparse.Namespace) -> int:
    """``etkit inspect ARTIFACTS``."""
    from etkit_exporter.check.inspection import (
        InspectError,
        inspect_export,
        print_inspection,
        write_into_report,
    )
    from etkit_pterunner import PteError

    try:
        inspection = inspect_export(args.artifacts)
        if not args.no_report:
            write_into_report(args.artifacts, inspection)
    except (InspectError, PteError) as error:
        print(f"etkit inspect: {error}".splitlines()[0], file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(inspection.as_dict(), indent=2, default=str))
        return 0
    print_inspection(inspection)
    print(
        f"inspected in {inspection.seconds:.1f} s"
        + ("" if args.no_report else f"; added to {args.artifacts / 'report.md'} and report.json")
    )
    return 0


def _run_frames(args: argparse.Namespace) -> int:
    from etkit_exporter.cli.run import RunUsageError, run_frames
    from etkit_exporter.core.calibration_data import CalibrationDataError

    if args.input:
        print("etkit run: --frames and --input: give one of them", file=sys.stderr)
        return 2
    try:
        summary = run_frames(
            args.pte, args.frames, args.out, backend_impl=args.backend_impl,
            image_range=args.image_range,
        )  # fmt: skip
    except (RunUsageError, CalibrationDataError) as error:
        print(f"etkit run: {error}".splitlines()[0], file=sys.stderr)
        return 2
    _print_warnings(summary["warnings"])
    print(
        f"ran {summary['frames']} frames with the state fed back in {summary['runner']} in "
        f"{summary['seconds']:.3f} s ({summary['frames_per_second']:.1f} frames/s); wrote "
        f"frame_000 .. frame_{summary['frames'] - 1:03d} to {args.out}"
    )
    return 0


def _run_scenario(args: argparse.Namespace) -> int:
    """``etkit run --scenario DIR``: the export's Vulkan scenario, whole, in scenario_runner."""
    from etkit_exporter.cli.run import RunUsageError, run_scenario_folder
    from etkit_exporter.core.calibration_data import CalibrationDataError

    try:
        summary = run_scenario_folder(args.scenario, args.input, args.out, args.image_range)
    except (RunUsageError, CalibrationDataError) as error:
        print(f"etkit run: {error}".splitlines()[0], file=sys.stderr)
        return 2
    _print_warnings(summary["warnings"])
    print(
        f"ran in {summary['seconds']:.2f} s ({summary['runner']}); wrote "
        f"{', '.join(summary['outputs'])} to {args.out}"
    )
    return 0


def _run_bundle(args: argparse.Namespace) -> int:
    """``etkit run model.bpte``: every bundled test case against its expected outputs."""
    from etkit_exporter.check.bundle import BundleError, run_bundle
    from etkit_pterunner import ProgramInputError, PteError

    if args.input:
        print("etkit run: a .bpte holds its own inputs: drop --input", file=sys.stderr)
        return 2
    try:
        runner, checks = run_bundle(args.pte, grid_sampler_impl=args.backend_impl)
    except (BundleError, PteError, ProgramInputError) as error:
        print(f"etkit run: {error}".splitlines()[0], file=sys.stderr)
        return 2
    for check in checks:
        verdict = "ok" if check.passes else "MISMATCH"
        print(
            f"  case {check.case}{'' if check.method == 'forward' else f' ({check.method})'} "
            f"output {check.output}: {check.differing} of {check.total} "
            f"values differ, max {check.max_steps:g} steps (tolerance "
            f"{check.tolerance_steps:g}): {verdict}"
        )
    failed = [c for c in checks if not c.passes]
    print(
        f"{args.pte}: {'all outputs match' if not failed else f'{len(failed)} outputs differ'} "
        f"(ran in {runner})"
    )
    return 0 if not failed else 1


def _vulkan_env() -> int:
    """``etkit vulkan-env``: the variables ``ml_emulation_env`` sets, as shell lines."""
    from etkit_exporter.vgf.vulkan_env import EmulationLayersMissingError, ml_emulation_env

    try:
        env = ml_emulation_env()
    except EmulationLayersMissingError as error:
        print(f"etkit vulkan-env: {error}", file=sys.stderr)
        return 1
    for name in sorted(env):
        if env[name] != os.environ.get(name):
            print(f"export {name}={shlex.quote(env[name])}")
    return 0


def quiet_third_party_noise() -> None:
    """Silences what torch and torchao print on import (their optional CUDA kernels failing to
    load on a CPU machine, deprecation notices), which would bury the command's own output."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in ("torch._dynamo", "torch.export", "torch._export"):  # failures are reported once
        logging.getLogger(name).setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``etkit``; returns the exit status."""
    quiet_third_party_noise()
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        results = doctor.run_checks(args.only)
        doctor.print_results(results, sys.stdout)
        return 0 if all(r.ok for r in results) else 1
    if args.command == "run":
        return _run(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "vulkan-env":
        return _vulkan_env()
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
