"""Quantization-aware training with etkit's exact sampler, then export: a recipe.

    .venv/bin/python apps/exporter/examples/qat_flow_warp.py [--target xnnpack|vgf]
        [--float-steps 150] [--qat-steps 60] [--out artifacts/qat-flow-warp]

The flow-warp demo (two frames -> a small conv net predicts a flow -> frame 0 warped by
``grid_sample`` -> a refining conv) learns to warp frame 0 onto frame 1 on generated data: moving
textures with known flows (``etkit_exporter.export.demos.moving_textures``). Steps:

1. a short float warm-up (the float checkpoint a real project starts from);
2. ``etkit_exporter.qat_prepare``: the model prepared for QAT with the quantizer the export uses
   (the target's base quantizer for QAT, the qspecs chosen from the calibration frames, RGBA
   padding, a dynamic batch), each ``grid_sample`` replaced by etkit's exact integer sampler,
   whose forward is the program's integer kernel and whose backward is float ``grid_sample``'s;
3. QAT fine-tuning in batches of 8; the trained ``state_dict()`` saved (``OUT/trained.pt``) with
   the calibration frames (``OUT/calibration``);
4. the export of the trained module at batch 1, nothing calibrated again, ``export_model`` with
   ``verify=True``. The same export from the command line (``make`` below returns the float
   model and its example frames; the checkpoint holds no constant tied to a batch)::

       etkit-export -m apps/exporter/examples/qat_flow_warp.py:make \\
           --qat-checkpoint OUT/trained.pt --calibration OUT/calibration -t TARGET --verify

It prints the training losses, the program's PSNR against the true frame 1 on held-out frames
(with the float model's and the QAT model's), and how far the program lies from the QAT model's
eval forward (steps of its SNORM8 output).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from etkit_exporter.export.demos import flow_warp, moving_textures

BATCH = 8
HEIGHT, WIDTH = 32, 48


def frames(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (frame 0, frame 1) pairs: a texture, and it moved by a known flow."""
    return [(f0, f1) for f0, f1, _ in moving_textures(count, HEIGHT, WIDTH, seed=seed)]


def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The float model and its example inputs (``etkit-export -m FILE:make``): the checkpoint
    gives the trained values."""
    model, _ = flow_warp()
    return model, frames(1, seed=7)[0]


def batched(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])


def train(model: torch.nn.Module, data: list[Any], steps: int, lr: float) -> list[float]:
    """Adam on the L1 error of the warped frame against frame 1, batches of ``BATCH``."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        pick = torch.randint(len(data), (BATCH,), generator=generator).tolist()
        frame0, frame1 = batched([data[k] for k in pick])
        loss = F.l1_loss(model(frame0, frame1), frame1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float((a - b).square().mean())
    return math.inf if mse == 0 else 10 * math.log10(4 / mse)  # peak 2: frames in [-1, 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("xnnpack", "vgf"), default="xnnpack")
    parser.add_argument("--float-steps", type=int, default=150)
    parser.add_argument("--qat-steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("artifacts/qat-flow-warp"))
    args = parser.parse_args(argv)

    from etkit_exporter import export_model, qat_prepare
    from etkit_exporter.core.io_params import float_output, program_input
    from etkit_exporter.programs import load_program
    from etkit_exporter.programs.runtime import runtime_method

    start = time.perf_counter()
    data, held_out = frames(64, seed=1), frames(8, seed=2)
    calibration = data[:BATCH]  # the frames the ranges start from (and the qspecs come from)

    # 1. the float checkpoint
    model, example = make()
    losses = train(model, data, args.float_steps, lr=2e-3)
    model.eval()
    print(f"float: {args.float_steps} steps, L1 {losses[0]:.4f} -> {losses[-1]:.4f}")

    # 2. prepared for QAT as the export quantizes, etkit's exact sampler in the loop
    prepared = qat_prepare(model, example, target=args.target, calibration=calibration)
    # 3. QAT fine-tuning; the checkpoint and the calibration frames saved
    losses = train(prepared, data, args.qat_steps, lr=5e-4)
    print(f"QAT:   {args.qat_steps} steps, L1 {losses[0]:.4f} -> {losses[-1]:.4f}")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(prepared.state_dict(), args.out / "trained.pt")
    (args.out / "calibration").mkdir(exist_ok=True)
    for k, pair in enumerate(calibration):
        torch.save(pair, args.out / "calibration" / f"sample_{k}.pt")

    # 4. export: the trained module at batch 1
    single = prepared.eval()
    result = export_model(
        single, example, target=args.target, verify=True,
        artifacts_root=args.out / args.target, force=True,
    )  # fmt: skip

    io = result.io_quant_params
    if args.target == "xnnpack":
        method = runtime_method(result.pte_path)
        run = lambda xs: list(method.execute(xs))  # noqa: E731
    else:
        program = load_program(result.pte_path)
        run = lambda xs: list(program.run(xs).outputs)  # noqa: E731
    scores: dict[str, float] = {"float model": 0.0, "QAT model": 0.0, "program": 0.0}
    for frame0, frame1 in held_out[:4]:
        with torch.no_grad():
            scores["float model"] += psnr(model(frame0, frame1), frame1) / 4
            qat_out = single(frame0, frame1)
        scores["QAT model"] += psnr(qat_out, frame1) / 4
        args_q = [program_input(x, e) for x, e in zip((frame0, frame1), io["inputs"], strict=True)]
        got = float_output(run(args_q)[0], io["outputs"][0]).reshape(qat_out.shape)
        scores["program"] += psnr(got, frame1) / 4
    print("PSNR against the true frame 1 (4 held-out pairs): " + ", ".join(
        f"{name} {value:.2f} dB" for name, value in scores.items()
    ))  # fmt: skip
    for row in (result.verification or {}).get("qat_model", []):
        share = 100 * row["fraction_off"]
        print(f"program vs the QAT model's eval forward, output {row['output']}: "
              f"{row['max_steps']} steps max ({share:.2f} % of values off)")  # fmt: skip
    verdict = (result.verification or {}).get("verdict", {}).get("result")
    print(f"verification: {verdict}; exported to {result.artifacts_root} in "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    print(
        "the same export from the command line:\n  etkit-export -m "
        f"{Path(__file__).resolve()}:make --qat-checkpoint {args.out / 'trained.pt'} "
        f"--calibration {args.out / 'calibration'} -t {args.target} --verify -o OUT"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
