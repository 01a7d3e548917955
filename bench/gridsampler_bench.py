"""Throughput of etkit-gridsampler's kernels against torch.nn.functional.grid_sample.

Run on demand (not in CI): .venv/bin/python bench/gridsampler_bench.py [--repeats N]

Work: a 4-channel image (540x960 and 1080x1920), a smooth flow grid near identity, bilinear,
border padding. etkit: int8 image (channels-last, as a GPU texture), int16 SNORM16 grid, int8
SNORM8 output, with each instruction set this CPU offers (all give the same bits). PyTorch: the
same work in float32 (NCHW and channels-last). The physical bound is the memory traffic of the
bytes the int8 kernel must touch: reading the image and the grid and writing the output, as one
vectorized numpy pass. All figures come from one run, side by side; ratios are against PyTorch's
single-thread float32 throughput.
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


def seconds(run: Callable[[], object], repeats: int) -> float:
    for _ in range(3):  # warm-up: caches, page faults, idle cores waking
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_size(height: int, width: int, repeats: int, threads: int) -> None:
    generator = torch.Generator().manual_seed(0)
    image_f = torch.rand(1, 4, height, width, generator=generator) * 2 - 1
    grid_f = smooth_flow_grid(height, width)
    image_q = torch.clamp(torch.round(image_f * 127), -127, 127).to(torch.int8)
    image_q = image_q.contiguous(memory_format=torch.channels_last)
    grid_q = torch.clamp(torch.round(grid_f * 32767), -32767, 32767).to(torch.int16)
    image_f_nhwc = image_f.contiguous(memory_format=torch.channels_last)
    pixels = height * width / 1e6

    def torch_f32(image: torch.Tensor, n: int) -> float:
        torch.set_num_threads(n)
        return seconds(
            lambda: F.grid_sample(image, grid_f, padding_mode="border", align_corners=False),
            repeats,
        )

    results = {
        "torch float32 NCHW, 1 thread": torch_f32(image_f, 1),
        "torch float32 NHWC, 1 thread": torch_f32(image_f_nhwc, 1),
        f"torch float32 NCHW, {threads} threads": torch_f32(image_f, threads),
    }
    torch.set_num_threads(1)  # idle OpenMP workers would spin on the cores etkit's threads use
    isas = cpu.available_isas()
    for isa in isas:
        results[f"etkit int8/int16 {isa}, 1 thread"] = seconds(
            lambda isa=isa: cpu.grid_sample(image_q, grid_q, OP, num_threads=1, isa=isa),
            repeats if isa != "scalar" else max(2, repeats // 3),
        )
    if threads > 1:
        results[f"etkit int8/int16 {isas[-1]}, {threads} threads"] = seconds(
            lambda: cpu.grid_sample(image_q, grid_q, OP, num_threads=threads), repeats
        )
    image_bytes = image_q.numpy().reshape(-1)
    grid_bytes = grid_q.numpy().reshape(-1).view(np.int8)
    output_bytes = np.empty_like(image_bytes)
    results["memory: read image and grid, write output"] = seconds(
        lambda: np.add(image_bytes, grid_bytes[: image_bytes.size], out=output_bytes), repeats
    )
    if vulkan.is_available():
        vulkan.grid_sample(image_q, grid_q, OP)  # compile the shader
        results["etkit Vulkan (lavapipe), incl. transfers"] = seconds(
            lambda: vulkan.grid_sample(image_q, grid_q, OP), max(2, repeats // 3)
        )
    baseline = results["torch float32 NCHW, 1 thread"]
    print(f"\n1x4x{height}x{width}, bilinear, border, smooth flow near identity")
    for name, value in results.items():
        print(f"  {name:<46} {pixels / value:9.1f} Mpix/s  {baseline / value:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    print(f"{threads} hardware threads; median of {args.repeats} runs; Mpix/s = output pixels/s")
    for height, width in ((540, 960), (1080, 1920)):
        run_size(height, width, args.repeats, threads)
    torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
