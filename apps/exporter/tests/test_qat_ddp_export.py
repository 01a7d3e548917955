"""QAT of an export under DistributedDataParallel: two processes (gloo, on the CPU) prepare the
flow-warp demo with ``qat_prepare`` for XNNPACK (fake quantizes with learnt ranges, XNNPACK's
int32 biases, etkit's exact sampler) and train it on different batches; every rank ends with
the same parameters, the same fake-quantize ranges and the same output, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spawned ranks import the worker
from qat_ddp_export_worker import STEPS, train


# On demand (-m extended): DDP training with etkit's sampler is CI's in etkit-gridsampler's
# test_qat_ddp.py, and a QAT model's export in test_qat_export.py.
@pytest.mark.slow
@pytest.mark.extended
def test_ranks_train_to_identical_parameters_ranges_and_outputs(tmp_path: Path) -> None:
    world_size = 2
    mp.spawn(train, args=(world_size, str(tmp_path / "init"), str(tmp_path)), nprocs=world_size)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    first, second = ranks
    assert len(first["losses"]) == STEPS
    assert not torch.equal(first["losses"], second["losses"])  # the ranks saw different data
    assert torch.equal(first["parameters"], second["parameters"])
    assert first["ranges"] and first["ranges"] == second["ranges"]  # (name, scale, zero point)
    learnt = [r for r in first["ranges"] if r[1] not in (1 / 127, 1 / 32767)]
    assert learnt, "no learnt range among the fake quantizes"
    assert torch.equal(first["output"], second["output"])
