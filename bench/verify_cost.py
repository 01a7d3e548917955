"""What a verdict costs against input size (issue 53): for each model, target and size, the export
alone and the export with ``verify=True``, each in a fresh process, their wall time and peak
resident memory (VmHWM), the verify stage's own time and peak (report.json's ``stages``), and
for scale one float eager forward and one quantized (PT2E) forward in PyTorch at that size,
each a process of its own. Every row's ratio to the eager forward, the verification's to the
export, and the bound the verdict is held to: the export's peak plus one quantized forward's.

Models: ``light-rife`` (two 3-channel frames, 16- and 32-channel convolutions at half and
quarter size, an upsampled flow, two warps, a mask blend: the light interpolator issue 53
measured) and ``flow-warp`` (the built-in demo). The sizes are multiples of 8.

Run on demand (minutes; 1088 x 1920 on VGF runs scenario_runner on lavapipe):

    OMP_NUM_THREADS=2 .venv/bin/python bench/verify_cost.py [--models light-rife flow-warp]
        [--targets xnnpack vgf] [--sizes 136x240 272x480 544x960 1088x1920]
        [--json bench-verify-cost.json] [--markdown bench/results/verify_cost.md]

``--one KIND MODEL TARGET HxW`` runs one measurement in this process and prints it as JSON (what
the parent runs in each child).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SIZES = ["136x240", "272x480", "544x960", "1088x1920"]
KINDS = ("eager", "qforward", "export", "verify")


def peak_mb() -> float:
    """This process's peak resident memory so far (VmHWM), MB."""
    status = Path("/proc/self/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return round(int(match.group(1)) / 1024, 1) if match else float("nan")


def resident_mb() -> float:
    """This process's resident memory now (VmRSS), MB."""
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return round(int(match.group(1)) / 1024, 1) if match else float("nan")


def _conv(cin: int, cout: int, stride: int = 1) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, stride, 1), torch.nn.PReLU(cout))


def _warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """``image`` sampled at each pixel plus ``flow`` (pixels), RIFE's backward warp."""
    _, _, height, width = image.shape
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    base = torch.stack((grid_x, grid_y), -1).unsqueeze(0)
    scale = torch.tensor([2.0 / (width - 1), 2.0 / (height - 1)])
    grid = base + flow.permute(0, 2, 3, 1) * scale
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)


class LightInterpolator(torch.nn.Module):
    """A light RIFE-shaped interpolator: the two frames, 16 channels at half size, 32 at
    quarter size, a flow to each frame and a mask at quarter size upsampled to full, two
    backward warps, a sigmoid mask blend."""

    def __init__(self) -> None:
        super().__init__()
        self.down = _conv(6, 16, 2)
        self.down2 = _conv(16, 32, 2)
        self.mid = _conv(32, 32)
        self.head = torch.nn.Conv2d(32, 5, 3, 1, 1)

    def forward(self, img0: torch.Tensor, img1: torch.Tensor) -> torch.Tensor:
        x = self.down(torch.cat((img0, img1), 1))
        x = self.down2(x)
        x = self.mid(x) + x
        out = F.interpolate(self.head(x), scale_factor=4.0, mode="bilinear", align_corners=False)
        flow = torch.tanh(out[:, :4]) * 8.0
        mask = torch.sigmoid(out[:, 4:5])
        warped0, warped1 = _warp(img0, flow[:, :2]), _warp(img1, flow[:, 2:4])
        return warped0 * mask + warped1 * (1 - mask)


def _smooth_frames(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two frames in [-1, 1] of smooth content (coarse noise upsampled), the second moved by a
    few pixels, as nearby frames of a video are."""
    generator = torch.Generator().manual_seed(11)
    coarse = torch.rand(1, 3, height // 8 + 2, width // 8 + 2, generator=generator) * 2 - 1
    frame = F.interpolate(coarse, size=(height + 16, width + 16), mode="bicubic").clamp(-1, 1)
    return frame[..., 8 : 8 + height, 8 : 8 + width], frame[..., 5 : 5 + height, 6 : 6 + width]


def make(name: str, height: int, width: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model ``name`` and its two frames at ``height`` x ``width``."""
    torch.manual_seed(10)
    if name == "light-rife":
        model: torch.nn.Module = LightInterpolator().eval()
    elif name == "flow-warp":
        from etkit_exporter.export.demos import DEMOS

        model, _ = DEMOS["flow-warp"]()
    else:
        raise SystemExit(f"verify_cost: unknown model {name!r} (light-rife, flow-warp)")
    return model.eval(), _smooth_frames(height, width)


def one(kind: str, name: str, target: str, height: int, width: int) -> dict[str, Any]:
    """One measurement in this process (``KINDS``)."""
    model, inputs = make(name, height, width)
    row: dict[str, Any] = {"kind": kind, "model": name, "target": target,
                           "size": f"{height}x{width}"}  # fmt: skip
    if kind == "eager":
        with torch.no_grad():
            model(*inputs)  # warm
            start = time.perf_counter()
            model(*inputs)
        row["seconds"] = round(time.perf_counter() - start, 3)
    elif kind == "qforward":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        from etkit_quant import quantize

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        quantized = quantize(model, inputs, quantizer)
        with torch.no_grad():
            quantized(*inputs)
            Path("/proc/self/clear_refs").write_text("5")  # the peak from here: this forward's
            before = resident_mb()
            start = time.perf_counter()
            quantized(*inputs)
        row["seconds"] = round(time.perf_counter() - start, 3)
        row["before_mb"] = before
    else:
        from etkit_exporter import export_model

        with tempfile.TemporaryDirectory(prefix="etkit-verify-cost-") as scratch:
            start = time.perf_counter()
            result = export_model(model, inputs, artifacts_root=Path(scratch) / "out",
                                  target=target, verify=kind == "verify")  # fmt: skip
            row["seconds"] = round(time.perf_counter() - start, 2)
            stages = result.report.get("timings_s") or {}
            row["stages"] = stages
            row["peaks"] = result.report.get("peak_memory_mb") or {}
            if result.verification is not None:
                row["verification_stages"] = result.verification.get("stages")
            if result.verification is not None:
                verdict = result.verification.get("verdict") or {}
                row["verdict"] = verdict.get("result")
    row["peak_mb"] = peak_mb()
    return row


def _child(kind: str, name: str, target: str, size: str) -> dict[str, Any]:
    height, width = (int(v) for v in size.split("x"))
    command = [sys.executable, __file__, "--one", kind, name, target, f"{height}x{width}"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"kind": kind, "model": name, "target": target, "size": size,
                "error": " | ".join(tail)}  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _peak(row: dict[str, Any]) -> float:
    """A run's peak resident memory, MB: the largest of its stages' (each stage resets the
    kernel's peak, so the process's VmHWM at the end is the last stage's), else VmHWM."""
    peaks = [v for v in (row.get("peaks") or {}).values() if v is not None]
    return max([*peaks, float(row.get("peak_mb", 0.0))])


def table(rows: list[dict[str, Any]]) -> str:
    """The README's table: one line per model, target and size."""
    lines = [
        "| model | target | size | eager forward | quantized forward | export | with --verify "
        "| verify stage | verify / export time | verify peak / (export + qforward) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keyed = {(r["model"], r["target"], r["size"], r["kind"]): r for r in rows}
    keys = {(r["model"], r["target"], r["size"]) for r in rows}
    for model, target, size in sorted(keys, key=lambda k: (k[0], k[1], int(k[2].split("x")[0]))):
        cell = {k: keyed.get((model, target, size, k), {}) for k in KINDS}
        if any("error" in c for c in cell.values()):
            errors = "; ".join(c["error"] for c in cell.values() if "error" in c)
            lines.append(f"| {model} | {target} | {size} | failed: {errors} |||||||")
            continue

        def fmt(c: dict[str, Any]) -> str:
            return f"{c.get('seconds', '?')} s, {_peak(c)} MB" if c else "-"

        export, verify, q = cell["export"], cell["verify"], cell["qforward"]
        stage = {
            "seconds": (verify.get("stages") or {}).get("verify", "?"),
            "peak_mb": (verify.get("peaks") or {}).get("verify", "?"),
        }
        forward = (q.get("peak_mb", 0) - q.get("before_mb", 0)) if q else 0.0
        ratio_time = verify["seconds"] / export["seconds"] if export and verify else float("nan")
        bound = (_peak(export) + forward) if export else float("nan")
        ratio_peak = _peak(verify) / bound if bound else float("nan")
        lines.append(
            f"| {model} | {target} | {size} | {fmt(cell['eager'])} | {fmt(q)} "
            f"(+{forward:.0f} MB) | {fmt(export)} | {fmt(verify)} ({verify.get('verdict')}) | "
            f"{stage.get('seconds', '?')} s, {stage.get('peak_mb', '?')} MB | "
            f"{ratio_time:.2f}x | {ratio_peak:.2f}x |"
        )
    return "\n".join(lines)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def slopes(rows: list[dict[str, Any]]) -> str:
    """How each cost grows with the pixels: per model and target, the least-squares line of the
    verify stage's seconds and of the verification's peak over the export's (MB) against
    megapixels, and how far the largest size lies from the line fitted to the others (a
    superlinear cost shows as a large positive excess)."""
    lines = [
        "| model | target | verify stage: s per MP (fit) | largest size: excess over the "
        "line of the others | verify peak - export peak: MB per MP | largest size: excess |",
        "|---|---|---|---|---|---|",
    ]
    keyed = {(r["model"], r["target"], r["size"], r["kind"]): r for r in rows if "error" not in r}
    for model, target in sorted({(r["model"], r["target"]) for r in rows}):
        time_points, memory_points = [], []
        for (m, t, size, kind), row in sorted(keyed.items()):
            if (m, t, kind) != (model, target, "verify"):
                continue
            height, width = (int(v) for v in size.split("x"))
            megapixels = height * width / 1e6
            stage = (row.get("stages") or {}).get("verify")
            export = keyed.get((m, t, size, "export"))
            if stage is None or export is None:
                continue
            time_points.append((megapixels, float(stage)))
            memory_points.append((megapixels, _peak(row) - _peak(export)))
        if len(time_points) < 3:
            continue
        cells = []
        for points in (sorted(time_points), sorted(memory_points)):
            a, b = _fit(points[:-1])
            x, y = points[-1]
            predicted = a + b * x
            cells += [
                f"{_fit(points)[1]:.3g}",
                f"{(y - predicted) / max(abs(predicted), 1e-9):+.0%}",
            ]
        lines.append(f"| {model} | {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=4, metavar=("KIND", "MODEL", "TARGET", "HxW"))
    parser.add_argument("--models", nargs="+", default=["light-rife", "flow-warp"])
    parser.add_argument("--targets", nargs="+", default=["xnnpack", "vgf"])
    parser.add_argument("--sizes", nargs="+", default=SIZES)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.one:
        kind, name, target, size = args.one
        height, width = (int(v) for v in size.split("x"))
        print(json.dumps(one(kind, name, target, height, width)))
        return 0
    rows = []
    for name in args.models:
        for size in args.sizes:
            for kind in args.kinds:
                targets = args.targets if kind in ("export", "verify") else args.targets[:1]
                for target in targets:
                    row = _child(kind, name, target, size)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if kind in ("eager", "qforward"):  # the same for every target
                        rows.extend({**row, "target": t} for t in args.targets[1:])
    text = table(rows) + "\n\n" + slopes(rows)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
