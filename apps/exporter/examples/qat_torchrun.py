"""Quantization-aware training across processes: a torchrun recipe.

    torchrun --nproc-per-node N apps/exporter/examples/qat_torchrun.py --frames DIR
        [--out OUT] [--steps 200] [--batch 8] [--crop 64x96] [--checkpoint-every 50]
        [--resume OUT/checkpoint.pt] [--target xnnpack|vgf] [--export 144x256]

Each process (one per GPU, or per CPU share) prepares the same module with
``etkit_exporter.qat_prepare`` (the quantizer the export uses, etkit's exact sampler at every
``grid_sample``, a dynamic batch; with ``--crop-range`` a range of crop sizes too) and trains
it under ``DistributedDataParallel``: NCCL where CUDA is available, gloo on CPUs. The data are
the consecutive frame pairs of a folder of PNGs (``DIR/*.png`` in name order; ``--make-frames
DIR`` writes moving textures there), sharded by a ``DistributedSampler``; each pair gives a
random crop (the same crop for a given pair, epoch and seed, on any world size), the loss the
warped frame's L1 error against the next frame.

Every ``--checkpoint-every`` steps rank 0 writes ``OUT/checkpoint.pt``: the module's
``state_dict()`` (learnt parameters and fake-quantize state only: no constant of the capture,
so it fits any batch and crop), the optimizer's, the step and the world size. ``--resume``
continues from one bit for bit: the run ends with the state an uninterrupted run ends with
(the data order follows the epoch and the step, the crops the pair, epoch and seed: nothing
random is left unsaved). A resume with another world size is refused in one line (the
sampler's shards, and so the batches, follow it). At the end rank 0 writes ``OUT/trained.pt``
(for ``etkit-export --qat-checkpoint``) and, with ``--export HxW``, exports the trained module
at that size with ``verify=True`` and prints how far the program lies from its eval forward.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from etkit_exporter.export.demos import AnySizeFlowWarp

CHECKPOINT_FORMAT = 1


def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The float model and example frames (``etkit-export -m FILE:make --qat-checkpoint``)."""
    torch.manual_seed(0)
    return AnySizeFlowWarp().eval(), (torch.zeros(1, 3, 64, 96), torch.zeros(1, 3, 64, 96))


class FramePairs(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Consecutive frame pairs of a folder of PNGs, each a random crop of ``crop`` (height,
    width) chosen from the pair's index, the epoch and ``seed``: the same crop on any rank and
    any world size, and on a resumed run."""

    def __init__(self, folder: Path, crop: tuple[int, int], seed: int = 0) -> None:
        self.paths = sorted(folder.glob("*.png"))
        if len(self.paths) < 2:
            raise ValueError(f"--frames {folder}: it holds {len(self.paths)} PNG frames, need 2+")
        self.crop, self.seed, self.epoch = crop, seed, 0

    def __len__(self) -> int:
        return len(self.paths) - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = _read_png(self.paths[index]), _read_png(self.paths[index + 1])
        height, width = self.crop
        if first.shape[-2] < height or first.shape[-1] < width:
            raise ValueError(f"{self.paths[index]} is smaller than the crop {height}x{width}")
        pick = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + index)
        top = int(torch.randint(first.shape[-2] - height + 1, (1,), generator=pick))
        left = int(torch.randint(first.shape[-1] - width + 1, (1,), generator=pick))
        window = (slice(None), slice(top, top + height), slice(left, left + width))
        return first[window], second[window]


def _read_png(path: Path) -> torch.Tensor:
    """A PNG as a 3 x H x W float tensor in [-1, 1]."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1) / 127.5 - 1


def make_frames(folder: Path, count: int, height: int, width: int) -> None:
    """``count`` PNG frames of a texture moving by a known flow (``demos.moving_textures``)."""
    from PIL import Image

    from etkit_exporter.export.demos import moving_textures, pixel_grid_centres

    folder.mkdir(parents=True, exist_ok=True)
    frame = moving_textures(1, height, width, max_flow=2.0, seed=1)[0][0]
    scale = torch.tensor([2 / width, 2 / height]).view(1, 2, 1, 1)
    for k in range(count):
        pixels = ((frame[0].permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"frame_{k:04d}.png")
        flow = moving_textures(1, height, width, max_flow=2.0, seed=100 + k)[0][2]
        grid = pixel_grid_centres(height, width) + (flow * scale).permute(0, 2, 3, 1)
        frame = F.grid_sample(frame, grid, padding_mode="border", align_corners=False)


def _size(text: str) -> tuple[int, int]:
    height, _, width = text.lower().partition("x")
    return int(height), int(width)


def read_resume(path: Path, world_size: int) -> dict[str, Any]:
    """The checkpoint to resume from; ``SystemExit`` with one line when it is missing, not a
    checkpoint of this recipe, or was saved by another world size."""
    if not path.is_file():
        raise SystemExit(f"qat_torchrun: --resume {path} does not exist")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"qat_torchrun: --resume {path} is not a checkpoint of this recipe")
    if saved["world_size"] != world_size:
        raise SystemExit(
            f"qat_torchrun: --resume {path} was saved by {saved['world_size']} processes, this "
            f"run has {world_size}: resume with --nproc-per-node {saved['world_size']} (the "
            "sampler's shards, and so every batch, follow the world size)"
        )
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=Path, required=True)
    parser.add_argument(
        "--make-frames",
        type=int,
        default=0,
        metavar="COUNT",
        help="first write COUNT frames of 80x112 moving textures to --frames",
    )
    parser.add_argument("--out", type=Path, default=Path("artifacts/qat-torchrun"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="per process")
    parser.add_argument("--crop", type=_size, default=(64, 96))
    parser.add_argument(
        "--crop-range",
        default=None,
        metavar="HMIN-HMAXxWMIN-WMAX[/M]",
        help="prepare for this range of sizes (export at any size in it)",
    )
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--target", choices=("xnnpack", "vgf"), default="xnnpack")
    parser.add_argument("--export", type=_size, default=None, metavar="HxW")
    args = parser.parse_args(argv)  # fmt: skip

    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    saved = read_resume(args.resume, world_size) if args.resume is not None else None

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from etkit_exporter import qat_prepare
    from etkit_exporter.export.sizes import parse_dynamic_size

    if args.make_frames and rank == 0:
        make_frames(args.frames, args.make_frames, 80, 112)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    try:
        dist.barrier()  # the frames are written
        model, _ = make()
        data = FramePairs(args.frames, args.crop)
        calibration = [tuple(x.unsqueeze(0) for x in data[k]) for k in range(min(4, len(data)))]
        crop_range = parse_dynamic_size(args.crop_range) if args.crop_range else None
        prepared = qat_prepare(  # the same on every rank: same model, frames and options
            model, calibration[0], target=args.target, calibration=calibration,
            dynamic_size=crop_range,
        )  # fmt: skip
        if saved is not None:
            prepared.load_state_dict(saved["state_dict"], strict=True)
        prepared.to(device)
        ddp = DistributedDataParallel(prepared, device_ids=[local_rank] if cuda else None)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
        step = 0
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            step = int(saved["step"])
        sampler = DistributedSampler(data, world_size, rank, shuffle=True, seed=0, drop_last=True)
        per_epoch = len(sampler) // args.batch
        if per_epoch < 1:
            raise SystemExit(
                f"qat_torchrun: {len(data)} pairs give each of {world_size} processes fewer "
                f"than one batch of {args.batch}"
            )
        ddp.train()
        while step < args.steps:
            epoch, skip = divmod(step, per_epoch)
            sampler.set_epoch(epoch)
            data.epoch = epoch
            loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
            for k, (frame0, frame1) in enumerate(loader):
                if k < skip:
                    continue  # (a resumed epoch: the batches already trained)
                if step >= args.steps:
                    break
                frame0, frame1 = frame0.to(device), frame1.to(device)
                loss = F.l1_loss(ddp(frame0, frame1), frame1)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if rank == 0 and step % 10 == 0:
                    print(f"step {step}: L1 {float(loss.detach()):.4f}", flush=True)
                if step % args.checkpoint_every == 0 and rank == 0:
                    checkpoint = {
                        "format": CHECKPOINT_FORMAT, "state_dict": prepared.state_dict(),
                        "optimizer": optimizer.state_dict(), "step": step,
                        "world_size": world_size,
                    }  # fmt: skip
                    args.out.mkdir(parents=True, exist_ok=True)
                    torch.save(checkpoint, args.out / f"checkpoint-{step}.pt")
                    (args.out / f"checkpoint-{step}.pt").replace(args.out / "checkpoint.pt")
                    print(f"step {step}: checkpoint {args.out / 'checkpoint.pt'}", flush=True)
        dist.barrier()
        if rank == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            torch.save(prepared.state_dict(), args.out / "trained.pt")
            print(f"trained {step} steps on {world_size} processes: {args.out / 'trained.pt'}")
            if args.export is not None:
                _export(prepared.cpu(), args)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Out without tearing gloo down (its destructor can deadlock at exit: see the exporter's
    # tests/qat_ddp_export_worker.py); every rank is past the last barrier.
    sys.stdout.flush()
    os._exit(0)


def _export(prepared: Any, args: argparse.Namespace) -> None:
    from etkit_exporter import export_model

    frames = FramePairs(args.frames, args.export)
    example = tuple(x.unsqueeze(0) for x in frames[0])
    prepared.eval()
    result = export_model(
        prepared, example, target=args.target, verify=True,
        artifacts_root=args.out / args.target, force=True,
    )  # fmt: skip
    verdict = (result.verification or {}).get("verdict", {}).get("result")
    for row in (result.verification or {}).get("qat_model", []):
        share = 100 * row["fraction_off"]
        print(f"program vs the QAT model's eval forward at {args.export[0]}x{args.export[1]}: "
              f"{row['max_steps']} steps max ({share:.3f} % of values off)")  # fmt: skip
    print(f"verification: {verdict}; exported to {result.artifacts_root}")


if __name__ == "__main__":
    sys.exit(main())
