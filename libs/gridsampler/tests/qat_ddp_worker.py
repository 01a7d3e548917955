"""The worker of test_qat_ddp.py (a module of its own, on pytest's pythonpath, so that the processes
``torch.multiprocessing.spawn`` starts can import it): trains a tiny flow-warping module through
the exact sampler under DistributedDataParallel and saves what each rank saw."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from etkit_gridsampler import QParams, qat

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
SIZE = 16
STEPS = 6


class FlowWarp(torch.nn.Module):
    """A flow network (two convolutions on both frames) whose flow warps the first frame
    through the exact sampler."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(6, 8, 3, padding=1)
        self.flow = torch.nn.Conv2d(8, 2, 3, padding=1)
        self.sampler = qat.ExactGridSample(
            image=SNORM8, grid=SNORM16, output=SNORM8, padding_mode="border", align_corners=True
        )
        steps = torch.linspace(-1, 1, SIZE)
        ys, xs = torch.meshgrid(steps, steps, indexing="ij")
        self.register_buffer("identity", torch.stack((xs, ys), -1))

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        flow = self.flow(torch.tanh(self.features(torch.cat((first, second), 1))))
        grid = self.identity + flow.permute(0, 2, 3, 1) * (2 / (SIZE - 1))
        warped: torch.Tensor = self.sampler(first, grid)
        return warped


def frames(generator: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth textures and the same textures shifted by a pixel (with border padding)."""
    texture = F.avg_pool2d(torch.rand((batch, 3, SIZE, SIZE), generator=generator), 3, 1, 1)
    texture = texture * 1.6 - 0.8
    shifted = torch.cat((texture[..., 1:], texture[..., -1:]), -1)
    return texture, shifted


def train(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(  # a rank that never comes fails the test in 2 minutes, not 30
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=120),
    )
    try:
        torch.manual_seed(1234 + rank)  # different initial weights: DDP broadcasts rank 0's
        model = FlowWarp()
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
        data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
        probe = frames(torch.Generator().manual_seed(7), 2)  # the same on every rank
        probes, losses = [], []
        for _ in range(STEPS):
            first, second = frames(data, 2)
            loss = F.mse_loss(ddp(first, second), second)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            with torch.no_grad():
                probes.append(model(*probe))
        parameters = torch.cat([p.detach().flatten() for p in model.parameters()])
        # every rank's parameters and probe outputs, gathered on every rank
        gathered = [torch.empty_like(parameters) for _ in range(world_size)]
        dist.all_gather(gathered, parameters)
        torch.save(
            {
                "parameters": parameters,
                "gathered": gathered,
                "probes": torch.stack(probes),
                "losses": torch.stack(losses),
            },
            Path(out_dir) / f"rank{rank}.pt",
        )
        dist.barrier()  # every rank has saved
    except BaseException:
        dist.destroy_process_group()
        raise
    # Out without tearing the process group down: torch's ProcessGroupGloo destructor can
    # deadlock at exit (its work thread takes the GIL to release a collective's tensor while the
    # main thread, holding the GIL, joins that thread); a rank hung so, and mp.spawn with it
    # (seen 2026-11-29 under the suite's watchdog; the likely CI stall of 2026-11-29).
    os._exit(0)
