"""Random recurrent grid-sampling models (issue 54's sequence fuzz): a state carried across
frames through a warp, a blend and a conv, in the two ways users write one.

``generate(seed)`` draws a ``Spec``: channels (1, 3, 4 or 16), an odd size, batch 1 or 2, how
the state is warped (a flow a conv predicts from the frame and the state, a flow given as an
input, an affine theta a small head predicts), how it is blended (a fixed weight, or a gate a
conv predicts), an optional conv refining the state, what the model returns besides its state
(the state itself as the image, a conv of it, a 1-channel depth, logits), and whether the state
is a buffer written with ``copy_`` or an input returned as an output (named with ``state=``).
``build(spec)`` makes the module, its example inputs, ``state=`` (or None) and a moving
sequence of frames. Everything from a seed: the same seed, the same model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Spec:
    seed: int
    channels: int
    height: int
    width: int
    batch: int
    warp: str  # "predicted", "given", "affine"
    blend: str  # "fixed", "gated"
    refine: bool
    output: str  # "state", "conv", "depth", "logits"
    form: str  # "buffer", "explicit"
    align_corners: bool
    padding: str


def generate(seed: int) -> Spec:
    rng = random.Random(seed)
    return Spec(
        seed=seed,
        channels=rng.choice((1, 3, 4, 16)),
        height=rng.choice((11, 17, 24, 29)),
        width=rng.choice((13, 20, 31, 36)),
        batch=rng.choice((1, 1, 2)),
        warp=rng.choice(("predicted", "given", "affine")),
        blend=rng.choice(("fixed", "gated")),
        refine=rng.random() < 0.5,
        output=rng.choice(("state", "conv", "depth", "logits")),
        form=rng.choice(("buffer", "explicit")),
        align_corners=rng.random() < 0.5,
        padding=rng.choice(("zeros", "border")),
    )


def _grid(n: int, height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((gx, gy), -1).unsqueeze(0).expand(n, height, width, 2)


class RecurrentCore(torch.nn.Module):
    """One step: the state warped, blended with the frame, refined; returns the output and the
    new state (``Buffered`` and ``Explicit`` wrap it)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        torch.manual_seed(spec.seed)
        c = spec.channels
        self.spec = spec
        self.flow = torch.nn.Conv2d(2 * c, 2, 3, padding=1)
        self.theta = torch.nn.Linear(2 * c, 6)
        with torch.no_grad():
            self.theta.weight.mul_(0.05)
            self.theta.bias.copy_(torch.tensor([1.0, 0, 0, 0, 1.0, 0]))
        self.gate = torch.nn.Conv2d(2 * c, 1, 3, padding=1)
        self.refine = torch.nn.Conv2d(c, c, 3, padding=1)
        self.head = torch.nn.Conv2d(c, 3 if spec.output == "conv" else 1, 3, padding=1)
        self.logits = torch.nn.Linear(c, 5)

    def step(
        self, frame: torch.Tensor, state: torch.Tensor, flow: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.spec
        n, _, height, width = frame.shape
        both = torch.cat([frame, state], 1)
        if spec.warp == "affine":
            theta = self.theta(both.mean((2, 3))).view(n, 2, 3)
            grid = F.affine_grid(theta, [n, spec.channels, height, width], spec.align_corners)
        else:
            if spec.warp == "predicted" or flow is None:
                flow = torch.tanh(self.flow(both)) * 0.1
            grid = _grid(n, height, width) + flow.permute(0, 2, 3, 1)
        warped = F.grid_sample(
            state, grid, padding_mode=spec.padding, align_corners=spec.align_corners
        )
        if spec.blend == "gated":
            weight = torch.sigmoid(self.gate(both))
            new = weight * warped + (1 - weight) * frame
        else:
            new = 0.75 * warped + 0.25 * frame
        if spec.refine:
            new = new + 0.1 * torch.relu(self.refine(new))
        if spec.output == "state":
            out = torch.clamp(new, -1, 1)
        elif spec.output == "logits":
            out = self.logits(new.mean((2, 3)))
        else:
            out = self.head(new)
        return out, new


class Buffered(torch.nn.Module):
    """The state as a registered buffer written with ``copy_`` (lifted by the export)."""

    def __init__(self, spec: Spec, given_flow: bool) -> None:
        super().__init__()
        self.core = RecurrentCore(spec)
        shape = (spec.batch, spec.channels, spec.height, spec.width)
        self.register_buffer("history", torch.zeros(shape))
        self.given_flow = given_flow

    def forward(self, frame: torch.Tensor, *flow: torch.Tensor) -> torch.Tensor:
        history: torch.Tensor = self.history  # type: ignore[assignment]
        out, new = self.core.step(frame, history, flow[0] if flow else None)
        history.copy_(new)
        return out


class Explicit(torch.nn.Module):
    """The state as an input returned as an output (``state={"history": "new_history"}``)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.core = RecurrentCore(spec)

    def forward(
        self, frame: torch.Tensor, flow: torch.Tensor, history: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        out, new = self.core.step(frame, history, flow)
        return {"out": out, "new_history": new}


def build(
    spec: Spec, frames: int = 16
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, str] | None, list[Any]]:
    """The model, its example inputs, its ``state=`` (None for a buffer) and ``frames`` frames
    of a moving scene (each a tuple of the model's inputs)."""
    generator = torch.Generator().manual_seed(spec.seed)
    n, c, h, w = spec.batch, spec.channels, spec.height, spec.width
    big = torch.rand((n, c, h + 8, w + 8 + frames), generator=generator) * 2 - 1
    scene = F.avg_pool2d(big, 3, 1, 1)
    flow = torch.full((n, 2, h, w), 0.03)
    sequence: list[Any] = []
    for t in range(frames):
        frame = scene[..., 4 : 4 + h, t : t + w].contiguous()
        sequence.append(frame)
    given = spec.warp == "given"
    if spec.form == "buffer":
        model: torch.nn.Module = Buffered(spec, given).eval()
        frames_in = [((f, flow) if given else (f,)) for f in sequence]
        return model, frames_in[0], None, frames_in
    model = Explicit(spec).eval()
    zero = torch.zeros(n, c, h, w)
    frames_in = [(f, flow, zero) for f in sequence]
    return model, frames_in[0], {"history": "new_history"}, frames_in
