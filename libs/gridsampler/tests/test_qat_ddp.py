"""The exact sampler under DistributedDataParallel: two processes (gloo, on the CPU) train a tiny
flow-warping module through it on different batches; every rank ends with the same parameters
and computes the same sampler outputs, bit for bit, after every step."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp
from qat_ddp_worker import STEPS, train


def test_ranks_train_to_identical_parameters_and_outputs(tmp_path: Path) -> None:
    world_size = 2
    mp.spawn(
        train,
        args=(world_size, str(tmp_path / "init"), str(tmp_path)),
        nprocs=world_size,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    first = ranks[0]
    for other in ranks[1:]:
        assert torch.equal(other["parameters"], first["parameters"])
        assert torch.equal(other["probes"], first["probes"])  # every step's sampler output
        for mine, theirs in zip(other["gathered"], first["gathered"], strict=True):
            assert torch.equal(mine, theirs)
        # the ranks did see different data
        assert not torch.equal(other["losses"], first["losses"])
    assert all(torch.equal(g, first["parameters"]) for g in first["gathered"])
    assert first["probes"].shape[0] == STEPS
    # training moved the sampler's output
    assert not torch.equal(first["probes"][0], first["probes"][-1])
