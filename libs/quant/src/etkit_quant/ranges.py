"""The value ranges of the float graph over the calibration samples (``observe_ranges``): min,
max and count of the values at each graph input, graph output and grid sampler (image, grid,
output), and exactly how many lie outside given ranges; the graph is run through
``torch.fx.Interpreter`` and never modified."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import torch
from torch.fx import GraphModule, Interpreter, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant.boundary import user_inputs, user_outputs
from etkit_quant.gather_positions import coordinate_graph_inputs
from etkit_quant.graph import is_grid_sampler
from etkit_quant.qspecs import fixed_qparams, is_fixed, snorm8, snorm16
from etkit_quant.samples import OnSample, _check_sample, _materialize

SiteKind = Literal[
    "input",
    "output",
    "grid_sampler_image",
    "grid_sampler_grid",
    "grid_sampler_output",
    "internal",
]

# Always counted by observe_ranges: what SNORM8 and SNORM16 (the default qspecs) clip.
_DEFAULT_COUNTED: Final = (
    fixed_qparams(snorm8()).rounding_range,
    fixed_qparams(snorm16()).rounding_range,
)


@dataclass(frozen=True)
class ObservedRange:
    """The values seen at one place of the float graph over all calibration samples.

    ``min``/``max`` are over the finite values (``inf``/``-inf`` when there were none);
    ``count`` counts every value, ``nonfinite`` the NaN and infinite ones; ``outside`` holds
    ``(low, high, n)``: ``n`` finite values lay outside ``[low, high]``, counted exactly for each
    range ``observe_ranges`` was asked to count."""

    name: str
    kind: SiteKind
    index: int
    node: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    min: float
    max: float
    count: int
    nonfinite: int = 0
    outside: tuple[tuple[float, float, int], ...] = ()
    coordinates: bool = False
    """A graph input that flows only into coordinate arithmetic or grid inputs
    (``gather_positions.coordinate_graph_inputs``): a coordinate map, a flow or a matrix given
    as input."""

    @property
    def max_abs(self) -> float:
        """The largest magnitude of the finite values (0 when there were none)."""
        if self.count == self.nonfinite:
            return 0.0
        return max(abs(self.min), abs(self.max))

    @property
    def is_grid(self) -> bool:
        """A sampling grid: a grid sampler's grid input, a grid-shaped (N x H x W x 2)
        floating-point graph input, or a floating-point graph input that flows only into
        coordinate arithmetic (``coordinates``)."""
        if self.kind == "grid_sampler_grid":
            return True
        if self.kind == "input" and self.coordinates and self.dtype.is_floating_point:
            return True
        return (
            self.kind == "input"
            and self.dtype.is_floating_point
            and len(self.shape) == 4
            and self.shape[-1] == 2
        )

    def within(self, low: float, high: float) -> bool:
        """True when every value seen lies in ``[low, high]`` (and all were finite)."""
        return self.nonfinite == 0 and (self.count == 0 or (low <= self.min and self.max <= high))

    def count_outside(self, low: float, high: float) -> int:
        """How many of the values seen lie outside ``[low, high]``, exactly (non-finite values
        count as outside). Decided from ``min``/``max`` when the range holds all finite values or
        none of them, else from the counts recorded for that range. Raises ``ValueError`` when
        the range was not counted: pass its qspec to ``observe_ranges(count_outside=...)``."""
        finite = self.count - self.nonfinite
        if finite == 0 or (low <= self.min and self.max <= high):
            return self.nonfinite
        if self.max < low or self.min > high:
            return self.count
        for counted_low, counted_high, n in self.outside:
            if (counted_low, counted_high) == (low, high):
                return n + self.nonfinite
        raise ValueError(
            f"{self.name}: values outside [{low:g}, {high:g}] were not counted during "
            "observation; pass the qspec to observe_ranges(count_outside=...)"
        )


@dataclass(frozen=True)
class RangeObservation:
    """What ``observe_ranges`` saw: one ``ObservedRange`` per graph input (the user inputs with
    users, in order: ``BoundaryQuantizer``'s ``input_qspecs`` positions), per graph output, and
    per grid sampler (in graph order) for its image, its grid and its output."""

    samples: int
    inputs: tuple[ObservedRange, ...]
    outputs: tuple[ObservedRange, ...]
    grid_sampler_images: tuple[ObservedRange, ...] = ()
    grid_sampler_grids: tuple[ObservedRange, ...] = ()
    grid_sampler_outputs: tuple[ObservedRange, ...] = ()

    @property
    def ranges(self) -> tuple[ObservedRange, ...]:
        """Every observed range: inputs, outputs, then each grid sampler's image, grid, output."""
        samplers = tuple(
            r
            for triple in zip(
                self.grid_sampler_images,
                self.grid_sampler_grids,
                self.grid_sampler_outputs,
                strict=True,
            )
            for r in triple
        )
        return self.inputs + self.outputs + samplers


@dataclass
class _Accumulator:
    name: str
    kind: SiteKind
    index: int
    node: Node
    ranges: tuple[tuple[float, float], ...]
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    min: float = math.inf
    max: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    outside: dict[tuple[float, float], int] = field(default_factory=dict)
    coordinates: bool = False

    def __post_init__(self) -> None:
        value = self.node.meta.get("val")
        if isinstance(value, torch.Tensor):
            self.shape, self.dtype = tuple(int(d) for d in value.shape), value.dtype
        self.outside = dict.fromkeys(self.ranges, 0)

    def add(self, value: object) -> None:
        if not isinstance(value, torch.Tensor):
            return
        self.shape, self.dtype = tuple(int(d) for d in value.shape), value.dtype
        values = value.detach()
        if values.is_complex():
            return
        if not values.is_floating_point():
            values = values.to(torch.float64)
        self.count += values.numel()
        if values.numel() == 0:
            return
        finite = torch.isfinite(values)
        nonfinite = values.numel() - int(finite.sum())
        if nonfinite:
            self.nonfinite += nonfinite
            values = values[finite]
            if values.numel() == 0:
                return
        low, high = (float(v) for v in torch.aminmax(values))
        self.min, self.max = min(self.min, low), max(self.max, high)
        wide: torch.Tensor | None = None
        for bounds in self.ranges:
            if bounds[0] <= low and high <= bounds[1]:
                continue
            if high < bounds[0] or low > bounds[1]:
                self.outside[bounds] += values.numel()
                continue
            # Compare in float64 against the exact bounds (a float32 comparison would round them).
            wide = values.to(torch.float64) if wide is None else wide
            self.outside[bounds] += int(((wide < bounds[0]) | (wide > bounds[1])).sum())

    def result(self) -> ObservedRange:
        return ObservedRange(
            name=self.name,
            kind=self.kind,
            index=self.index,
            node=self.node.name,
            shape=self.shape,
            dtype=self.dtype,
            min=self.min,
            max=self.max,
            count=self.count,
            nonfinite=self.nonfinite,
            outside=tuple((low, high, n) for (low, high), n in self.outside.items()),
            coordinates=self.coordinates,
        )


class _RangeInterpreter(Interpreter):
    """Runs the graph as it is, handing each watched node's value to its accumulators."""

    def __init__(self, module: GraphModule, watched: dict[Node, list[_Accumulator]]) -> None:
        super().__init__(module)
        self.watched = watched

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        for accumulator in self.watched.get(n, ()):
            accumulator.add(result)
        return result


def _range_of(qspec: object) -> tuple[float, float] | None:
    if isinstance(qspec, tuple) and len(qspec) == 2:
        low, high = (float(v) for v in qspec)
        if not low <= high:
            raise ValueError(f"count_outside: range [{low}, {high}] is empty")
        return low, high
    if qspec is None or (isinstance(qspec, QuantizationSpec) and not is_fixed(qspec)):
        return None
    if not isinstance(qspec, QuantizationSpec):
        raise TypeError(
            "count_outside takes qspecs (or (low, high) pairs), got " + type(qspec).__name__
        )
    return fixed_qparams(qspec).rounding_range


def _as_graph_module(model: object, first_sample: tuple[torch.Tensor, ...]) -> GraphModule:
    if isinstance(model, GraphModule):
        return model
    if isinstance(model, torch.export.ExportedProgram):
        module: GraphModule = model.module(check_guards=False)
        return module
    if isinstance(model, torch.nn.Module):
        exported = torch.export.export(model, first_sample, strict=True)
        module = exported.module(check_guards=False)
        return module
    raise TypeError(
        "model must be a GraphModule (torch.export's .module()), an ExportedProgram or a "
        f"torch.nn.Module, got {type(model).__name__}"
    )


def _reference_inputs(model: GraphModule) -> tuple[torch.Tensor, ...] | None:
    """The graph's inputs as its metadata records them, when every one is a tensor (else
    ``None``: the first sample is the reference); a dimension captured as dynamic takes any
    size."""
    values = [n.meta.get("val") for n in model.graph.nodes if n.op == "placeholder"]
    tensors = tuple(v for v in values if isinstance(v, torch.Tensor))
    if len(tensors) != len(values):
        return None
    return tensors


def observe_ranges(
    model: torch.nn.Module | torch.export.ExportedProgram,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    *,
    count_outside: Iterable[QuantizationSpec | tuple[float, float] | None] = (),
    on_sample: OnSample | None = None,
) -> RangeObservation:
    """Runs the float ``model`` on every sample of ``calibration`` and records, per graph user
    input, per graph output and per grid sampler (its image ``args[0]``, grid ``args[1]`` and
    output), the min, max and count of the values, and exactly how many values each fixed qspec
    in ``count_outside`` clips (more than half a step outside its representable range; or how
    many lie outside a ``(low, high)`` pair), SNORM8 and SNORM16 always (pass the fixed qspecs
    the boundaries may get, so that ``saturation_report`` can count them).

    ``model`` is a ``GraphModule`` from ``torch.export.export(...).module()`` (what ``quantize``
    receives), run as it is through ``torch.fx.Interpreter`` and never modified, or an
    ``ExportedProgram`` (its ``.module()``); another ``torch.nn.Module`` is exported first
    (strict, on the first sample). Observe before a pass that pads grid-sampler images with a
    zero channel (RGB to RGBA), or that channel counts among the image's values. Samples are
    checked first, as ``check_calibration`` does, against the graph's input metadata (or the
    first sample). ``on_sample(done, total)`` is called after each sample."""
    given = _materialize(calibration)
    first = _check_sample(given[0], None, "calibration sample 0")
    graph_module = _as_graph_module(model, first)
    reference = _reference_inputs(graph_module) or first
    samples = [
        _check_sample(sample, reference, f"calibration sample {index}")
        for index, sample in enumerate(given)
    ]
    ranges: list[tuple[float, float]] = list(_DEFAULT_COUNTED)
    for qspec in count_outside:
        bounds = _range_of(qspec)
        if bounds is not None and bounds not in ranges:
            ranges.append(bounds)
    counted = tuple(ranges)

    watched: dict[Node, list[_Accumulator]] = {}
    coordinate_inputs = set(coordinate_graph_inputs(graph_module))

    def watch(node: Node, name: str, kind: SiteKind, index: int) -> _Accumulator:
        accumulator = _Accumulator(name, kind, index, node, counted)
        watched.setdefault(node, []).append(accumulator)
        return accumulator

    inputs = [
        watch(n, f"input {k} ({n.name})", "input", k)
        for k, n in enumerate(user_inputs(graph_module))
    ]
    for accumulator in inputs:  # coordinate maps given as inputs are quantized like grids
        accumulator.coordinates = accumulator.node in coordinate_inputs
    outputs = [
        watch(n, f"output {k} ({n.name})", "output", k)
        for k, n in enumerate(user_outputs(graph_module))
    ]
    samplers = [
        n
        for n in graph_module.graph.nodes
        if is_grid_sampler(n) and len(n.args) > 1 and all(isinstance(a, Node) for a in n.args[:2])
    ]
    images, grids, sampled = [], [], []
    for j, node in enumerate(samplers):
        prefix = f"grid sampler {j} ({node.name})"
        images.append(watch(node.args[0], f"{prefix} image", "grid_sampler_image", j))
        grids.append(watch(node.args[1], f"{prefix} grid", "grid_sampler_grid", j))
        sampled.append(watch(node, f"{prefix} output", "grid_sampler_output", j))

    interpreter = _RangeInterpreter(graph_module, watched)
    with torch.no_grad():
        for done, sample in enumerate(samples, start=1):
            interpreter.run(*sample)
            if on_sample is not None:
                on_sample(done, len(samples))

    def results(accumulators: list[_Accumulator]) -> tuple[ObservedRange, ...]:
        return tuple(a.result() for a in accumulators)

    return RangeObservation(
        samples=len(samples),
        inputs=results(inputs),
        outputs=results(outputs),
        grid_sampler_images=results(images),
        grid_sampler_grids=results(grids),
        grid_sampler_outputs=results(sampled),
    )
