"""What the grid-sampler benches share (``gridsampler_bench.py``, ``kernel_ab_bench.py``,
``vulkan_bench.py``; imported as ``bench_common``, beside them): their sampling grids and the
round-robin timing loop."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Protocol

import torch


def smooth_flow_grid(height: int, width: int) -> torch.Tensor:
    """1 x height x width x 2: the identity grid moved by a smooth flow of about 1 % of the
    image (what a frame interpolator's warp samples)."""
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    flow_x = 0.01 * torch.sin(gy * 3.1) + 0.004 * torch.cos(gx * 5.3)
    flow_y = 0.008 * torch.cos(gx * 2.7) - 0.003 * torch.sin(gy * 4.1)
    return torch.stack((gx + flow_x, gy + flow_y), -1).unsqueeze(0)


def lookup_grid(batch: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """batch x 9 x 9 x 2 (align_corners): a random point per image, -4..4 pixels around it (a
    correlation lookup's samples)."""
    cx = torch.rand(batch, generator=generator) * (width - 1)
    cy = torch.rand(batch, generator=generator) * (height - 1)
    steps = torch.linspace(-4, 4, 9)
    dy, dx = torch.meshgrid(steps, steps, indexing="ij")
    x, y = cx[:, None, None] + dx, cy[:, None, None] + dy
    return torch.stack((2 * x / (width - 1) - 1, 2 * y / (height - 1) - 1), -1)


class TimedCall(Protocol):
    """One measured call: ``call()`` runs it once and returns its seconds; it runs in one round
    of ``every`` (slow ones), and ``measure`` appends each time to ``times``."""

    every: int
    times: list[float]

    def call(self) -> float: ...


def measure(cases: Mapping[str, TimedCall], repeats: int, warmups: int = 2) -> dict[str, float]:
    """Median seconds per case. The cases take turns, round after round, so that every ratio
    compares calls made under the same conditions on a shared, drifting machine; each first
    runs ``warmups`` times (once where it runs only every few rounds): caches, page faults,
    idle cores waking."""
    for case in cases.values():
        for _ in range(warmups if case.every == 1 else 1):
            case.call()
    for round_index in range(repeats):
        for case in cases.values():
            if round_index % case.every == 0:
                case.times.append(case.call())
    return {name: statistics.median(case.times) for name, case in cases.items()}
