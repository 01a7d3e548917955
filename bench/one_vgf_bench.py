"""One VGF against the split program and upstream's stock VGF export, on lavapipe.

Run on demand (not in CI; exports at 1080p take minutes each on a small machine):

    .venv/bin/python bench/one_vgf_bench.py [--sizes 540x960 1080x1920] [--models flow-warp rife]
        [--repeats 10] [--out bench-one-vgf.json]

For each model (the flow-warp demo; a RIFE-shaped model: two frames -> a strided conv block ->
upsampled bidirectional flow and a blend mask -> both frames warped -> blended) and size:

- ``one-vgf``: etkit's default VGF export: one VgfBackend delegate, each grid sampler a COMPUTE
  segment carrying etkit's shader, the parameter block baked into a per-call-site shader
  (``one-vgf-tensor``: the same with the block as a constant int32 tensor, the alternative);
- ``split``: ``sampler_delegate=True``: VGF delegates around etkit's grid-sampler delegate, the
  sampler on the CPU kernel (what a device runs with etkit's C++ backend linked in);
- ``upstream``: ExecuTorch's own flow (VgfQuantizer, VgfPartitioner, its grid-sampler shader),
  quantized; where that export fails, the error is reported and the float (TOSA FP) export is
  timed instead (``upstream-fp``).

Each VGF runs in scenario_runner (ML emulation layers, lavapipe) ``--repeats`` times in one
process; the figure is the median over iterations (the first left out) of the sum of that
iteration's command times (scenario_runner's profiling dump), per segment too. The split
program adds the CPU kernel's median time for each sampler (etkit_gridsampler.cpu, all
threads). On lavapipe "GPU" memory is host memory, so the split program pays no transfers here;
on a device each sampler call also moves its tensors GPU -> CPU -> GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from etkit_exporter import export_model
from etkit_exporter.export.demos import FlowWarp, pixel_grid
from etkit_exporter.programs import load_program
from etkit_exporter.vgf.scenario import FORMAT_DTYPES, scenario_template, vgf_ports
from etkit_exporter.vgf.tools import configure_model_converter, find_tool
from etkit_exporter.vgf.vulkan_env import ml_emulation_env
from etkit_gridsampler import cpu
from etkit_gridsampler.delegate_format import decode
from etkit_gridsampler.vgf_shader import payload


class RifeShaped(torch.nn.Module):
    """RIFE's IFBlock shape at one scale: frames -> strided convs -> upsampled flow (4: both
    directions) and mask -> both frames warped by grid_sample -> blended by the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Conv2d(16, 5, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        out = self.head(self.encode(torch.cat([frame0, frame1], 1)))
        out = F.interpolate(out, size=(height, width), mode="bilinear", align_corners=False)
        flow = torch.tanh(out[:, :4]) * 0.05
        mask = torch.sigmoid(out[:, 4:5])
        base = pixel_grid(height, width)
        warped0 = F.grid_sample(
            frame0, base + flow[:, :2].permute(0, 2, 3, 1), padding_mode="border"
        )
        warped1 = F.grid_sample(
            frame1, base + flow[:, 2:].permute(0, 2, 3, 1), padding_mode="border"
        )
        return warped0 * mask + warped1 * (1 - mask)


def _model(name: str, height: int, width: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = (FlowWarp() if name == "flow-warp" else RifeShaped()).eval()
    frames = tuple(torch.rand(1, 3, height, width) * 2 - 1 for _ in range(2))
    return model, frames


def _time_vgf(vgf: bytes, repeats: int, work: Path) -> dict[str, Any]:
    """Median per-iteration time of one VGF in scenario_runner, total and per segment (ms)."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "model.vgf"
    path.write_bytes(vgf)
    scenario = scenario_template(path)
    inputs, outputs = vgf_ports(path, scenario)
    rng = np.random.default_rng(0)
    for resource in scenario["resources"]:
        if "graph" in resource:
            resource["graph"]["src"] = str(path)
    for port in inputs:
        dtype = FORMAT_DTYPES[port.format]
        file = work / f"input_{port.index}.npy"
        if dtype.kind == "f":
            np.save(file, rng.uniform(-1, 1, port.dims).astype(dtype))
        else:
            np.save(file, rng.integers(-127, 128, port.dims).astype(dtype))
        port.body["src"] = str(file)
    for port in outputs:
        port.body["dst"] = str(work / f"output_{port.index}.npy")
    (work / "scenario.json").write_text(json.dumps(scenario))
    profile = work / "profile.json"
    done = subprocess.run(
        [find_tool("scenario_runner"), "--scenario", str(work / "scenario.json"),
         "--repeat", str(repeats), "--profiling-dump-path", str(profile)],
        capture_output=True, text=True, check=False, env=ml_emulation_env(), cwd=work,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"scenario_runner failed: {(done.stdout + done.stderr)[-1500:]}")
    stamps = json.loads(profile.read_text())["Timestamps"]
    per_iteration: dict[int, float] = {}
    per_segment: dict[str, list[float]] = {}
    for stamp in stamps:
        per_iteration[stamp["Iteration"]] = per_iteration.get(stamp["Iteration"], 0.0) + float(
            stamp["Time for command [ms]"]
        )
        per_segment.setdefault(stamp["Command name"].split("/")[-1], []).append(
            float(stamp["Time for command [ms]"])
        )
    totals = [per_iteration[k] for k in sorted(per_iteration)][1:] or list(per_iteration.values())
    return {
        "ms": statistics.median(totals),
        "segments_ms": {k: statistics.median(v[1:] or v) for k, v in per_segment.items()},
    }


def _time_cpu_sampler(blob: bytes, repeats: int) -> float:
    decoded = decode(blob)
    n, c, h, w = decoded.image_shape
    image = torch.randint(-127, 128, (n, h, w, c), dtype=torch.int8).permute(0, 3, 1, 2)
    grid = torch.randint(-32767, 32768, decoded.grid_shape, dtype=torch.int16)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        cpu.grid_sample(image, grid, decoded.op)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def _time_program(pte: Path, repeats: int, work: Path) -> dict[str, Any]:
    program = load_program(pte)
    delegates = [d.backend_id for d in program.delegates]
    total, parts = 0.0, []
    for k, delegate in enumerate(program.delegates):
        if delegate.backend_id == "VgfBackend":
            timing = _time_vgf(delegate.processed, repeats, work / f"vgf_{k}")
            parts.append({"delegate": "VgfBackend", **timing})
            total += timing["ms"]
        elif delegate.backend_id == "GridSamplerBackend":
            ms = _time_cpu_sampler(delegate.processed, repeats)
            parts.append({"delegate": "GridSamplerBackend (CPU kernel)", "ms": ms})
            total += ms
    return {"delegates": delegates, "ms": total, "parts": parts}


def _upstream_export(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], spec_name: str, work: Path
) -> Path:
    from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    configure_model_converter()
    spec = VgfCompileSpec(spec_name)
    program = torch.export.export(model, inputs, strict=True)
    if "INT" in spec_name:
        quantizer = VgfQuantizer(spec)
        quantizer.set_global(get_symmetric_quantization_config())
        prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
        prepared(*inputs)
        program = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    lowered = to_edge_transform_and_lower(program, partitioner=[VgfPartitioner(spec)])
    work.mkdir(parents=True, exist_ok=True)
    pte = work / "model.pte"
    pte.write_bytes(lowered.to_executorch().buffer)
    return pte


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["540x960", "1080x1920"])
    parser.add_argument("--models", nargs="+", default=["flow-warp", "rife"])
    parser.add_argument(
        "--variants", nargs="+", default=["one-vgf", "one-vgf-tensor", "split", "upstream"]
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="etkit-one-vgf-bench-") as tmp:
        for name in args.models:
            for size in args.sizes:
                height, width = (int(v) for v in size.split("x"))
                model, inputs = _model(name, height, width)
                for variant in args.variants:
                    work = Path(tmp) / f"{name}-{size}-{variant}"
                    row: dict[str, Any] = {"model": name, "size": size, "variant": variant}
                    start = time.perf_counter()
                    try:
                        if variant == "upstream":
                            try:
                                pte = _upstream_export(model, inputs, "TOSA-1.0+INT+int16", work)
                            except Exception as error:  # reported, then FP
                                row["int_export_error"] = (
                                    f"{type(error).__name__}: {str(error)[:300]}"
                                )
                                row["variant"] = "upstream-fp"
                                pte = _upstream_export(model, inputs, "TOSA-1.0+FP", work)
                        else:
                            mode = "tensor" if variant == "one-vgf-tensor" else "baked"
                            with mock.patch.object(payload, "DEFAULT_PARAMS_MODE", mode):
                                result = export_model(
                                    model,
                                    inputs,
                                    artifacts_root=work,
                                    sampler_delegate=variant == "split",
                                )
                            assert result.pte_path is not None
                            pte = result.pte_path
                        row["export_s"] = round(time.perf_counter() - start, 1)
                        row.update(_time_program(pte, args.repeats, work / "timing"))
                    except Exception as error:  # a bench row, not a crash
                        row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
                        traceback.print_exc()
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "parts"}), flush=True)
    print("\n| model | size | variant | delegates | ms (median) | export s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ms = f"{row['ms']:.1f}" if "ms" in row else row.get("error", "")[:60]
        print(
            f"| {row['model']} | {row['size']} | {row['variant']} | "
            f"{len(row.get('delegates', []))} | {ms} | {row.get('export_s', '')} |"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
