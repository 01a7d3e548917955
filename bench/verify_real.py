"""The real networks at the sizes users ship, exported and verified (issue 53, item 3): the
64-channel RIFE-shaped network (tests/real_models.py) and the IFNet re-creation of RIFE v4.25
(bench/fuzz_findings/P-rife-ifnet-v425-64x128.py) at 1088 x 1920, and the Model Gym's NSS v1
frame (tests/gym_models.py) at the gym's 544 x 960 low resolution (its history at 1088 x 1920),
each for XNNPACK and VGF with ``verify=True``, each in a fresh process: wall time and peak
resident memory of the export's stages and of the verification's (timings.json), the verdict.

Run on demand (tens of minutes on 2 cores; VGF runs scenario_runner on lavapipe at 1080p):

    OMP_NUM_THREADS=2 .venv/bin/python bench/verify_real.py [--models rife64 ifnet nss]
        [--targets xnnpack vgf] [--markdown bench/results/verify_real.md]

``--one MODEL TARGET`` runs one in this process and prints its row as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from verify_cost import peak_mb  # noqa: E402

Made = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]
FRAME = (1088, 1920)
NSS_LOW = (544, 960)


def _frames(height: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    first = torch.rand(1, 3, height, width, generator=generator)
    return first, torch.roll(first, shifts=(2, 3), dims=(2, 3))


def rife64() -> Made:
    import real_models

    torch.manual_seed(10)
    return real_models.RIFE(c=64).eval(), _frames(*FRAME, 2)


def ifnet() -> Made:
    path = ROOT / "bench" / "fuzz_findings" / "P-rife-ifnet-v425-64x128.py"
    spec = importlib.util.spec_from_file_location("ifnet_v425", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ifnet_v425"] = module  # torch.export reads the module's source
    spec.loader.exec_module(module)
    first, second = _frames(*FRAME, 1)
    return module.ModelUnderTest, (torch.cat((first, second), 1) * 2 - 1,)


def nss() -> Made:
    import gym_models as gym

    h, w = NSS_LOW
    inputs = (
        gym._image(21, 3, NSS_LOW, peak=4.0),
        gym._image(22, 3, (2 * h, 2 * w), peak=4.0),
        gym._motion(23, NSS_LOW, 2.5),
        gym._rand(24, 1, 4, h, w),
    )
    return gym._seeded(25, gym.NSSFrame), inputs


MODELS = {"rife64": rife64, "ifnet": ifnet, "nss": nss}


def one(name: str, target: str) -> dict[str, Any]:
    from etkit_exporter import export_model

    model, inputs = MODELS[name]()
    row: dict[str, Any] = {"model": name, "target": target,
                           "size": "x".join(str(s) for s in inputs[0].shape[-2:])}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="etkit-verify-real-") as scratch:
        start = time.perf_counter()
        try:
            result = export_model(model, inputs, artifacts_root=Path(scratch) / "out",
                                  target=target, verify=True)  # fmt: skip
        except Exception as error:  # a failed verdict or export is a result too
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            row["seconds"] = round(time.perf_counter() - start, 1)
            row["peak_mb"] = peak_mb()
            return row
        row["seconds"] = round(time.perf_counter() - start, 1)
        timings = json.loads((result.artifacts_root / "timings.json").read_text())
    seconds, peaks = timings["timings_s"], timings["peak_memory_mb"]
    row["export_s"] = round(sum(v for k, v in seconds.items() if k != "verify"), 1)
    row["export_peak_mb"] = max(v or 0 for k, v in peaks.items() if k != "verify")
    row["verify_s"] = seconds.get("verify")
    row["verify_peak_mb"] = peaks.get("verify")
    row["verification_stages"] = timings.get("verification_stages")
    verdict = (result.verification or {}).get("verdict") or {}
    row["verdict"] = verdict.get("result")
    row["worst_psnr_db"] = min(
        (o["psnr_db"] for o in verdict.get("outputs", []) if o.get("psnr_db") is not None),
        default=None,
    )
    row["peak_mb"] = peak_mb()
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| network | target | input size | export | verification | verdict (worst output vs "
        "the quantized model) | slowest verification stage |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['target']} | {r['size']} | failed after "
                         f"{r['seconds']} s, peak {r['peak_mb']} MB: {r['error']} |||")  # fmt: skip
            continue
        stages = r.get("verification_stages") or {}
        slowest = max(stages.items(), key=lambda kv: kv[1]["seconds"], default=None)
        slow = f"{slowest[0]} {slowest[1]['seconds']:.0f} s" if slowest else ""
        db = r["worst_psnr_db"]
        lines.append(
            f"| {r['model']} | {r['target']} | {r['size']} | {r['export_s']} s, "
            f"{r['export_peak_mb']:,.0f} MB | {r['verify_s']} s, {r['verify_peak_mb']:,.0f} MB | "
            f"{r['verdict']} ({'identical' if db is None else f'{db:.1f} dB'}) | {slow} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TARGET"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--targets", nargs="+", default=["xnnpack", "vgf"])
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    rows = []
    for name in args.models:
        for target in args.targets:
            command = [sys.executable, __file__, "--one", name, target]
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
            if done.returncode != 0 or not done.stdout.strip():
                tail = " | ".join((done.stderr or "").strip().splitlines()[-2:])
                row = {"model": name, "target": target, "size": "?", "seconds": "?",
                       "peak_mb": "?", "error": f"exit {done.returncode}: {tail}"}  # fmt: skip
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows.append(row)
    text = table(rows)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
