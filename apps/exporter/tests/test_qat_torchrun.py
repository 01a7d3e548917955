"""``examples/qat_torchrun.py`` under ``torchrun --nproc-per-node 2`` on the CPU (gloo): QAT of an
any-size flow warp under DistributedDataParallel, a ``DistributedSampler`` over a folder of PNG
frames, random crops; a run of 5 steps checkpointed at step 3 (mid-epoch), and a second run
resumed from that checkpoint, end with the same state, bit for bit; a resume with another world
size is refused in one line."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "qat_torchrun.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _recipe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("qat_torchrun", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun(tmp_path: Path, out: str, *extra: str) -> str:
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(RECIPE),
         "--frames", str(tmp_path / "frames"), "--out", str(tmp_path / out), "--steps", "5",
         "--batch", "2", "--checkpoint-every", "3", "--crop", "32x48", *extra],
        capture_output=True, text=True, check=False, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_resumes_bit_for_bit(tmp_path: Path) -> None:
    first = _torchrun(tmp_path, "uninterrupted", "--make-frames", "10")
    assert "step 3: checkpoint" in first and "trained 5 steps on 2 processes" in first, first
    # 9 pairs, 4 per rank, 2 batches an epoch: step 3 is the middle of the second epoch.
    shutil.copy(tmp_path / "uninterrupted" / "checkpoint.pt", tmp_path / "step3.pt")
    _torchrun(tmp_path, "resumed", "--resume", str(tmp_path / "step3.pt"))
    ended = torch.load(tmp_path / "uninterrupted" / "trained.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "trained.pt", weights_only=True)
    at_step3 = torch.load(tmp_path / "step3.pt", weights_only=True)
    assert at_step3["step"] == 3 and at_step3["world_size"] == 2
    assert ended.keys() == resumed.keys()
    assert all(torch.equal(ended[k], resumed[k]) for k in ended)
    moved = [k for k in ended if not torch.equal(ended[k], at_step3["state_dict"][k])]
    assert any(k.endswith("weight") for k in moved) and any(".scale" in k for k in moved), moved
    # The checkpoint holds learnt state only: parameters and fake quantizes, no graph constant.
    assert all(k.startswith(("flow.", "refine.", "activation_post_process_")) for k in ended)

    with pytest.raises(SystemExit) as refused:
        _recipe().read_resume(tmp_path / "step3.pt", 3)
    text = str(refused.value)
    assert "\n" not in text and text.startswith(
        f"qat_torchrun: --resume {tmp_path / 'step3.pt'} was saved by 2 processes, this run has "
        "3: resume with --nproc-per-node 2"
    ), text
