"""The ``etkit`` command."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

from etkit_exporter import doctor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="etkit",
        description="etkit: export grid-sampling image models to ExecuTorch (VGF, XNNPACK).",
    )
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
    return parser


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
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
