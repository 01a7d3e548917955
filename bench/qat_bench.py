"""Quantization-aware training against post-training quantization, on a frame interpolator.

Run on demand (not in CI; 4-6 minutes on one core, 2 of them the float pre-training, which
``--checkpoint`` saves for the next run):

    .venv/bin/python bench/qat_bench.py [--size 32x48] [--train 256] [--pretrain-steps 4000]
        [--pretrain-lr 3e-3] [--finetune-steps 300] [--finetune-lr 2e-4] [--batch 8]
        [--test 16] [--max-flow 3] [--channels 16] [--checkpoint ckpt.pt] [--out qat-bench.json]

One network (``InterpNet``, shaped like RIFE's IFBlock: four dilated 3x3 convs over both frames;
one conv writes the flow, divided by ``DIV_FLOW`` as FlowNet and PWC-Net predict it, and a blend
mask's logit, so both share one int8 scale and the flow's steps are coarse; frame 0 warped
forward by half the flow, frame 2 back by half, blended by the mask) is trained in float from
scratch to convergence (Adam, its learning rate annealed to 0 on a cosine) on moving textures
with pixel-level detail and a known flow (``triplets``: frame 0, the true middle frame and
frame 2, the texture sampled at ``p + t * flow(p)``; the flow supervised too) into one float
checkpoint (``--checkpoint``: loaded when the file exists, else trained and saved there); then,
from that checkpoint, the same fine-tuning steps (Adam at a fifteenth of the pre-training's
rate, annealed the same way; the same batches; the L1 error of the interpolated frame) four
ways:

- ``float``: in float; exported without quantization (XNNPACK, float32);
- ``ptq``: the float variant's model quantized after training by ``export_model`` (calibrated
  on 16 training pairs);
- ``qat-exact``: ``etkit_exporter.qat_prepare`` (XNNPACK's quantizer for QAT, the calibrated
  qspecs, etkit's exact integer sampler at both warps), trained, exported with ``export_model``
  (nothing re-calibrated);
- ``qat-float-sampler``: the same with ``exact_samplers=False``: PyTorch's float ``grid_sample``
  between the fake quantizes, as Arm's Model Gym trains.

The QAT variants train at ``--batch`` pairs per step and are exported at batch 1 (a batch-1
module from ``qat_prepare`` on the same frames with the trained ``state_dict`` loaded, as
``--qat-checkpoint`` does). Each program is verified and run in ``executorch.runtime`` on
``--test`` held-out triplets. The table: the PSNR of its interpolated frame against the true
middle frame (peak 2, frames in [-1, 1]; mean over the triplets) and, for the QAT variants, in
SNORM8 output steps (max, share of values a step or more off) against the model that was
trained (its eval forward, batch 1): the program; that model with the program's sampler in
place of its own (etkit's integer kernel, ``use_exact_samplers`` on a copy); the quantized model
the program was lowered from (``convert_qat``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def pixel_centres(height: int, width: int) -> torch.Tensor:
    ys = (torch.arange(height, dtype=torch.float32) * 2 + 1) / height - 1
    xs = (torch.arange(width, dtype=torch.float32) * 2 + 1) / width - 1
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


DIV_FLOW = 20.0
"""The head writes the flow divided by this (FlowNet's and PWC-Net's ``div_flow``), beside the
mask's logit in one tensor (RIFE's IFBlock): one int8 scale for both."""


class InterpNet(torch.nn.Module):
    """Frame interpolation shaped like RIFE's IFBlock: a few full-resolution convs (dilated, for
    a reach of 10 pixels) read both frames; one conv writes the flow (in pixels, x then y) and a
    blend mask's logit together; frame 0 is warped forward by half the flow, frame 2 back by
    half, and the mask blends them."""

    def __init__(self, height: int, width: int, channels: int = 24) -> None:
        super().__init__()
        c = channels
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(6, c, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(c, c, 3, padding=2, dilation=2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(c, c, 3, padding=4, dilation=4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(c, c, 3, padding=2, dilation=2),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Conv2d(c, 3, 3, padding=1)  # flow x, flow y, mask logit
        self.register_buffer("base", pixel_centres(height, width))
        self.register_buffer("to_grid", torch.tensor([2 / width, 2 / height]))

    def flow_and_mask(
        self, frame0: torch.Tensor, frame2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The flow from frame 0 to frame 2 in pixels (N x 2 x H x W) and the mask's logit."""
        out = self.head(self.features(torch.cat([frame0, frame2], 1)))
        return out[:, :2] * DIV_FLOW, out[:, 2:]

    def forward(self, frame0: torch.Tensor, frame2: torch.Tensor) -> torch.Tensor:
        flow, logit = self.flow_and_mask(frame0, frame2)
        half = flow.permute(0, 2, 3, 1) * self.to_grid * 0.5
        ahead = F.grid_sample(frame0, self.base + half, padding_mode="border", align_corners=False)
        back = F.grid_sample(frame2, self.base - half, padding_mode="border", align_corners=False)
        mask = torch.sigmoid(logit)
        return back + mask * (ahead - back)


def triplets(
    count: int, height: int, width: int, max_flow: float, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``count`` (frame 0, true middle frame, frame 2, flow), each frame 1 x 3 x H x W in
    [-1, 1], the flow 1 x 2 x H x W in pixels (x then y): a random texture (noise at full
    size, 1/2, 1/4 and 1/8 of it: detail at the pixel level, where a sub-pixel error in the
    flow shows) sampled at ``p + t * flow(p)``, t = 0,
    0.5, 1, where ``flow`` is a random translation plus a gentle field, up to ``max_flow`` px."""
    generator = torch.Generator().manual_seed(seed)
    base = pixel_centres(height, width)
    scale = torch.tensor([2 / width, 2 / height]).view(1, 2, 1, 1)
    samples = []
    for _ in range(count):
        texture = torch.zeros(1, 3, height, width)
        for factor, weight in ((1, 0.3), (2, 0.8), (4, 0.6), (8, 0.4)):
            noise = torch.randn(1, 3, height // factor, width // factor, generator=generator)
            if factor > 1:
                noise = F.interpolate(noise, (height, width), mode="bicubic")
            texture += weight * noise
        texture = torch.tanh(texture)
        shift = (torch.rand(1, 2, 1, 1, generator=generator) * 2 - 1) * 0.75 * max_flow
        field = (torch.rand(1, 2, 3, 4, generator=generator) * 2 - 1) * 0.25 * max_flow
        flow = shift + F.interpolate(field, (height, width), mode="bilinear", align_corners=True)
        frames = [
            F.grid_sample(
                texture,
                base + (t * flow * scale).permute(0, 2, 3, 1),
                padding_mode="border",
                align_corners=False,
            )
            for t in (0.0, 0.5, 1.0)
        ]
        samples.append((frames[0], frames[1], frames[2], flow))
    return samples


def batches(
    data: list[tuple[torch.Tensor, ...]], size: int, steps: int, seed: int
) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        pick = torch.randint(len(data), (size,), generator=generator).tolist()
        out.append(tuple(torch.cat([data[k][i] for k in pick]) for i in range(4)))
    return out


def train(
    model: torch.nn.Module, steps: list[Any], lr: float, flow_weight: float = 0.0
) -> list[float]:
    """Adam on the L1 error of the interpolated frame (plus, with ``flow_weight``, of the flow:
    the float pre-training, which knows the true flow), its learning rate annealed from ``lr``
    to 0 on a cosine over the steps."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, len(steps))
    losses = []
    for frame0, middle, frame2, flow in steps:
        loss = F.l1_loss(model(frame0, frame2), middle)
        if flow_weight:
            predicted, _ = model.flow_and_mask(frame0, frame2)
            loss = loss + flow_weight * F.l1_loss(predicted, flow)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    return losses


class Steps:
    """Output steps between two models over the test set: the max, and the share of values a
    step or more apart."""

    def __init__(self) -> None:
        self.max, self.share = 0, 0.0

    def add(self, got: torch.Tensor, want: torch.Tensor, scale: float) -> None:
        diff = torch.round((got - want).abs() / scale)
        self.max = max(self.max, int(diff.max()))
        self.share += float((diff > 0).float().mean())

    def as_dict(self, count: int) -> dict[str, float]:
        return {"max_steps": self.max, "fraction_off": self.share / count}

    @staticmethod
    def text(values: dict[str, float]) -> str:
        return f"{values['max_steps']} steps max, {100 * values['fraction_off']:.2f} % off"


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float((a.float() - b.float()).square().mean())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def run_program(result: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    from etkit_exporter.core.io_params import float_output, program_input
    from etkit_exporter.programs.runtime import runtime_method

    io = result.io_quant_params
    method = runtime_method(result.pte_path)
    args = [program_input(x, e) for x, e in zip(inputs, io["inputs"], strict=True)]
    (out,) = method.execute(args)
    return float_output(out, io["outputs"][0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="32x48")
    parser.add_argument("--train", type=int, default=256, help="training triplets")
    parser.add_argument("--pretrain-steps", type=int, default=4000)
    parser.add_argument("--pretrain-lr", type=float, default=3e-3)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--finetune-lr", type=float, default=2e-4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--test", type=int, default=16)
    parser.add_argument("--max-flow", type=float, default=3.0)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument(
        "--checkpoint", type=Path,
        help="the float checkpoint: loaded when the file exists, else trained and saved there",
    )  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.size.split("x"))

    from etkit_exporter import export_model, qat_prepare
    from etkit_exporter.export.qat import load_qat_checkpoint
    from etkit_gridsampler.qat import use_exact_samplers

    start = time.perf_counter()
    torch.manual_seed(0)
    data = triplets(args.train, height, width, args.max_flow, seed=1)
    test = triplets(args.test, height, width, args.max_flow, seed=2)
    calibration = [(f0, f2) for f0, _, f2, _ in data[:16]]
    example = (test[0][0], test[0][2])

    model = InterpNet(height, width, args.channels)
    if args.checkpoint is not None and args.checkpoint.is_file():
        model.load_state_dict(torch.load(args.checkpoint, weights_only=True))
        print(f"float checkpoint: {args.checkpoint}", flush=True)
    else:
        pre = train(
            model, batches(data, args.batch, args.pretrain_steps, seed=3), args.pretrain_lr, 0.5
        )
        model.eval()
        print(f"float checkpoint: {args.pretrain_steps} steps, loss {pre[0]:.4f} -> "
              f"{pre[-1]:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        if args.checkpoint is not None:
            torch.save(model.state_dict(), args.checkpoint)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    finetune = batches(data, args.batch, args.finetune_steps, seed=4)
    batch_example = tuple(torch.cat([s[i] for s in data[: args.batch]]) for i in (0, 2))
    batch_calibration = [batch_example]
    single_calibration = [
        (batch_example[0][k : k + 1], batch_example[1][k : k + 1]) for k in range(args.batch)
    ]

    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="etkit-qat-bench-") as scratch:
        root = Path(scratch)

        def export(name: str, trained: torch.nn.Module, **options: Any) -> Any:
            return export_model(
                trained, example, target="xnnpack", artifacts_root=root / name, verify=True,
                **options,
            )  # fmt: skip

        # float, then PTQ of the same fine-tuned float model
        floating = InterpNet(height, width, args.channels)
        floating.load_state_dict(checkpoint)
        t = time.perf_counter()
        losses = train(floating, finetune, lr=args.finetune_lr)
        floating.eval()
        rows["float"] = {"loss": [losses[0], losses[-1]], "train_s": time.perf_counter() - t}
        print(f"float: {args.finetune_steps} steps in {rows['float']['train_s']:.0f} s, L1 "
              f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)  # fmt: skip
        rows["float"]["result"] = export("float", floating, enable_pt2e_quantization=False)
        rows["ptq"] = {"loss": rows["float"]["loss"], "train_s": 0.0}
        rows["ptq"]["result"] = export("ptq", floating, calibration=calibration)

        for name, exact in (("qat-exact", True), ("qat-float-sampler", False)):
            net = InterpNet(height, width, args.channels)
            net.load_state_dict(checkpoint)
            # qat_prepare calibrates on its samples, shaped as its example inputs: the training
            # module takes a batch, the exported one a frame pair (same qspecs: the same data)
            prepared = qat_prepare(
                net, batch_example, target="xnnpack", calibration=batch_calibration,
                exact_samplers=exact,
            )  # fmt: skip
            t = time.perf_counter()
            losses = train(prepared, finetune, lr=args.finetune_lr)
            rows[name] = {"loss": [losses[0], losses[-1]], "train_s": time.perf_counter() - t}
            one = qat_prepare(  # the same frames one by one: the same qspecs, state names
                InterpNet(height, width, args.channels), example, target="xnnpack",
                calibration=single_calibration, exact_samplers=exact,
            )  # fmt: skip
            ckpt = root / f"{name}.pt"
            torch.save(prepared.state_dict(), ckpt)
            load_qat_checkpoint(one, ckpt)
            one.eval()
            rows[name]["trained"] = one
            rows[name]["result"] = export(name, one)
            print(f"{name}: {args.finetune_steps} steps in {rows[name]['train_s']:.0f} s, L1 "
                  f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)  # fmt: skip

        for row in rows.values():
            result = row.pop("result")
            trained = row.pop("trained", None)
            scale = result.io_quant_params["outputs"][0]["scale"]
            # What the trained model computes with the program's sampler in place of its own
            # (exact: its own; float sampler: etkit's integer kernel), and the quantized model
            # the program was lowered from (convert_qat's).
            with_kernel = copy.deepcopy(trained) if trained is not None else None
            if with_kernel is not None:
                use_exact_samplers(with_kernel)
                with_kernel.eval()
            scores: list[float] = []
            apart: dict[str, Steps] = {k: Steps() for k in ("program", "sampler", "quantized")}
            for f0, middle, f2, _ in test:
                got = run_program(result, (f0, f2))
                scores.append(psnr(got, middle))
                if trained is None or with_kernel is None:
                    continue
                with torch.no_grad():
                    want = trained(f0, f2)
                    apart["sampler"].add(with_kernel(f0, f2), want, scale)
                    apart["quantized"].add(result.converted_model(f0, f2), want, scale)
                apart["program"].add(got.reshape(want.shape), want, scale)
            row["psnr_db"] = sum(scores) / len(scores)
            if trained is not None:
                row.update({f"{k}_vs_trained": v.as_dict(len(test)) for k, v in apart.items()})
            verdict = (result.verification or {}).get("verdict", {})
            row["verified"] = verdict.get("result")

    print()
    print(
        "| variant | PSNR vs true middle frame | program vs the model trained | the model "
        "trained with the program's sampler | quantized model vs the model trained |"
    )
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        cells = [
            Steps.text(row[f"{k}_vs_trained"]) if f"{k}_vs_trained" in row else "-"
            for k in ("program", "sampler", "quantized")
        ]
        print(f"| {name} | {row['psnr_db']:.2f} dB | " + " | ".join(cells) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s in all")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
