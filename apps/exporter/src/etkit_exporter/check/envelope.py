"""The rounding envelope: the outputs that legitimate rounding differences give, measured on the
quantized model itself.

A correct program computes each quantized op on integers, where the quantized PT2E model
computes it in float and rounds once. The two agree except where the exact value lies near a
rounding boundary: there the backend's fixed-point or float32 requantization, the order of its
sums, its rule for halves, or the grid sampler's integer contract (docs/contract.md: within
0.008 image steps before its rounding) may round to the other neighbour. Nothing else differs.

So the envelope reruns the quantized model with each activation quantize rounding to the other
neighbour wherever the exact value lies within a band of the boundary, at random (``dithered``:
``round(v + u)``, ``u`` uniform in ``[-band, band]`` steps), ``samples`` times from a fixed seed,
and once with every half rounded up and once down (``modes``: TOSA rounds halves up, PyTorch to
even); a half is a value within float32 error of one (``HALF_SLACK``), as the quantized model
computes in float32 what a backend computes exactly on integers. Its spread is what the
verdict lets a program's outputs differ by (``verdict``). The band is ``band`` steps for every
quantize, plus ``0.008 * ratio`` for a grid sampler's output (``ratio``: image step over output
step, the contract's bound). A quantize of a graph input or a
constant is not dithered: the program is given, or holds, the same integers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.utils import _pytree as pytree

# The grid sampler's value before its rounding is within this many image steps of the ideal
# (libs/gridsampler/docs/contract.md, "What it guarantees")
SAMPLER_CONTRACT_IMAGE_STEPS: Final = 0.008
ENVELOPE_SEED: Final = 20261128
# A value the quantized model computes this near a half (in steps: 1e-3 and 4 float32 units in
# the last place of the value) is a half. A bilinear resize's exact result in quarters of a step
# came out of PyTorch's float32 kernel up to 1.5e-5 steps from its half (40 of 66 halves of a
# 540-value output not exactly one), and which ones depends on the CPU's instructions
HALF_SLACK: Final = 1e-3
_HALF_SLACK_ULPS: Final = 4 * 2.0**-23


def _is_quantize(node: torch.fx.Node) -> bool:
    name = str(node.target)
    return node.op == "call_function" and "quantize_per_tensor" in name and "dequantize" not in name


def _is_dequantize(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and "dequantize_per_tensor" in str(node.target)
    )


def _is_sampler(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and "grid_sampler" in str(node.target)
    )


def _constant_input(node: torch.fx.Node) -> bool:
    """Whether a quantize reads a graph input or a constant (nothing the program rounds)."""
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node):
        return True
    return source.op in ("get_attr", "placeholder")


def quantize_bands(module: torch.fx.GraphModule, band: float) -> dict[str, float]:
    """The band (in steps of its own scale) of every activation quantize of ``module`` that the
    envelope dithers, by node name."""
    bands: dict[str, float] = {}
    for node in module.graph.nodes:
        if not _is_quantize(node) or _constant_input(node):
            continue
        width = band
        source = node.args[0]
        if _is_sampler(source) and isinstance(source, torch.fx.Node):
            image = source.args[0]
            image_scale = (
                image.args[1]
                if isinstance(image, torch.fx.Node) and _is_dequantize(image)
                else None
            )
            out_scale = node.args[1]
            if isinstance(image_scale, (int, float)) and isinstance(out_scale, (int, float)):
                width += SAMPLER_CONTRACT_IMAGE_STEPS * float(image_scale) / float(out_scale)
        bands[node.name] = width
    return bands


def _half_slack(v: torch.Tensor) -> torch.Tensor:
    """How near a half (in steps) a value of ``v`` counts as one (``HALF_SLACK``)."""
    return HALF_SLACK + v.abs() * _HALF_SLACK_ULPS


# What an envelope run keeps of a tensor: the tensor itself, or what a reducer makes of it (the
# figures a judgement needs), so that a run at 1080p keeps a few numbers per tensor, not its values
Reducer = Callable[[torch.Tensor], Any]
OutputReducer = Callable[[int, torch.Tensor], Any]  # an output's index and value


class _Rounding(torch.fx.Interpreter):
    """Runs a quantized graph with its activation quantizes rounding as ``mode`` says:
    ``"dither"`` (``round(v + u)``, ``u`` uniform within the node's band), ``"up"`` or
    ``"down"`` (halves, within ``HALF_SLACK``); keeps the values of the nodes named in
    ``capture`` (each through its reducer, when it has one). With ``needed`` (node names), only
    those nodes are computed: a dithered quantize outside them still draws its noise, so that
    every run draws the same numbers for the same node as a run of the whole graph."""

    def __init__(
        self,
        module: torch.fx.GraphModule,
        bands: dict[str, float],
        mode: str,
        generator: torch.Generator,
        capture: Collection[str] | Mapping[str, Reducer | None],
        needed: Collection[str] | None = None,
    ) -> None:
        super().__init__(module)
        self.bands, self.mode, self.generator = bands, mode, generator
        self.capture: Mapping[str, Reducer | None] = (
            capture if isinstance(capture, Mapping) else dict.fromkeys(capture)
        )
        self.needed = None if needed is None else set(needed)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        band = self.bands.get(n.name)
        if self.needed is not None and n.op == "call_function" and n.name not in self.needed:
            if band is not None and self.mode == "dither":
                _draw_noise(n, self.generator)
            return None
        if band is None:
            value = super().run_node(n)
        else:
            args, _ = self.fetch_args_kwargs_from_env(n)
            value = _round(args, band, self.mode, self.generator)
        if n.name in self.capture:
            reduce = self.capture[n.name]
            self.values[n.name] = value if reduce is None else reduce(value)
        return value


def _round(args: Sequence[Any], band: float, mode: str, generator: torch.Generator) -> Any:
    """A quantize's integers under ``mode`` (``_Rounding``), in place on its scaled value: the
    same float32 operations in the same order as ``round(v + (2u - 1) * band)`` written out,
    each on one buffer (at 1080p each temporary is a page-faulted allocation of its own)."""
    x, scale, zero_point, low, high, dtype = args[:6]
    v = x.float() * (1.0 / float(scale))  # as the quantized model computes it
    if mode == "up":
        slack = _half_slack(v)
        q = (v + 0.5).add_(slack).floor_()
    elif mode == "down":
        slack = _half_slack(v)
        q = (v - 0.5).sub_(slack).ceil_()
    else:
        u = torch.rand(v.shape, generator=generator, dtype=torch.float32)
        q = v.add_(u.mul_(2).sub_(1).mul_(band)).round_()
    return q.add_(int(zero_point)).clamp_(low, high).to(dtype)


def _draw_noise(node: torch.fx.Node, generator: torch.Generator) -> None:
    """Draws what a dithered run of ``node`` draws, without computing it (its shape from the
    graph's metadata)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"the envelope cannot skip {node.name}: its shape is not recorded")
    shape = tuple(_size(s) for s in value.shape)
    torch.rand(shape, generator=generator, dtype=torch.float32)


def _size(size: Any) -> int:
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


def ancestors(graph: torch.fx.Graph, names: Collection[str]) -> set[str]:
    """The names of the nodes ``names`` are computed from, themselves included."""
    by_name = {n.name: n for n in graph.nodes}
    stack = [by_name[name] for name in names if name in by_name]
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        if node.name not in seen:
            seen.add(node.name)
            stack.extend(node.all_input_nodes)
    return seen


@dataclass
class Envelope:
    """The quantized model's outputs (and captured node values) under legitimate rounding:
    ``dithered`` runs and the two ``modes`` runs, each ``(outputs, values by node name)``; each
    output and value as its reducer left it (the tensor where it had none)."""

    dithered: list[tuple[list[Any], dict[str, Any]]]
    modes: list[tuple[list[Any], dict[str, Any]]]
    band: float
    dithered_quantizes: int

    def outputs(self, index: int) -> tuple[list[Any], list[Any]]:
        """Output ``index`` of every dithered run, and of every mode run."""
        return (
            [outs[index] for outs, _ in self.dithered],
            [outs[index] for outs, _ in self.modes],
        )

    def node(self, name: str) -> tuple[list[Any], list[Any]]:
        """Node ``name``'s value in every dithered run and every mode run (empty when it was
        not captured)."""
        return (
            [v[name] for _, v in self.dithered if v.get(name) is not None],
            [v[name] for _, v in self.modes if v.get(name) is not None],
        )


def rounding_envelope(
    module: torch.fx.GraphModule,
    inputs: Sequence[Any],
    *,
    samples: int,
    band: float,
    capture: Collection[str] | Mapping[str, Reducer | None] = (),
    outputs: OutputReducer | None = None,
    needed: Collection[str] | None = None,
    seed: int = ENVELOPE_SEED,
    on_run: Callable[[int, int], None] | None = None,
) -> Envelope:
    """``samples`` dithered runs and the two halves-rounding runs of the quantized ``module``
    on ``inputs`` (module docstring), from a fixed ``seed`` (the verdict is reproducible).
    Each run keeps the nodes named in ``capture`` (a mapping gives each a reducer: the run keeps
    what it returns, and the tensor goes) and its outputs, each through ``outputs(index,
    tensor)`` when given; with ``needed``, only those nodes are computed (the run's outputs
    are then not kept). ``on_run(done, total)`` after each run."""
    bands = quantize_bands(module, band)
    generator = torch.Generator().manual_seed(seed)
    runs: dict[str, list[tuple[list[Any], dict[str, Any]]]] = {"dither": [], "modes": []}
    plan = [("dither", "dither")] * samples + [("modes", "up"), ("modes", "down")]
    with torch.no_grad():
        for done, (kind, mode) in enumerate(plan, 1):
            interpreter = _Rounding(module, bands, mode, generator, capture, needed)
            result = interpreter.run(*inputs)
            kept: list[Any] = []
            if needed is None:
                leaves = pytree.tree_leaves(result)
                kept = leaves if outputs is None else [outputs(i, y) for i, y in enumerate(leaves)]
            del result
            runs[kind].append((kept, interpreter.values))
            if on_run is not None:
                on_run(done, len(plan))
    return Envelope(runs["dither"], runs["modes"], band, len(bands))


# One-sided 99.9 % quantiles of Student's t with 3 .. 63 degrees of freedom: a prediction bound
# for one more draw from the envelope's distribution (``prediction_bound``)
_T_999: Final = (10.215, 7.173, 5.893, 5.208, 4.785, 4.501, 4.297, 4.144, 4.025, 3.93, 3.852,
                 3.787, 3.733, 3.686, 3.646, 3.61, 3.579, 3.552, 3.527, 3.505, 3.485, 3.467, 3.45,
                 3.435, 3.421, 3.408, 3.396, 3.385, 3.375, 3.365, 3.356, 3.348, 3.34, 3.333,
                 3.326, 3.319, 3.313, 3.307, 3.301, 3.296, 3.291, 3.286, 3.281, 3.277, 3.273,
                 3.269, 3.265, 3.261, 3.258, 3.255, 3.251, 3.248, 3.245, 3.242, 3.239, 3.237,
                 3.234, 3.232, 3.229, 3.227, 3.225)  # fmt: skip
MIN_SAMPLES: Final = 4
MAX_SAMPLES: Final = 64


def prediction_bound(values: Sequence[float]) -> float:
    """The upper 99.9 % prediction bound of one more draw from the distribution ``values`` were
    drawn from (normal theory: mean + t * sd * sqrt(1 + 1/K))."""
    k = len(values)
    if k < MIN_SAMPLES:
        raise ValueError(f"a prediction bound needs at least {MIN_SAMPLES} samples, got {k}")
    mean = sum(values) / k
    sd = (sum((v - mean) ** 2 for v in values) / (k - 1)) ** 0.5
    t = _T_999[min(k - 1, 63) - 3]
    return float(mean + t * sd * (1 + 1 / k) ** 0.5)
