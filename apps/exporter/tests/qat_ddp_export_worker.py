"""The worker of test_qat_ddp_export.py (a module of its own, put on ``sys.path`` by the test, so
that the processes ``torch.multiprocessing.spawn`` starts can import it): prepares the flow-warp
demo with ``qat_prepare`` (fake quantizes, etkit's exact sampler, XNNPACK's QAT quantizer),
trains it under DistributedDataParallel on this rank's own batches, and saves what it ended with."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from etkit_exporter import qat_prepare
from etkit_exporter.export.demos import flow_warp, moving_textures
from etkit_quant import fake_quant_params

STEPS = 3


def _frames(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(a, b) for a, b, _ in moving_textures(count, 16, 24, max_flow=2.0, seed=seed)]


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
        model, _ = flow_warp()
        calibration = _frames(1, 3)  # the same on every rank
        prepared = qat_prepare(model, calibration[0], target="xnnpack", calibration=calibration)
        ddp = DistributedDataParallel(prepared)  # buffers (ranges) broadcast from rank 0
        optimizer = torch.optim.Adam(ddp.parameters(), lr=2e-3)
        batches = _frames(100 + rank, STEPS)  # each rank its own
        losses = []
        for first, second in batches:
            loss = F.l1_loss(ddp(first, second), second)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        ddp.eval()  # observers stop; this forward's broadcast leaves every rank rank 0's ranges
        probe = _frames(7, 1)[0]
        with torch.no_grad():
            output = ddp(*probe)
        ranges = []
        for name, module in sorted(prepared.named_modules()):
            try:
                params = fake_quant_params(module)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
            ranges.append((name, params.scale, params.zero_point))
        torch.save(
            {
                "parameters": torch.cat([p.detach().flatten() for p in prepared.parameters()]),
                "ranges": ranges,
                "output": output,
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
