"""Throughput of etkit-gridsampler's kernels against torch.nn.functional.grid_sample.

Run on demand (not in CI): .venv/bin/python bench/gridsampler_bench.py [--repeats N]

Work: a 4-channel image (540x960 and 1080x1920), a smooth flow grid near identity, bilinear,
border padding. etkit: int8 image (channels-last, as a GPU texture), int16 SNORM16 grid, int8
SNORM8 output, with each instruction set this CPU offers (all give the same bits). PyTorch: the
same work in float32 (NCHW and channels-last). The physical bound is the memory traffic of the
bytes the int8 kernel must touch: reading the image and the grid and writing the output, as one
vectorized numpy pass. All figures come from one run, the calls taking turns round after round
(the machine is shared and its speed drifts); ratios are against PyTorch's single-thread float32
throughput.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from etkit_gridsampler import GridSampleOp, QParams, cpu, vulkan

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
OP = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)


def smooth_flow_grid(height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    flow_x = 0.01 * torch.sin(gy * 3.1) + 0.004 * torch.cos(gx * 5.3)
    flow_y = 0.008 * torch.cos(gx * 2.7) - 0.003 * torch.sin(gy * 4.1)
    return torch.stack((gx + flow_x, gy + flow_y), -1).unsqueeze(0)


class Case:
    """One measured call; `every`: it runs in one round of that many (slow ones)."""

    def __init__(self, run: Callable[[], object], torch_threads: int = 1, every: int = 1) -> None:
        self.run, self.torch_threads, self.every = run, torch_threads, every
        self.times: list[float] = []

    def call(self) -> float:
        # idle OpenMP workers would spin on the cores etkit's threads use: torch gets threads
        # only for its own calls
        torch.set_num_threads(self.torch_threads)
        start = time.perf_counter()
        self.run()
        return time.perf_counter() - start


def measure(cases: dict[str, Case], repeats: int) -> dict[str, float]:
    """Median seconds per case. The cases take turns, round after round, so that every ratio
    compares calls made under the same conditions on a shared, drifting machine."""
    for case in cases.values():  # warm-up: caches, page faults, idle cores waking, shaders
        for _ in range(3 if case.every == 1 else 1):
            case.call()
    for round_index in range(repeats):
        for case in cases.values():
            if round_index % case.every == 0:
                case.times.append(case.call())
    return {name: statistics.median(case.times) for name, case in cases.items()}


def run_size(height: int, width: int, repeats: int, threads: int) -> None:
    generator = torch.Generator().manual_seed(0)
    image_f = torch.rand(1, 4, height, width, generator=generator) * 2 - 1
    grid_f = smooth_flow_grid(height, width)
    image_q = torch.clamp(torch.round(image_f * 127), -127, 127).to(torch.int8)
    image_q = image_q.contiguous(memory_format=torch.channels_last)
    grid_q = torch.clamp(torch.round(grid_f * 32767), -32767, 32767).to(torch.int16)
    image_f_nhwc = image_f.contiguous(memory_format=torch.channels_last)
    pixels = height * width / 1e6

    def torch_f32(image: torch.Tensor) -> Callable[[], object]:
        return lambda: F.grid_sample(image, grid_f, padding_mode="border", align_corners=False)

    def etkit(isa: str, n: int) -> Callable[[], object]:
        return lambda: cpu.grid_sample(image_q, grid_q, OP, num_threads=n, isa=isa)  # type: ignore[arg-type]

    cases = {
        "torch float32 NCHW, 1 thread": Case(torch_f32(image_f)),
        "torch float32 NHWC, 1 thread": Case(torch_f32(image_f_nhwc)),
        f"torch float32 NCHW, {threads} threads": Case(torch_f32(image_f), torch_threads=threads),
    }
    isas = cpu.available_isas()
    for isa in isas:
        cases[f"etkit int8/int16 {isa}, 1 thread"] = Case(
            etkit(isa, 1), every=3 if isa == "scalar" else 1
        )
    if threads > 1:
        cases[f"etkit int8/int16 {isas[-1]}, {threads} threads"] = Case(etkit("auto", threads))
    image_bytes = image_q.numpy().reshape(-1)
    grid_bytes = grid_q.numpy().reshape(-1).view(np.int8)[: image_bytes.size]
    output_bytes = np.empty_like(image_bytes)
    cases["memory: read image and grid, write output"] = Case(
        lambda: np.add(image_bytes, grid_bytes, out=output_bytes)
    )
    if vulkan.is_available():
        cases["etkit Vulkan (lavapipe), incl. transfers"] = Case(
            lambda: vulkan.grid_sample(image_q, grid_q, OP), every=5
        )
    results = measure(cases, repeats)
    baseline = results["torch float32 NCHW, 1 thread"]
    print(f"\n1x4x{height}x{width}, bilinear, border, smooth flow near identity")
    for name, value in results.items():
        print(f"  {name:<46} {pixels / value:9.1f} Mpix/s  {baseline / value:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    print(
        f"{threads} hardware threads; median of {args.repeats} rounds (scalar: every third, "
        "Vulkan: every fifth); Mpix/s = output pixels/s"
    )
    for height, width in ((540, 960), (1080, 1920)):
        run_size(height, width, args.repeats, threads)
    torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
