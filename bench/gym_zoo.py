"""The Model Gym zoo, every network on both targets: etkit's ``export_model(verify=True)`` on each
of ``tests/gym_models.py``'s networks (Arm's ``ng-model-gym`` 0.4.0 classes), for XNNPACK and VGF;
prints a table: network, target, verified, PSNR against the float model (worst output), export
seconds. ``tests/test_gym_zoo.py`` runs four of them per target in CI; this runs all.

Run on demand (not in CI; each export takes 10-120 s here):
    OMP_NUM_THREADS=1 .venv/bin/python bench/gym_zoo.py [--target xnnpack|vgf] [--size H W]
        [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _zoo() -> Any:
    spec = importlib.util.spec_from_file_location("gym_models", ROOT / "tests/gym_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gym_models"] = module
    spec.loader.exec_module(module)
    return module


def run(name: str, target: str, zoo: Any) -> tuple[str, str, str]:
    """(verified, PSNR vs float, seconds) of one export, or the error in place of the PSNR."""
    from etkit_exporter import export_model

    model, inputs = zoo.GYM_MODELS[name].make()
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = export_model(
                model, inputs, artifacts_root=Path(tmp) / name, target=target, verify=True
            )
    except Exception as failure:  # one line: the table goes on
        reason = str(failure).splitlines()[0] if str(failure) else ""
        return "error", f"{type(failure).__name__}: {reason}"[:100], f"{_since(start):.0f}"
    verification = result.verification or {}
    psnr = [
        math.inf if c["psnr_db"] is None else float(c["psnr_db"])
        for c in verification.get("comparisons", [])
        if c["reference"] == "float model"
    ]
    verified = "yes" if verification.get("verdict", {}).get("result") == "pass" else "no"
    worst = f"{min(psnr):.1f} dB" if psnr else "-"
    return verified, worst, f"{_since(start):.0f}"


def _since(start: float) -> float:
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("xnnpack", "vgf"), action="append")
    parser.add_argument("--size", type=int, nargs=2, metavar=("H", "W"))
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    zoo = _zoo()
    if not zoo.gym_installed():
        sys.exit("ng-model-gym is not installed (scripts/setup.sh installs it)")
    if args.size:
        zoo.SIZE = tuple(args.size)
    names = args.names or list(zoo.GYM_MODELS)
    unknown = sorted(set(names) - set(zoo.GYM_MODELS))
    if unknown:
        sys.exit(f"unknown networks: {', '.join(unknown)} (known: {', '.join(zoo.GYM_MODELS)})")
    print("| network | target | verified | PSNR vs float | export s |")
    print("|---|---|---|---|---|")
    for name in names:
        for target in args.target or zoo.TARGETS:
            verified, psnr, seconds = run(name, target, zoo)
            print(f"| {name} | {target} | {verified} | {psnr} | {seconds} |", flush=True)


if __name__ == "__main__":
    main()
