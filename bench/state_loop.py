"""Recurrent models verified over their loop (issue 54): the Model Gym's NSS v1 frame
(tests/gym_models.py: history reprojection by the motion vectors, the Karis tonemap, the gym's
AutoEncoderV1, the temporal blend and its parameters fed back) with its two states named
(``history=output_1``, ``feedback=output_2``), and the temporal-accumulator demo, each exported
with ``verify=True`` over a panning scene of N frames on each target, each run in a fresh
process: the loop's verdict, the program's fidelity against the float model's own loop at frame
0, 1, 8 and the last, the worst state saturation, the export's and the verification's time,
and frames per second of the program, the quantized model, the float model and the envelope.

    OMP_NUM_THREADS=2 .venv/bin/python bench/state_loop.py [--models nss accumulator]
        [--targets xnnpack vgf] [--frames 32] [--size 16x16] [--markdown FILE]

``--one MODEL TARGET`` runs one in this process and prints its row as JSON.
"""

from __future__ import annotations

import argparse
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

Frames = list[tuple[torch.Tensor, ...]]


def nss(frames: int, size: tuple[int, int]) -> tuple[torch.nn.Module, Frames, dict[str, str]]:
    import gym_models as gym

    h, w = size
    model = gym._seeded(25, gym.NSSFrame)
    colour = gym._image(21, 3, size, peak=4.0)
    motion = torch.zeros(1, 2, h, w)
    motion[:, 1] = -1.0  # (y, x) in low-resolution pixels: the scene pans one pixel a frame
    sequence = [
        (torch.roll(colour, shifts=t, dims=3), torch.zeros(1, 3, 2 * h, 2 * w), motion,
         torch.zeros(1, 4, h, w))
        for t in range(frames)
    ]  # fmt: skip
    return model, sequence, {"history": "output_1", "feedback": "output_2"}


def accumulator(
    frames: int, size: tuple[int, int]
) -> tuple[torch.nn.Module, Frames, dict[str, str] | None]:
    from etkit_exporter.export.demos import TemporalAccumulator, moving_scene

    torch.manual_seed(0)
    return TemporalAccumulator(*size).eval(), list(moving_scene(frames, *size)), None


MODELS = {"nss": nss, "accumulator": accumulator}


def one(name: str, target: str, frames: int, size: tuple[int, int]) -> dict[str, Any]:
    from etkit_exporter import export_model

    model, sequence, state = MODELS[name](frames, size)
    row: dict[str, Any] = {"model": name, "target": target, "size": f"{size[0]}x{size[1]}",
                           "frames": frames}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="etkit-state-loop-") as scratch:
        start = time.perf_counter()
        try:
            result = export_model(
                model,
                sequence[0],
                artifacts_root=Path(scratch) / "out",
                target=target,
                calibration=sequence[:8],
                state=state,
                sequence=sequence,
                loop_frames=frames,
                verify=True,
            )
        except Exception as error:  # a failed verdict is a result too
            row["error"] = f"{type(error).__name__}: {' / '.join(str(error).splitlines()[:3])}"
            row["seconds"] = round(time.perf_counter() - start, 1)
            return row
        row["seconds"] = round(time.perf_counter() - start, 1)
        timings = json.loads((result.artifacts_root / "timings.json").read_text())
    seconds = timings["timings_s"]
    row["export_s"] = round(sum(v for k, v in seconds.items() if not k.startswith("verify")), 1)
    row["verify_s"] = seconds.get("verify")
    row["verify_loop_s"] = seconds.get("verify_loop")
    row["fps"] = timings.get("verification_loop", {}).get("frames_per_second")
    loop = result.verification["loop"]
    row["loop"] = loop["result"]
    row["first_failure"] = loop["first_failure"]
    rows = loop["per_frame"]
    row["vs_float_db"] = {
        t: rows[t]["outputs"][0]["psnr_vs_float_db"] for t in (0, 1, 8, frames - 1) if t < frames
    }
    row["vs_quantized_db_min"] = min(
        (o["psnr_vs_quantized_db"] for r in rows for o in r["outputs"]
         if o["psnr_vs_quantized_db"] is not None),
        default=None,
    )  # fmt: skip
    row["state_saturation_max"] = max(
        (v for r in loop["state_saturation"] for k, v in r.items()
         if k != "frame" and isinstance(v, float)),
        default=None,
    )  # fmt: skip
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| network | target | size | frames | loop | output 0 vs the float loop, frame 0 / 1 / "
        "8 / last (dB) | worst frame vs the quantized loop | state saturation (max share) | "
        "export | verification (frame 0 / loop) | frames per second: program, quantized, "
        "float, envelope |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['target']} | {r['size']} | {r['frames']} | "
                         f"failed after {r['seconds']} s: {r['error']} |||||||")  # fmt: skip
            continue
        db = " / ".join("identical" if v is None else f"{v:.1f}" for v in r["vs_float_db"].values())
        q = r["vs_quantized_db_min"]
        fps = r["fps"] or {}
        lines.append(
            f"| {r['model']} | {r['target']} | {r['size']} | {r['frames']} | {r['loop']} | {db} | "
            f"{'identical' if q is None else f'{q:.1f} dB'} | {r['state_saturation_max']:.3g} | "
            f"{r['export_s']} s | {r['verify_s']} s / {r['verify_loop_s']} s | "
            + ", ".join(
                f"{fps.get(k, 0):g}"
                for k in ("program", "quantized model", "float model", "envelope")
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TARGET"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--targets", nargs="+", default=["xnnpack", "vgf"])
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--size", default="16x16", help="low resolution HxW (NSS: multiples of 8)")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.lower().split("x"))
    assert len(size) == 2
    if args.one:
        print(json.dumps(one(*args.one, args.frames, (size[0], size[1]))))
        return 0
    rows = []
    for name in args.models:
        for target in args.targets:
            command = [sys.executable, __file__, "--one", name, target, "--frames",
                       str(args.frames), "--size", args.size]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
            if done.returncode != 0 or not done.stdout.strip():
                tail = " | ".join((done.stderr or "").strip().splitlines()[-2:])
                row = {"model": name, "target": target, "size": args.size,
                       "frames": args.frames, "seconds": "?",
                       "error": f"exit {done.returncode}: {tail}"}  # fmt: skip
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    text = table(rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
