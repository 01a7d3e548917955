"""A model fuzzer for etkit: differential testing of generated grid-sampling models, in the
manner of Csmith for C compilers and NNSmith for deep-learning compilers.

- ``generate(seed)``: a small valid grid-sampling model as data (``Spec``), the same for the same
  seed: 1-3 inputs (images of 1..16 channels, batch 1 or 2, odd small sizes; grids; flows in
  pixels), grids made by ``affine_grid``, RIFE's flow-to-grid arithmetic, a grid input or a
  2-channel conv output permuted; around 1-3 samplers (the same image twice, a sampler feeding
  another, the grid computed before the image; every mode, padding and ``align_corners``):
  convs (1x1, 3x3, depthwise), activations, add/mul/sub, cat of warped and unwarped features,
  channel slices, pooling, interpolate, pad; 1-2 outputs (images, logits, flows, grids, depth).
- ``render(spec)``: the model as a standalone Python file (``ModelUnderTest`` and
  ``ModelInputs``, which ``etkit-export -m FILE.py`` reads), with no dependency on this module;
  ``build(spec)`` makes the model by running that very source, so a written repro is the model
  that failed.
- ``classify(spec, target, workdir)``: exports with ``export_model(..., verify=True)`` and says
  what happened: ``verified``, ``refused`` (a ``ValueError``/``TypeError`` with a one-line
  message before any stage ran), ``failed_verification`` (``etkit_exporter.VerificationError``;
  where etkit has no verdict yet, an output under ``STAND_IN_PSNR_DB`` against the quantized
  PT2E model) or ``crashed`` (anything else, a failing stage's ``ExportError`` included).
- ``shrink(spec, still_fails)``: fewer ops, fewer outputs and inputs, smaller shapes and
  plainer parameters, while ``still_fails`` holds; ``write_repro`` writes the file and the one
  command that reproduces it.

``bench/fuzz.py`` runs it on demand; ``test_fuzz.py`` runs a fixed set of seeds in the suite.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TARGETS = ("xnnpack", "vgf")

# Until etkit judges its own verification (``etkit_exporter.VerificationError``), an output
# this far from the quantized PT2E model fails it: the bar of the acceptance tests.
STAND_IN_PSNR_DB = 40.0

OUTCOMES = ("verified", "refused", "failed_verification", "crashed")


# -- the model as data -------------------------------------------------------------------------


@dataclass
class Input:
    """A model input. ``kind``: image (N x C x H x W, values in [lo, hi]), grid (N x H x W x 2,
    normalized), flow (N x 2 x H x W, pixels)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    seed: int
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Op:
    """One step of the forward: ``out = kind(*args, **params)``."""

    kind: str
    args: list[str]
    out: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Spec:
    seed: int
    inputs: list[Input]
    ops: list[Op]
    outputs: list[str]

    def copy(self) -> Spec:
        return copy.deepcopy(self)

    def counts(self) -> str:
        samplers = sum(op.kind == "sample" for op in self.ops)
        return (
            f"{len(self.inputs)} inputs, {len(self.ops)} ops, {samplers} samplers, "
            f"{len(self.outputs)} outputs"
        )


class InvalidSpecError(Exception):
    """A spec that is not a valid model (shapes do not fit)."""


# -- shapes ------------------------------------------------------------------------------------

Value = tuple[str, tuple[int, ...]]  # kind, shape


def infer(spec: Spec) -> dict[str, Value]:
    """The kind and shape of every value, or ``InvalidSpecError``."""
    values: dict[str, Value] = {}
    for item in spec.inputs:
        values[item.name] = (item.kind, item.shape)
    for op in spec.ops:
        for arg in op.args:
            if arg not in values:
                raise InvalidSpecError(f"{op.out}: unknown argument {arg}")
        values[op.out] = _infer_op(op, [values[a] for a in op.args])
    batches = {shape[0] for _, shape in values.values()}
    if len(batches) != 1:
        raise InvalidSpecError(f"batch sizes differ: {sorted(batches)}")
    for name in spec.outputs:
        if name not in values:
            raise InvalidSpecError(f"unknown output {name}")
    if not spec.outputs:
        raise InvalidSpecError("no outputs")
    return values


def _need(condition: bool, why: str) -> None:
    if not condition:
        raise InvalidSpecError(why)


def _infer_op(op: Op, args: list[Value]) -> Value:
    kinds = [kind for kind, _ in args]
    p = op.params
    if op.kind in ("conv", "act", "slice", "pool", "interp", "pad", "depth", "resize_like"):
        _need(kinds[0] == "image", f"{op.kind} takes an image")
        n, c, h, w = args[0][1]
    if op.kind == "conv":
        return "image", (n, c if p["dw"] else p["cout"], h, w)
    if op.kind == "act":
        return args[0]
    if op.kind == "binary":
        _need(kinds == ["image", "image"] and args[0][1] == args[1][1], "binary: shapes differ")
        return args[0]
    if op.kind == "cat":
        _need(all(k == "image" for k in kinds), "cat takes images")
        shapes = [s for _, s in args]
        _need(len({(s[0], s[2], s[3]) for s in shapes}) == 1, "cat: sizes differ")
        n, _, h, w = shapes[0]
        return "image", (n, sum(s[1] for s in shapes), h, w)
    if op.kind == "slice":
        start, stop = _slice_bounds(p, c)
        return "image", (n, stop - start, h, w)
    if op.kind == "pool":
        _need(h >= 2 and w >= 2, "pool: too small")
        return "image", (n, c, h // 2, w // 2)
    if op.kind == "interp":
        size = (int(h * p["scale"]), int(w * p["scale"]))
        _need(min(size) >= 1, "interp: too small")
        return "image", (n, c, *size)
    if op.kind == "resize_like":
        return "image", (n, c, *op.params["size"])
    if op.kind == "pad":
        left, right, top, bottom = p["pad"]
        if p["mode"] == "reflect":
            _need(max(left, right) < w and max(top, bottom) < h, "pad: reflect too wide")
        return "image", (n, c, h + top + bottom, w + left + right)
    if op.kind == "depth":
        return "image", (n, 1, h, w)
    if op.kind == "flow_head":
        _need(kinds[0] == "image", "flow_head takes an image")
        n, _, h, w = args[0][1]
        return "flow", (n, 2, h, w)
    if op.kind == "affine_grid":
        _need(kinds[0] == "image", "affine_grid takes an image")
        n = args[0][1][0]
        height, width = p["size"] if p["size"] else args[0][1][2:]
        return "grid", (n, height, width, 2)
    if op.kind == "flow_grid":
        _need(kinds[0] == "flow", "flow_grid takes a flow")
        n, _, h, w = args[0][1]
        _need(h >= 2 and w >= 2, "flow_grid: too small")
        return "grid", (n, h, w, 2)
    if op.kind == "conv_grid":
        _need(kinds[0] == "image", "conv_grid takes an image")
        n, _, h, w = args[0][1]
        return "grid", (n, h, w, 2)
    if op.kind == "sample":
        _need(kinds == ["image", "grid"], "sample takes an image and a grid")
        (n, c, _, _), (ng, ho, wo, _) = args[0][1], args[1][1]
        _need(n == ng, "sample: batches differ")
        return "image", (n, c, ho, wo)
    if op.kind == "logits":
        _need(kinds[0] == "image", "logits take an image")
        return "logits", (args[0][1][0], p["classes"])
    raise InvalidSpecError(f"unknown op {op.kind}")


def _slice_bounds(params: dict[str, Any], channels: int) -> tuple[int, int]:
    start = min(params["start"], channels - 1)
    return start, max(start + 1, min(params["stop"], channels))


# -- the generator -----------------------------------------------------------------------------

SAMPLE_MODES = ("bilinear", "nearest", "bicubic")
PADDINGS = ("zeros", "border", "reflection")


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.inputs: list[Input] = []
        self.ops: list[Op] = []
        self.kinds: dict[str, Value] = {}
        self.used: set[str] = set()
        self.counter = 0

    def name(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def sub_seed(self) -> int:
        return self.rng.randrange(1 << 30)

    def add_input(self, kind: str, shape: tuple[int, ...], **params: Any) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(Input(name, kind, shape, self.sub_seed(), params))
        self.kinds[name] = (kind, shape)
        return name

    def add(self, kind: str, args: list[str], **params: Any) -> str:
        op = Op(kind, list(args), self.name(), params)
        value = _infer_op(op, [self.kinds[a] for a in args])
        self.ops.append(op)
        self.kinds[op.out] = value
        self.used.update(args)
        return op.out

    def of(self, kind: str) -> list[str]:
        return [name for name, (k, _) in self.kinds.items() if k == kind]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.kinds[name][1]

    def channels(self) -> int:
        return self.rng.choice([1, 2, 3, 4, 4, 8, 16, self.rng.randint(1, 16)])

    def size(self) -> tuple[int, int]:
        return self.rng.randint(3, 20), self.rng.randint(3, 20)

    # -- ops around the samplers

    def image_op(self, image: str) -> str:
        rng = self.rng
        n, c, h, w = self.shape(image)
        choice = rng.choice(
            ["conv", "conv", "dwconv", "act", "act", "binary", "slice", "pool", "interp", "pad"]
        )
        if choice == "conv":
            return self.add(
                "conv", [image], cout=self.channels(), k=rng.choice([1, 3]), dw=False,
                seed=self.sub_seed(),
            )  # fmt: skip
        if choice == "dwconv":
            return self.add("conv", [image], cout=c, k=3, dw=True, seed=self.sub_seed())
        if choice == "act":
            return self.add("act", [image], fn=rng.choice(["relu", "clamp", "tanh", "sigmoid"]))
        if choice == "binary":
            partner = [v for v in self.of("image") if v != image and self.shape(v) == (n, c, h, w)]
            other = rng.choice(partner) if partner else self.image_op(image)
            if self.shape(other) != (n, c, h, w):
                return other
            return self.add("binary", [image, other], fn=rng.choice(["add", "mul", "sub"]))
        if choice == "slice" and c >= 2:
            start = rng.randrange(c - 1)
            return self.add("slice", [image], start=start, stop=rng.randint(start + 1, c))
        if choice == "pool" and h >= 4 and w >= 4:
            return self.add("pool", [image], fn=rng.choice(["avg", "max"]))
        if choice == "interp" and h * w <= 200:
            return self.add(
                "interp", [image], scale=rng.choice([2, 0.5] if min(h, w) >= 4 else [2]),
                mode=rng.choice(["nearest", "bilinear"]), ac=rng.random() < 0.5,
            )  # fmt: skip
        if choice == "pad":
            mode = rng.choice(["constant", "replicate", "reflect"])
            pads = tuple(rng.randint(0, 2) for _ in range(4))
            if mode == "reflect":
                pads = tuple(min(p, h - 1 if k >= 2 else w - 1) for k, p in enumerate(pads))
            return self.add("pad", [image], pad=pads, mode=mode)
        return self.add("act", [image], fn=rng.choice(["relu", "tanh"]))

    def image_ops(self, image: str, most: int) -> str:
        for _ in range(self.rng.randint(0, most)):
            image = self.image_op(image)
        return image

    # -- grids

    def grid_for(self, image: str) -> str:
        rng = self.rng
        unused_grids = [g for g in self.of("grid") if g not in self.used]
        unused_flows = [f for f in self.of("flow") if f not in self.used]
        if unused_grids and rng.random() < 0.7:
            return unused_grids[0]
        if unused_flows and rng.random() < 0.8:
            return self.add("flow_grid", [unused_flows[0]], ac=rng.random() < 0.5)
        choice = rng.choice(["affine", "flow", "conv", "conv"])
        source = rng.choice(self.of("image"))
        _, _, h, w = self.shape(source)
        if choice == "affine":
            size = None if rng.random() < 0.5 else self.size()
            return self.add(
                "affine_grid", [source], size=size, ac=rng.random() < 0.5, seed=self.sub_seed()
            )
        if choice == "flow" and h >= 2 and w >= 2:
            flow = self.add(
                "flow_head", [source], k=rng.choice([1, 3]), scale=rng.choice([1.0, 2.0, 4.0]),
                seed=self.sub_seed(),
            )  # fmt: skip
            return self.add("flow_grid", [flow], ac=rng.random() < 0.5)
        return self.add(
            "conv_grid", [source], k=rng.choice([1, 3]), squash=rng.choice(["tanh", "scale"]),
            seed=self.sub_seed(),
        )  # fmt: skip


def generate(seed: int) -> Spec:
    """A small valid grid-sampling model, the same for the same seed."""
    g = _Gen(seed)
    rng = g.rng
    batch = 2 if rng.random() < 0.25 else 1
    height, width = g.size()
    g.add_input(
        "image", (batch, g.channels(), height, width), lo=rng.choice([-1.0, -1.0, 0.0]), hi=1.0
    )
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        kind = rng.choice(["image", "image", "grid", "flow"])
        if kind == "image":
            same = rng.random() < 0.5
            c = g.inputs[0].shape[1] if same else g.channels()
            h, w = (height, width) if same or rng.random() < 0.5 else g.size()
            g.add_input("image", (batch, c, h, w), lo=rng.choice([-1.0, 0.0]), hi=1.0)
        elif kind == "grid":
            h, w = g.size() if rng.random() < 0.5 else (height, width)
            g.add_input(
                "grid", (batch, h, w, 2), style=rng.choice(["identity", "uniform"]),
                reach=rng.choice([1.0, 1.0, 1.2]),
            )  # fmt: skip
        else:
            g.add_input("flow", (batch, 2, height, width), pixels=rng.choice([1.0, 3.0]))
    warped: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        grid_first = rng.random() < 0.3
        pick = rng.random()
        if warped and pick < 0.3:
            image = warped[-1]  # a sampler feeding another
        elif warped and pick < 0.5:
            image = next(op.args[0] for op in g.ops if op.kind == "sample")  # the same image
        else:
            image = rng.choice([v for v in g.of("image") if v not in warped])
        if grid_first:
            grid = g.grid_for(image)
            image = g.image_ops(image, 2)
        else:
            image = g.image_ops(image, 2)
            grid = g.grid_for(image)
        mode = rng.choices(SAMPLE_MODES, weights=[60, 37, 3])[0]
        out = g.add(
            "sample", [image, grid], mode=mode, padding=rng.choice(PADDINGS),
            ac=rng.random() < 0.5,
        )  # fmt: skip
        if rng.random() < 0.4:  # cat of warped and unwarped features
            same = [
                v for v in g.of("image")
                if v != out and g.shape(v)[2:] == g.shape(out)[2:] and v not in warped
            ]  # fmt: skip
            if same:
                out = g.add("cat", [out, rng.choice(same)])
        warped.append(g.image_ops(out, 2))
    spec = Spec(seed, g.inputs, g.ops, _outputs(g, warped))
    prune(spec)
    infer(spec)
    return spec


def _outputs(g: _Gen, warped: list[str]) -> list[str]:
    """1-2 outputs of any kind; every sampler's result reaches the first."""
    rng = g.rng
    main = warped[0]
    for other in warped[1:]:
        if other in g.used:
            continue
        if g.shape(other)[2:] != g.shape(main)[2:]:
            other = g.add("resize_like", [other], size=g.shape(main)[2:])
        main = g.add("cat", [main, other])
    outputs: list[str] = []
    kinds = rng.sample(["image", "image", "logits", "flow", "grid", "depth"], rng.choice([1, 2]))
    for position, kind in enumerate(kinds):
        if kind == "image" and position == 1 and kinds[0] == "image":
            kind = "depth"
        computed = [v for v in g.of(kind) if not v.startswith("x")] if position == 1 else []
        if computed:  # a flow or grid the model computed on its way, as a second output
            out = computed[-1]
        elif kind == "image":
            out = main
            if rng.random() < 0.7:
                out = g.add(
                    "conv", [main], cout=g.channels(), k=rng.choice([1, 3]), dw=False,
                    seed=g.sub_seed(),
                )  # fmt: skip
                if rng.random() < 0.5:
                    out = g.add("act", [out], fn=rng.choice(["tanh", "sigmoid", "clamp"]))
        elif kind == "logits":
            out = g.add("logits", [main], classes=rng.choice([2, 5, 10]), seed=g.sub_seed())
        elif kind == "depth":
            out = g.add("depth", [main], seed=g.sub_seed())
        elif kind == "flow":
            out = g.add("flow_head", [main], k=3, scale=2.0, seed=g.sub_seed())
        else:
            out = g.add("conv_grid", [main], k=1, squash="tanh", seed=g.sub_seed())
        if out not in outputs:
            outputs.append(out)
    return outputs


def prune(spec: Spec) -> None:
    """Drops the ops and inputs that no output needs."""
    needed = set(spec.outputs)
    for op in reversed(spec.ops):
        if op.out in needed:
            needed.update(op.args)
    spec.ops = [op for op in spec.ops if op.out in needed]
    spec.inputs = [item for item in spec.inputs if item.name in needed]


# -- rendering ---------------------------------------------------------------------------------

_PRELUDE = '''import torch
import torch.nn.functional as F


def _conv(cin, cout, kernel, groups, seed):
    torch.manual_seed(seed)
    return torch.nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups)


def _theta(cin, seed):
    """A localization head: near the identity transform, moved by the features."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(cin, 6)
    with torch.no_grad():
        linear.weight.normal_(0.0, 0.1)
        linear.bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
    return linear


def _linear(cin, cout, seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(cin, cout)


def _flow_to_grid(flow, align_corners):
    """RIFE's warp arithmetic: a flow in pixels (x, y) added to the pixel grid, normalized."""
    n, _, height, width = flow.shape
    if align_corners:
        xs = torch.linspace(-1.0, 1.0, width)
        ys = torch.linspace(-1.0, 1.0, height)
        sx, sy = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    else:
        xs = (torch.arange(width) + 0.5) * (2.0 / width) - 1.0
        ys = (torch.arange(height) + 0.5) * (2.0 / height) - 1.0
        sx, sy = width / 2.0, height / 2.0
    base = torch.cat(
        [xs.view(1, 1, 1, width).expand(n, -1, height, -1),
         ys.view(1, 1, height, 1).expand(n, -1, -1, width)], 1
    )
    normalized = torch.cat([flow[:, 0:1] / sx, flow[:, 1:2] / sy], 1)
    return (base + normalized).permute(0, 2, 3, 1)


def _random(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))
'''


def render(spec: Spec, header: str = "") -> str:
    """The model as a standalone Python file defining ``ModelUnderTest`` and ``ModelInputs``."""
    values = infer(spec)
    modules: list[str] = []
    body: list[str] = []
    for index, op in enumerate(spec.ops):
        module, expression = _render_op(op, index, [values[a] for a in op.args])
        if module:
            modules.append(f"        self.m{index} = {module}")
        body.append(f"        {op.out} = {expression}")
    args = ", ".join(item.name for item in spec.inputs)
    returns = ", ".join(spec.outputs) + ("," if len(spec.outputs) == 1 else "")
    inputs = [f"        {_render_input(item)}," for item in spec.inputs]
    doc = f'"""{header.strip()}"""\n\n' if header.strip() else ""
    return (
        f"{doc}{_PRELUDE}\n\nclass Model(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        + "".join(line + "\n" for line in modules)
        + f"\n    def forward(self, {args}):\n"
        + "".join(line + "\n" for line in body)
        + f"        return ({returns})\n\n\n"
        "ModelUnderTest = Model().eval()\nModelInputs = (\n"
        + "".join(line + "\n" for line in inputs)
        + ")\n"
    )


def _render_input(item: Input) -> str:
    shape, seed, p = item.shape, item.seed, item.params
    if item.kind == "image":
        lo, hi = p["lo"], p["hi"]
        return f"_random({shape}, {seed}) * {hi - lo} + {lo}"
    if item.kind == "flow":
        return f"(_random({shape}, {seed}) * 2 - 1) * {p['pixels']}"
    n, h, w, _ = shape
    if p["style"] == "identity":
        identity = f"torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).expand({n}, 2, 3)"
        return (
            f"(F.affine_grid({identity}, [{n}, 1, {h}, {w}], align_corners=False)"
            f" + (_random({shape}, {seed}) * 2 - 1) * 0.15) * {p['reach']}"
        )
    return f"(_random({shape}, {seed}) * 2 - 1) * {p['reach']}"


def _render_op(op: Op, index: int, args: list[Value]) -> tuple[str, str]:
    p, a, m = op.params, op.args, f"self.m{index}"
    shape = args[0][1]
    if op.kind == "conv":
        c = shape[1]
        cout, groups = (c, c) if p["dw"] else (p["cout"], 1)
        return f"_conv({c}, {cout}, {p['k']}, {groups}, {p['seed']})", f"{m}({a[0]})"
    if op.kind == "act":
        fn = p["fn"]
        expression = {
            "relu": f"F.relu({a[0]})",
            "clamp": f"{a[0]}.clamp(-0.5, 0.75)",
            "tanh": f"torch.tanh({a[0]})",
            "sigmoid": f"torch.sigmoid({a[0]})",
        }[fn]
        return "", expression
    if op.kind == "binary":
        return "", f"{a[0]} {dict(add='+', sub='-', mul='*')[p['fn']]} {a[1]}"
    if op.kind == "cat":
        return "", f"torch.cat([{', '.join(a)}], 1)"
    if op.kind == "slice":
        start, stop = _slice_bounds(p, shape[1])
        return "", f"{a[0]}[:, {start}:{stop}]"
    if op.kind == "pool":
        return "", f"F.{p['fn']}_pool2d({a[0]}, 2)"
    if op.kind in ("interp", "resize_like"):
        if op.kind == "interp":
            size = (int(shape[2] * p["scale"]), int(shape[3] * p["scale"]))
            mode, ac = p["mode"], p["ac"]
        else:
            size, mode, ac = tuple(p["size"]), "bilinear", False
        if tuple(size) == tuple(shape[2:]):
            return "", a[0]
        corners = f", align_corners={ac}" if mode == "bilinear" else ""
        return "", f"F.interpolate({a[0]}, size={tuple(size)}, mode={mode!r}{corners})"
    if op.kind == "pad":
        return "", f"F.pad({a[0]}, {tuple(p['pad'])}, mode={p['mode']!r})"
    if op.kind == "depth":
        return f"_conv({shape[1]}, 1, 3, 1, {p['seed']})", f"torch.sigmoid({m}({a[0]})) * 10.0"
    if op.kind == "flow_head":
        return f"_conv({shape[1]}, 2, {p['k']}, 1, {p['seed']})", f"{m}({a[0]}) * {p['scale']}"
    if op.kind == "affine_grid":
        n, c, h, w = shape
        height, width = p["size"] if p["size"] else (h, w)
        theta = f"{m}(F.adaptive_avg_pool2d({a[0]}, 1).flatten(1)).view(-1, 2, 3)"
        return (
            f"_theta({c}, {p['seed']})",
            f"F.affine_grid({theta}, [{n}, 1, {height}, {width}], align_corners={p['ac']})",
        )
    if op.kind == "flow_grid":
        return "", f"_flow_to_grid({a[0]}, {p['ac']})"
    if op.kind == "conv_grid":
        conv = f"{m}({a[0]})"
        squashed = f"torch.tanh({conv})" if p["squash"] == "tanh" else f"({conv} * 0.6)"
        return f"_conv({shape[1]}, 2, {p['k']}, 1, {p['seed']})", f"{squashed}.permute(0, 2, 3, 1)"
    if op.kind == "sample":
        return "", (
            f"F.grid_sample({a[0]}, {a[1]}, mode={p['mode']!r}, padding_mode={p['padding']!r}, "
            f"align_corners={p['ac']})"
        )
    if op.kind == "logits":
        pooled = f"F.adaptive_avg_pool2d({a[0]}, 1).flatten(1)"
        return f"_linear({shape[1]}, {p['classes']}, {p['seed']})", f"{m}({pooled})"
    raise InvalidSpecError(f"unknown op {op.kind}")


def build(spec: Spec) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model and its example inputs, made by running ``render(spec)``."""
    return load_source(render(spec))


def load_source(source: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    # torch.export (strict) looks the model's module up by name, as for a file the CLI imports
    name = f"_etkit_fuzzed_model_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<fuzzed model {name}>", "exec"), module.__dict__)
    return module.ModelUnderTest, tuple(module.ModelInputs)


# -- classification ----------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # one of OUTCOMES
    message: str = ""
    signature: str = ""  # what "fails the same way" compares
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


def verification_error_class() -> type[BaseException] | None:
    """``etkit_exporter.VerificationError`` once etkit has a verdict."""
    import etkit_exporter

    try:
        return getattr(etkit_exporter, "VerificationError", None)  # type: ignore[no-any-return]
    except Exception:  # the lazy import of a half-written module
        return None


def summary(error: BaseException) -> str:
    """The first line of ``error``'s message and, where it or an error in its chain of causes
    goes on over several lines (a tool's log), the last of those lines that says ERROR."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    said: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        said += [line.strip() for line in str(current).splitlines()[1:] if "ERROR" in line]
        current = current.__cause__ or current.__context__
    return f"{lines[0]} ... {said[-1]}" if said else lines[0]


def signature(error: BaseException) -> str:
    """The summary of ``error`` with numbers, paths and times blurred, so that failures of one
    class compare equal."""
    text = summary(error)
    text = re.sub(r"/[^\s:'\"]+", "PATH", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return f"{type(error).__name__}: {text[:300]}"


def classify(spec: Spec, target: str, workdir: Path | None = None) -> Outcome:
    """Exports ``spec`` for ``target`` with verification on and says how it went."""
    model, inputs = build(spec)
    return classify_model(model, inputs, target, workdir)


def classify_model(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    target: str,
    workdir: Path | None = None,
) -> Outcome:
    from etkit_exporter import export_model

    verification_error = verification_error_class()
    stages: list[tuple[str, float]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=workdir, prefix="fuzz-") as folder:
        try:
            result = export_model(
                model,
                inputs,
                target=target,
                verify=True,
                artifacts_root=Path(folder) / "export",
                on_stage=lambda name, seconds: stages.append((name, round(seconds, 1))),
            )
        except Exception as error:
            seconds = time.perf_counter() - start
            message = str(error)
            first = summary(error)
            if verification_error is not None and isinstance(error, verification_error):
                return Outcome(
                    "failed_verification", first[:500], "verification", seconds,
                    {"failures": getattr(error, "failures", None)},
                )  # fmt: skip
            if isinstance(error, ValueError | TypeError) and not stages and "\n" not in message:
                return Outcome("refused", first[:500], signature(error), seconds)
            why = (
                "a multi-line refusal"
                if isinstance(error, ValueError | TypeError) and not stages
                else f"after stages {', '.join(name for name, _ in stages)}"
                if isinstance(error, ValueError | TypeError)
                else ""
            )
            return Outcome(
                "crashed",
                f"{type(error).__name__}: {first[:500]}" + (f" ({why})" if why else ""),
                signature(error),
                seconds,
                {"stages": dict(stages)},
            )
        seconds = time.perf_counter() - start
    verification = result.verification or {}
    failing = [
        c
        for c in verification.get("comparisons", [])
        if c["reference"] == "quantized PT2E model"
        and c["psnr_db"] is not None
        and c["psnr_db"] < STAND_IN_PSNR_DB
    ]
    if not verification:
        return Outcome("crashed", "no verification in the result", "no verification", seconds)
    if failing and verification_error is None:
        worst = min(failing, key=lambda c: c["psnr_db"])
        return Outcome(
            "failed_verification",
            f"output {worst['output']}: {worst['psnr_db']:.2f} dB vs the quantized PT2E model "
            f"(< {STAND_IN_PSNR_DB:g}), max steps {worst.get('max_steps')}",
            "verification",
            seconds,
            {"comparisons": verification["comparisons"]},
        )
    details = {
        "stages": dict(stages),
        "program": program_shape(result),
        "margin": envelope_margin(verification.get("verdict") or {}),
    }
    return Outcome("verified", "", "", seconds, details)


def envelope_margin(verdict: dict[str, Any]) -> dict[str, float]:
    """How close a passing verdict came to failing: the largest share of its bound that an
    output's error power and mean used, and the largest systematic sampling shift (pixels)."""
    outputs = verdict.get("outputs", [])
    power = [
        o["power_steps2"] / o["power_bound_steps2"] for o in outputs if o.get("power_bound_steps2")
    ]
    bias = [
        abs(o["mean_steps"]) / o["bias_bound_steps"] for o in outputs if o.get("bias_bound_steps")
    ]
    shifts = [max(abs(b) for b in c["bias_px"]) for c in verdict.get("coordinates", [])]
    return {
        "power_share": max(power, default=0.0),
        "bias_share": max(bias, default=0.0),
        "coordinate_bias_px": max(shifts, default=0.0),
    }


def program_shape(result: Any) -> dict[str, Any]:
    """What the written program is made of: its delegates' backends, where each grid sampler
    went (``grid_sampler_paths``), how many ops run outside every delegate, and whether it is
    one delegate (``one_delegate``) where it can be: for VGF, one ``VgfBackend`` when no
    sampler was left to another path and no op runs outside."""
    report = result.report
    backends = [p["backend"] for p in report.get("partitions", [])]
    paths = [p["path"] for p in report.get("grid_sampler_paths", [])]
    outside = len(report.get("outside_delegates", []))
    whole = all(p == "vgf-compute-segment" for p in paths) and outside == 0
    return {
        "backends": backends,
        "sampler_paths": paths,
        "outside": outside,
        "one_delegate_possible": whole,
        "one_delegate": len(backends) == 1,
    }


# -- shrinking ---------------------------------------------------------------------------------


def _candidates(spec: Spec) -> Iterator[Spec]:
    """Smaller variants of ``spec``, biggest reductions first (each may be invalid)."""
    for k in range(len(spec.outputs)):
        if len(spec.outputs) > 1:
            s = spec.copy()
            del s.outputs[k]
            yield s
    for index in reversed(range(len(spec.ops))):
        op = spec.ops[index]
        for arg in dict.fromkeys(op.args):  # bypass: uses of the op read one of its arguments
            s = spec.copy()
            s.ops = [o for o in s.ops if o.out != op.out]
            for o in s.ops:
                o.args = [arg if x == op.out else x for x in o.args]
            s.outputs = list(dict.fromkeys(arg if x == op.out else x for x in s.outputs))
            yield s
    if spec.inputs and spec.inputs[0].shape[0] > 1:
        s = spec.copy()
        for item in s.inputs:
            item.shape = (1, *item.shape[1:])
        yield s
    for k, item in enumerate(spec.inputs):
        axes = (2, 3) if item.kind != "grid" else (1, 2)
        for axis in axes:
            if item.shape[axis] > 2:
                s = spec.copy()
                shape = list(item.shape)
                shape[axis] = max(2, shape[axis] // 2)
                s.inputs[k].shape = tuple(shape)
                yield s
        if item.kind == "image" and item.shape[1] > 1:
            for channels in sorted({1, item.shape[1] // 2}):
                s = spec.copy()
                s.inputs[k].shape = (item.shape[0], channels, *item.shape[2:])
                yield s
    for index, op in enumerate(spec.ops):
        for key, plain in (
            ("mode", "bilinear"), ("padding", "zeros"), ("ac", False), ("k", 1), ("dw", False),
            ("scale", 2),
        ):  # fmt: skip
            if (
                key in op.params
                and op.params[key] != plain
                and not (key == "mode" and op.kind != "sample")
            ):
                s = spec.copy()
                s.ops[index].params[key] = plain
                yield s
        if op.kind == "conv" and not op.params["dw"] and op.params["cout"] > 1:
            for cout in sorted({1, op.params["cout"] // 2}):
                s = spec.copy()
                s.ops[index].params["cout"] = cout
                yield s
        if op.kind in ("affine_grid", "resize_like") and op.params.get("size"):
            h, w = op.params["size"]
            s = spec.copy()
            s.ops[index].params["size"] = (max(2, h // 2), max(2, w // 2))
            yield s


def valid(spec: Spec) -> bool:
    """Shapes fit and the model runs on its inputs."""
    try:
        prune(spec)
        infer(spec)
        model, inputs = build(spec)
        with torch.no_grad():
            model(*inputs)
    except Exception:
        return False
    return True


def size_of(spec: Spec) -> tuple[int, int, int]:
    elements = sum(int(torch.Size(item.shape).numel()) for item in spec.inputs)
    return len(spec.ops), len(spec.outputs) + len(spec.inputs), elements


def shrink(
    spec: Spec,
    still_fails: Callable[[Spec], bool],
    *,
    budget: int = 40,
    seconds: float = 600.0,
    on_step: Callable[[Spec], None] | None = None,
) -> tuple[Spec, int]:
    """The smallest variant of ``spec`` found (greedy: the first smaller valid candidate that
    ``still_fails`` is taken and the search starts again from it) within ``budget`` calls of
    ``still_fails`` and ``seconds``; also the number of calls made."""
    current, calls, deadline = spec.copy(), 0, time.monotonic() + seconds
    seen: set[str] = {render(current)}
    progress = True
    while progress and calls < budget and time.monotonic() < deadline:
        progress = False
        for candidate in _candidates(current):
            if calls >= budget or time.monotonic() >= deadline:
                break
            if not valid(candidate):
                continue
            source = render(candidate)
            if source in seen:
                continue
            seen.add(source)
            calls += 1
            if still_fails(candidate):
                current, progress = candidate, True
                if on_step is not None:
                    on_step(current)
                break
    return current, calls


# -- repro files -------------------------------------------------------------------------------


def repro_command(path: Path, target: str) -> str:
    return f"etkit-export -m {path} -t {target} --verify -o /tmp/{path.stem}-{target} --force"


def write_repro(spec: Spec, target: str, outcome: Outcome, folder: Path, stem: str) -> Path:
    """Writes ``folder/stem.py`` (the model and its inputs, standalone) with the outcome and
    the command that reproduces it in its docstring; returns the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.py"
    header = (
        f"Fuzzed model (tests/model_fuzz.py, seed {spec.seed}; {spec.counts()}).\n\n"
        f"target {target}: {outcome.kind}\n{_wrap(outcome.message)}\n\n"
        f"Reproduce:\n    {repro_command(path, target)}\n"
    )
    path.write_text(render(spec, header))
    return path


def _wrap(text: str, width: int = 96) -> str:
    words, lines, line = text.replace('"""', "'''").split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


# -- what a model exercises --------------------------------------------------------------------


def features(spec: Spec) -> set[str]:
    """The generator's features ``spec`` exercises: op kinds, sampler modes, paddings and
    align_corners, input kinds and counts, batch 2, 1 and 16 channels, sampler chains, the same
    image sampled twice, grids computed before the image, output kinds."""
    values = infer(spec)
    found = {f"op:{op.kind}" for op in spec.ops}
    found |= {f"input:{item.kind}" for item in spec.inputs}
    found.add(f"inputs:{len(spec.inputs)}")
    found.add(f"outputs:{len(spec.outputs)}")
    samplers = [op for op in spec.ops if op.kind == "sample"]
    found.add(f"samplers:{len(samplers)}")
    made_by = {op.out: op for op in spec.ops}
    position = {op.out: k for k, op in enumerate(spec.ops)}
    for op in samplers:
        p = op.params
        found |= {f"mode:{p['mode']}", f"padding:{p['padding']}", f"align_corners:{p['ac']}"}
        image, grid = op.args
        if _reaches_sampler(image, made_by):
            found.add("chain")
        if position.get(grid, -1) >= 0 and position.get(grid, -1) < position.get(image, -1):
            found.add("grid_before_image")
    images = [op.args[0] for op in samplers]
    if len(images) != len(set(images)):
        found.add("same_image_twice")
    for kind, shape in values.values():
        if kind == "image":
            found |= {f"channels:{shape[1]}"} & {"channels:1", "channels:16"}
    if values[spec.inputs[0].name][1][0] == 2:
        found.add("batch:2")
    for name in spec.outputs:
        op = made_by.get(name)
        kind = values[name][0]
        found.add(f"output:{'depth' if op is not None and op.kind == 'depth' else kind}")
        if kind == "image" and values[name][1][1] in (1, 2, 3, 4, 16):
            found.add(f"output_channels:{values[name][1][1]}")
    return found


def _reaches_sampler(name: str, made_by: dict[str, Op]) -> bool:
    """Whether ``name`` is computed from a sampler's output."""
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        op = made_by.get(current)
        if op is None or current in seen:
            continue
        seen.add(current)
        if op.kind == "sample":
            return True
        stack.extend(op.args)
    return False


def covering_seeds(seeds: range, wanted: set[str] | None = None) -> list[int]:
    """A small set of ``seeds`` whose models together exercise every feature the seeds do
    (greedy set cover, cheapest model first: fewest ops)."""
    specs = {seed: generate(seed) for seed in seeds}
    have = {seed: features(spec) for seed, spec in specs.items()}
    left = set().union(*have.values()) if wanted is None else set(wanted)
    chosen: list[int] = []
    while left:
        best = max(specs, key=lambda s: (len(have[s] & left) / (4 + len(specs[s].ops)), -s))
        if not have[best] & left:
            break
        chosen.append(best)
        left -= have[best]
    return sorted(chosen)
