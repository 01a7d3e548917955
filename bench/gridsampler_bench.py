"""Throughput of etkit-gridsampler's CPU kernel against its peers: PyTorch, OpenCV, ExecuTorch.

Run on demand (not in CI): .venv/bin/python bench/gridsampler_bench.py [--repeats N] [--case NAME]

Cases (each a warp or a lookup people run): 1080p RGBA bilinear (border padding, a smooth flow
near identity), the same with nearest sampling, 1080p RGB, 1080p RGBA stored NCHW, a RAFT-style
correlation lookup (2852 one-channel 46x62 maps, 9x9 samples around a point in each, zeros
padding, align_corners), and 540p feature maps of 8 and 16 channels. Per case:

- etkit: int8 image (channels-last unless the case says NCHW), int16 SNORM16 grid, int8 SNORM8
  output, with each instruction set this CPU offers (all give the same bits), on one thread and
  on all;
- PyTorch float32 `F.grid_sample`, NCHW and channels-last, one thread and all;
- OpenCV `cv2.remap` on the uint8 image (channels-last, the layout it takes) with float32 maps
  and with the fixed-point maps of `cv2.convertMaps` (made once, outside the timing), one
  thread (`cv2.setNumThreads(1)`) and all; the correlation lookup stacks its maps into one
  image with zero rows and columns between them, so that one call does the work;
- ExecuTorch's portable `grid_sampler_2d` kernel: a float module calling `F.grid_sample`,
  exported with `to_edge` and `to_executorch` (no delegate), run by `executorch.runtime`;
- the memory line: one numpy pass that reads and writes as many bytes as the int8 kernel must
  touch (image, grid and output, once).

All figures of a case come from one run in which its calls take turns, round after round (the
machine is shared and its speed drifts); each is the median of the rounds. Ratios are against
PyTorch's faster single-thread layout; the 1080p RGBA case also prints etkit against OpenCV's
best single-thread remap and against the memory line. Then etkit's thread scaling at 1080p.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from bench_common import lookup_grid, measure, smooth_flow_grid

from etkit_gridsampler import GridSampleOp, QParams, cpu

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    channels: int
    height: int
    width: int
    mode: str = "bilinear"
    padding: str = "border"
    align_corners: bool = False
    nchw: bool = False
    lookup: bool = False  # a correlation lookup: 9 x 9 samples per image around a point


WORKLOADS = [
    Workload("1080p RGBA bilinear", 1, 4, 1080, 1920),
    Workload("1080p RGBA nearest", 1, 4, 1080, 1920, mode="nearest"),
    Workload("1080p RGB bilinear", 1, 3, 1080, 1920),
    Workload("1080p RGBA bilinear, NCHW", 1, 4, 1080, 1920, nchw=True),
    Workload(
        "correlation lookup, 1 channel", 2852, 1, 46, 62, "bilinear", "zeros", True, True, True
    ),
    Workload("540p 8 channels bilinear", 1, 8, 540, 960),
    Workload("540p 16 channels bilinear", 1, 16, 540, 960),
]


class Case:
    """One measured call; `every`: it runs in one round of that many (slow ones)."""

    def __init__(
        self,
        run: Callable[[], object],
        torch_threads: int = 1,
        cv_threads: int = 1,
        every: int = 1,
    ) -> None:
        self.run, self.torch_threads, self.cv_threads, self.every = (
            run,
            torch_threads,
            cv_threads,
            every,
        )
        self.times: list[float] = []

    def call(self) -> float:
        # idle OpenMP workers would spin on the cores the others use: each library gets its
        # threads for its own calls only
        torch.set_num_threads(self.torch_threads)
        if cv2 is not None:
            cv2.setNumThreads(self.cv_threads)
        start = time.perf_counter()
        self.run()
        return time.perf_counter() - start


try:
    import cv2
except ImportError:  # opencv-python-headless is in requirements/dev.txt
    cv2 = None


def executorch_method(image: torch.Tensor, grid: torch.Tensor, w: Workload) -> Callable[[], object]:
    """The undelegated F.grid_sample of a float program in executorch.runtime (portable kernel)."""
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    class Sample(torch.nn.Module):
        def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return F.grid_sample(
                image, grid, mode=w.mode, padding_mode=w.padding, align_corners=w.align_corners
            )

    manager = to_edge(torch.export.export(Sample(), (image, grid), strict=True)).to_executorch()
    buffer = manager.buffer
    program = Runtime.get().load_program(buffer)
    method = program.load_method("forward")
    inputs = [image, grid]
    # the loaded program reads the buffer in place: the closure keeps both alive
    return lambda: (buffer, program, method.execute(inputs))


def opencv_inputs(
    image_u8: np.ndarray, grid: torch.Tensor, w: Workload
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image H x W x C, map_x, map_y) in pixels for cv2.remap. A lookup's maps are tiled into
    one image (OpenCV takes sides below 2^15) with two zero rows and columns around each, so that
    taps outside a map read 0."""
    g = grid.numpy().astype(np.float64)
    if w.lookup:
        n, h, wd = image_u8.shape[0], w.height, w.width
        across = 4096 // (wd + 2)
        down = -(-n // across)
        tiles = np.zeros((down * (h + 2), across * (wd + 2), w.channels), np.uint8)
        top = (np.arange(n) // across) * (h + 2) + 1
        left = (np.arange(n) % across) * (wd + 2) + 1
        for k in range(n):
            tiles[top[k] : top[k] + h, left[k] : left[k] + wd] = image_u8[k]
        x = (g[..., 0] + 1) / 2 * (wd - 1) + left[:, None, None]
        y = (g[..., 1] + 1) / 2 * (h - 1) + top[:, None, None]
        ho, wo = grid.shape[1], grid.shape[2]
        maps = (x.reshape(n * ho, wo), y.reshape(n * ho, wo))
        return tiles, maps[0].astype(np.float32), maps[1].astype(np.float32)
    x = ((g[0, ..., 0] + 1) * w.width - 1) / 2
    y = ((g[0, ..., 1] + 1) * w.height - 1) / 2
    return image_u8[0], x.astype(np.float32), y.astype(np.float32)


def run_workload(w: Workload, repeats: int, threads: int, isas: tuple[str, ...]) -> None:
    generator = torch.Generator().manual_seed(0)
    shape = (w.batch, w.channels, w.height, w.width)
    image_f = torch.rand(shape, generator=generator) * 2 - 1
    if w.lookup:
        grid_f = lookup_grid(w.batch, w.height, w.width, generator)
    else:
        grid_f = smooth_flow_grid(w.height, w.width)
    layout = torch.contiguous_format if w.nchw else torch.channels_last
    image_q = torch.clamp(torch.round(image_f * 127), -127, 127).to(torch.int8)
    image_q = image_q.contiguous(memory_format=layout)
    grid_q = torch.clamp(torch.round(grid_f * 32767), -32767, 32767).to(torch.int16)
    image_f_nhwc = image_f.contiguous(memory_format=torch.channels_last)
    op = GridSampleOp(w.mode, w.padding, w.align_corners, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
    pixels = grid_q.shape[0] * grid_q.shape[1] * grid_q.shape[2] / 1e6

    def torch_f32(image: torch.Tensor) -> Callable[[], object]:
        return lambda: F.grid_sample(
            image, grid_f, mode=w.mode, padding_mode=w.padding, align_corners=w.align_corners
        )

    def etkit(isa: str, n: int) -> Callable[[], object]:
        return lambda: cpu.grid_sample(image_q, grid_q, op, num_threads=n, isa=isa)  # type: ignore[arg-type]

    slow = 3 if pixels * w.channels > 4 else 1
    cases = {
        "PyTorch float32 NCHW, 1 thread": Case(torch_f32(image_f)),
        "PyTorch float32 NHWC, 1 thread": Case(torch_f32(image_f_nhwc)),
        f"PyTorch float32 NCHW, {threads} threads": Case(torch_f32(image_f), torch_threads=threads),
    }
    if cv2 is not None:
        image_u8 = (image_q.permute(0, 2, 3, 1).numpy().astype(np.int16) + 128).astype(np.uint8)
        source, map_x, map_y = opencv_inputs(image_u8, grid_f, w)
        nearest = w.mode == "nearest"
        interpolation = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
        border = cv2.BORDER_CONSTANT if w.padding == "zeros" else cv2.BORDER_REPLICATE
        fixed_1, fixed_2 = cv2.convertMaps(map_x, map_y, cv2.CV_16SC2, nninterpolation=nearest)

        def remap(first: np.ndarray, second: np.ndarray | None) -> Callable[[], object]:
            return lambda: cv2.remap(source, first, second, interpolation, borderMode=border)  # type: ignore[call-overload]

        for n in sorted({1, threads}):
            suffix = f"{n} thread{'s' if n > 1 else ''}"
            cases[f"OpenCV remap uint8, float maps, {suffix}"] = Case(
                remap(map_x, map_y), cv_threads=n
            )
            cases[f"OpenCV remap uint8, fixed-point maps, {suffix}"] = Case(
                remap(fixed_1, fixed_2 if not nearest else None), cv_threads=n
            )
    cases["ExecuTorch portable grid_sampler_2d (float32)"] = Case(
        executorch_method(image_f, grid_f, w), every=5 if slow > 1 else 1
    )
    for isa in isas:
        cases[f"etkit int8 {isa}, 1 thread"] = Case(
            etkit(isa, 1), every=slow if isa == "scalar" else 1
        )
    if threads > 1:
        cases[f"etkit int8 {isas[-1]}, {threads} threads"] = Case(etkit("auto", threads))
    # the bytes the int8 kernel must touch: image, grid and output, once
    touched = image_q.numel() + grid_q.numel() * 2 + int(pixels * 1e6) * w.channels
    third = max(1, touched // 3)
    a, b, out = np.ones(third, np.int8), np.ones(third, np.int8), np.empty(third, np.int8)
    cases["memory: read and write the bytes etkit touches"] = Case(lambda: np.add(a, b, out=out))
    results = measure(cases, repeats)
    baseline = min(
        results["PyTorch float32 NCHW, 1 thread"], results["PyTorch float32 NHWC, 1 thread"]
    )
    layout_name = "NCHW" if w.nchw else "NHWC"
    print(
        f"\n{w.name}: {w.batch}x{w.channels}x{w.height}x{w.width} -> "
        f"{grid_q.shape[1]}x{grid_q.shape[2]}, {w.mode}, {w.padding}, etkit {layout_name}"
    )
    for name, value in results.items():
        print(f"  {name:<52} {pixels / value:9.1f} Mpix/s  {baseline / value:6.2f}x")
    best = f"etkit int8 {isas[-1]}, 1 thread"
    opencv_1 = [v for k, v in results.items() if k.startswith("OpenCV") and k.endswith(" 1 thread")]
    if opencv_1:
        print(f"  {best} / OpenCV's best 1-thread remap: {min(opencv_1) / results[best]:.2f}x")
    memory = results["memory: read and write the bytes etkit touches"]
    print(f"  {best} / memory line: {memory / results[best]:.2f}")


def thread_scaling(repeats: int, threads: int) -> None:
    w = WORKLOADS[0]
    grid_q = torch.clamp(torch.round(smooth_flow_grid(w.height, w.width) * 32767), -32767, 32767)
    grid_q = grid_q.to(torch.int16)
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(
        -127, 128, (1, 4, w.height, w.width), dtype=torch.int8, generator=generator
    )
    image = image.contiguous(memory_format=torch.channels_last)
    op = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)
    cases = {
        f"{n} thread{'s' if n > 1 else ''}": Case(
            lambda n=n: cpu.grid_sample(image, grid_q, op, num_threads=n)  # type: ignore[misc]
        )
        for n in range(1, threads + 1)
    }
    results = measure(cases, repeats)
    pixels = w.height * w.width / 1e6
    one = results["1 thread"]
    print(f"\netkit thread scaling, {w.name}")
    for name, value in results.items():
        print(f"  {name:<12} {pixels / value:9.1f} Mpix/s  {one / value:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--case", action="append", help="run only cases whose name contains this")
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    isas = cpu.available_isas()
    print(
        f"{threads} hardware threads; instruction sets {', '.join(isas)}; OpenCV "
        f"{cv2.__version__ if cv2 is not None else 'not installed'}; median of {args.repeats} "
        "rounds (slow calls: every third or fifth); Mpix/s = output pixels/s"
    )
    for w in WORKLOADS:
        if not args.case or any(part in w.name for part in args.case):
            run_workload(w, args.repeats, threads, isas)
    if not args.case and threads > 1:
        thread_scaling(args.repeats, threads)
    torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
