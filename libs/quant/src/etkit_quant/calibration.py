"""Calibration over many samples, and honest boundary quantization chosen from the data.

- ``check_calibration``: every sample checked before any work (a tuple of tensors with the
  example inputs' count, shapes and dtypes, finite values);
- ``observe_ranges``: the float graph run on every sample (``torch.fx.Interpreter``; the graph
  is not modified), recording min, max and count of the values at each graph input, graph
  output and grid sampler (image, grid, output), and exactly how many lie outside given ranges;
- ``default_qspecs``: each boundary's qspec chosen from those ranges (the rule is in its
  docstring and the README);
- ``saturation`` / ``saturation_report``: for every fixed-parameter qspec at a boundary or grid
  sampler, the fraction of calibration values outside its representable range, with the
  covering qspec to use instead when it is past ``SATURATION_THRESHOLD``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import torch
from torch.fx import GraphModule, Interpreter, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant.boundary import BoundaryQuantizer, user_inputs, user_outputs
from etkit_quant.graph import (
    coordinate_graph_inputs,
    coordinate_inputs,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    target_name,
)
from etkit_quant.qspecs import (
    covering,
    describe_qspec,
    fixed_qparams,
    is_fixed,
    observed_int8,
    snorm8,
    snorm16,
)

SATURATION_THRESHOLD: Final = 0.001
"""The largest fraction of calibration values a fixed qspec may clip before it is reported as
failing (0.1 %)."""

SNORM8_MIN_ABS: Final = 0.5
"""``default_qspecs`` picks SNORM8 for data inside [-1, 1] only when its largest magnitude is at
least this: data that uses less than half of SNORM8's range gets an observed int8 qspec, which
spends all 255 levels on it."""

OnSample = Callable[[int, int], None]
"""Progress callback: ``on_sample(done, total)`` after each calibration sample (``done`` runs
from 1 to ``total``)."""

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


# -- checking samples ---------------------------------------------------------------------------


def _describe_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _check_sample(
    sample: object, reference: Sequence[torch.Tensor] | None, what: str
) -> tuple[torch.Tensor, ...]:
    """``sample`` as a tuple of finite tensors matching ``reference`` (count, shapes, dtypes;
    any tensors when ``None``). ``what`` names the sample in errors."""
    if not isinstance(sample, tuple):
        raise TypeError(
            f"{what} must be a tuple of tensors (one per model input), got {type(sample).__name__}"
        )
    if reference is not None and len(sample) != len(reference):
        raise ValueError(
            f"{what} has {len(sample)} inputs, but the model takes {len(reference)} (the example "
            "inputs)"
        )
    for k, value in enumerate(sample):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}, input {k} must be a torch.Tensor, got {type(value).__name__}")
        if reference is None:
            continue
        expected = reference[k]
        if tuple(value.shape) != tuple(expected.shape):
            raise ValueError(
                f"{what}, input {k} has shape {_describe_shape(value.shape)}, but the example "
                f"input has {_describe_shape(expected.shape)}"
            )
        if value.dtype != expected.dtype:
            raise ValueError(
                f"{what}, input {k} has dtype {value.dtype}, but the example input has "
                f"{expected.dtype}"
            )
    for k, value in enumerate(sample):
        if value.is_floating_point() or value.is_complex():
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                nans = int(torch.isnan(value).sum())
                infs = value.numel() - int(finite.sum()) - nans
                raise ValueError(
                    f"{what}, input {k} is not finite: {nans} NaN and {infs} infinite values "
                    f"of {value.numel()}; calibration data must be finite"
                )
    return sample


def check_calibration(
    calibration: Iterable[tuple[torch.Tensor, ...]] | None,
    example_inputs: tuple[torch.Tensor, ...],
) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples as a list, every one checked before any work: each is a tuple of
    tensors with as many entries as ``example_inputs``, the same shapes and dtypes, and finite
    values (no NaN, no inf). ``None`` means the example inputs are the only sample (then they
    must be finite). An iterator is consumed once, into the list.

    Raises ``TypeError`` (not a tuple, not a tensor, ``calibration`` not iterable) or
    ``ValueError`` (empty, wrong count, shape or dtype, NaN or inf), naming the sample index and
    the input index: ``"calibration sample 3, input 1 has shape [1, 3, 8, 8], but the example
    input has [1, 3, 16, 16]"``."""
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}"
        )
    if calibration is None:
        return [_check_sample(example_inputs, None, "example_inputs (the calibration sample)")]
    reference = _check_sample_types(example_inputs)
    return [
        _check_sample(sample, reference, f"calibration sample {index}")
        for index, sample in enumerate(_materialize(calibration))
    ]


def _materialize(calibration: object) -> list[object]:
    if isinstance(calibration, torch.Tensor | str | bytes) or not isinstance(calibration, Iterable):
        raise TypeError(
            "calibration must be an iterable of input tuples (for one sample: [(x,)]), got "
            f"{type(calibration).__name__}"
        )
    samples = list(calibration)
    if not samples:
        raise ValueError(
            "calibration is empty: give at least one sample, or None to calibrate on the "
            "example inputs"
        )
    return samples


def _check_sample_types(example_inputs: tuple[object, ...]) -> tuple[torch.Tensor, ...]:
    for k, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{k}] must be a torch.Tensor, got {type(value).__name__}"
            )
    return example_inputs  # type: ignore[return-value]  # every entry checked above


# -- observing ranges ---------------------------------------------------------------------------


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
    (``graph.coordinate_graph_inputs``): a coordinate map, a flow or a matrix given as input."""

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
    """The graph's inputs as its metadata records them, when every one is a tensor of static
    shape (else ``None``: the first sample is the reference)."""
    values = [n.meta.get("val") for n in model.graph.nodes if n.op == "placeholder"]
    tensors = tuple(v for v in values if isinstance(v, torch.Tensor))
    if len(tensors) != len(values):
        return None
    if not all(isinstance(d, int) for t in tensors for d in t.shape):
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


# -- how much rounding the tensors entering the coordinate arithmetic cost ----------------------

POSITION_TOLERANCE_PX: Final = 1 / 32
"""The largest shift of a sampling position, in pixels of the sampled image, that rounding the
tensors entering the coordinate arithmetic to int8 may cause before int16 is called for
(where the backend has int16 activations)."""


class _PerturbingInterpreter(Interpreter):
    """Runs the graph, rounding the values of ``rounded`` (node -> (scale, zero point, qmin,
    qmax)) as a quantize-dequantize would, recording min/max of ``watched`` and every grid
    sampler's grid."""

    def __init__(
        self,
        module: GraphModule,
        rounded: dict[Node, tuple[float, float, int, int]],
        watched: set[Node],
    ) -> None:
        super().__init__(module)
        self.rounded, self.watched = rounded, watched
        self.ranges: dict[Node, tuple[float, float]] = {}
        self.grids: list[tuple[Node, torch.Tensor, tuple[int, int], bool]] = []

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if is_grid_sampler(n) and len(n.args) > 1 and isinstance(n.args[1], Node):
            image, grid = self.env[n.args[0]], self.env[n.args[1]]  # type: ignore[index]
            corners = bool(n.args[4]) if len(n.args) > 4 else False
            size = (int(image.shape[-2]), int(image.shape[-1]))
            self.grids.append((n, grid.detach().clone(), size, corners))
        if n in self.watched and isinstance(result, torch.Tensor):
            low, high = (float(v) for v in torch.aminmax(result.detach().float()))
            old = self.ranges.get(n, (low, high))
            self.ranges[n] = (min(old[0], low), max(old[1], high))
        if n in self.rounded and isinstance(result, torch.Tensor):
            scale, zero, qmin, qmax = self.rounded[n]
            q = torch.clamp(torch.round(result / scale) + zero, qmin, qmax)
            result = (q - zero) * scale
        return result


def coordinate_position_error(
    model: torch.nn.Module | torch.export.ExportedProgram,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    *,
    bits: int = 8,
) -> float:
    """The largest shift of any grid sampler's sampling position, in pixels of its image, over
    the calibration samples, when every tensor entering the coordinate arithmetic
    (``graph.coordinate_inputs``, graph inputs left out: they are quantized as grids) is
    rounded to ``bits``-bit integers with the per-tensor parameters a min/max observer would
    choose over the samples (``observed_int8``, or ``observed_int16`` for 16). 0 when nothing
    enters (a grid given as input, or no grid sampler)."""
    given = _materialize(calibration)
    first = _check_sample(given[0], None, "calibration sample 0")
    graph_module = _as_graph_module(model, first)
    samples = [_check_sample(s, None, f"calibration sample {k}") for k, s in enumerate(given)]
    entering = {n for n in coordinate_inputs(graph_module) if n.op == "call_function"}
    if not entering:
        return 0.0
    observer = _PerturbingInterpreter(graph_module, {}, entering)
    clean: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for sample in samples:
            observer.grids = []
            observer.run(*sample)
            clean.append([grid for _, grid, _, _ in observer.grids])
    qmax = 2 ** (bits - 1) - 1
    rounded = {}
    for node, (low, high) in observer.ranges.items():
        low, high = min(low, 0.0), max(high, 0.0)
        scale = max((high - low) / (2 * qmax), 1e-12) if bits == 8 else max(-low, high) / qmax
        zero = round(-qmax - low / scale) if bits == 8 else 0
        rounded[node] = (scale or 1e-12, float(zero), -qmax, qmax)
    perturbed = _PerturbingInterpreter(graph_module, rounded, set())
    worst = 0.0
    with torch.no_grad():
        for sample, grids in zip(samples, clean, strict=True):
            perturbed.grids = []
            perturbed.run(*sample)
            for (_, grid, (height, width), corners), reference in zip(
                perturbed.grids, grids, strict=True
            ):
                span = torch.tensor(
                    [width - 1 if corners else width, height - 1 if corners else height]
                )
                shift = ((grid - reference).abs() * span / 2).amax()
                worst = max(worst, float(shift))
    return worst


# -- choosing qspecs from the data --------------------------------------------------------------


def _span(ranges: Iterable[ObservedRange]) -> tuple[float, float, bool]:
    """(min, max, all finite) over ``ranges``; (0, 0, True) when nothing was seen."""
    low, high, finite = math.inf, -math.inf, True
    for observed in ranges:
        finite &= observed.nonfinite == 0
        if observed.count > observed.nonfinite:
            low, high = min(low, observed.min), max(high, observed.max)
    return (0.0, 0.0, finite) if low > high else (low, high, finite)


def value_qspec(
    ranges: Iterable[ObservedRange], *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> QuantizationSpec:
    """The default qspec of values (not grids) seen in ``ranges``: ``snorm8()`` when every value
    lies in [-1, 1] and the largest magnitude is at least ``snorm8_min_abs``; otherwise
    ``observed_int8()``, per-tensor int8 whose parameters calibration chooses to cover the
    observed range (and zero)."""
    low, high, finite = _span(ranges)
    max_abs = max(abs(low), abs(high))
    if finite and low >= -1.0 and high <= 1.0 and max_abs >= snorm8_min_abs:
        return snorm8()
    return observed_int8()


def grid_qspec(ranges: Iterable[ObservedRange]) -> QuantizationSpec:
    """The default qspec of sampling grids seen in ``ranges``: ``snorm16()`` when every value
    lies in [-1, 1]; otherwise ``covering(max_abs, torch.int16)``, the fixed int16 scale
    ``p / 32767`` with ``p`` the smallest power of two at or above the largest magnitude (2/32767
    for grids reaching 1.5)."""
    low, high, _ = _span(ranges)
    max_abs = max(abs(low), abs(high))
    if max_abs <= 1.0:
        return snorm16()
    return covering(max_abs, torch.int16)


def default_qspec(
    observed: ObservedRange, *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> QuantizationSpec | None:
    """The default qspec of one graph input or output: ``None`` (left as it is) for a tensor that
    is not floating point, ``grid_qspec`` for a grid (see ``ObservedRange.is_grid``),
    ``value_qspec`` for anything else."""
    if not observed.dtype.is_floating_point:
        return None
    if observed.is_grid:
        return grid_qspec([observed])
    return value_qspec([observed], snorm8_min_abs=snorm8_min_abs)


@dataclass(frozen=True)
class DefaultQSpecs:
    """Qspecs chosen from the data for a ``BoundaryQuantizer``; its keyword arguments are
    ``kwargs()``: ``BoundaryQuantizer(base, **defaults.kwargs())``."""

    input_qspecs: tuple[QuantizationSpec | None, ...]
    output_qspecs: tuple[QuantizationSpec | None, ...]
    grid_sampler_image_qspec: QuantizationSpec
    grid_sampler_grid_qspec: QuantizationSpec
    grid_sampler_output_qspec: QuantizationSpec

    def kwargs(self) -> dict[str, Any]:
        """The ``BoundaryQuantizer`` keyword arguments (all five)."""
        return {
            "input_qspecs": self.input_qspecs,
            "output_qspecs": self.output_qspecs,
            "grid_sampler_image_qspec": self.grid_sampler_image_qspec,
            "grid_sampler_grid_qspec": self.grid_sampler_grid_qspec,
            "grid_sampler_output_qspec": self.grid_sampler_output_qspec,
        }


def default_qspecs(
    observation: RangeObservation, *, snorm8_min_abs: float = SNORM8_MIN_ABS
) -> DefaultQSpecs:
    """Every boundary's qspec chosen from ``observation``:

    - each graph input and output: ``default_qspec`` (grid-shaped inputs as grids);
    - grid samplers' grids (one qspec for all): ``grid_qspec`` over every sampler's grid;
    - grid samplers' images: ``value_qspec`` over every sampler's image (SNORM8 when all lie in
      [-1, 1], else observed int8, which each sampler observes for itself);
    - grid samplers' outputs: ``value_qspec`` over every sampler's image and output.

    Nothing chosen this way clips the calibration data (``saturation_report`` finds 0 values
    outside every fixed range chosen)."""
    images = observation.grid_sampler_images
    return DefaultQSpecs(
        input_qspecs=tuple(
            default_qspec(r, snorm8_min_abs=snorm8_min_abs) for r in observation.inputs
        ),
        output_qspecs=tuple(
            default_qspec(r, snorm8_min_abs=snorm8_min_abs) for r in observation.outputs
        ),
        grid_sampler_image_qspec=value_qspec(images, snorm8_min_abs=snorm8_min_abs),
        grid_sampler_grid_qspec=grid_qspec(observation.grid_sampler_grids),
        grid_sampler_output_qspec=value_qspec(
            images + observation.grid_sampler_outputs, snorm8_min_abs=snorm8_min_abs
        ),
    )


# -- saturation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saturation:
    """How much of the calibration data a fixed-parameter qspec clips at one place: ``count`` of
    the ``total`` values seen lie more than half a step outside ``[low, high]``, the qspec's
    representable range ``[(quant_min - zero_point) * scale, (quant_max - zero_point) * scale]``
    (a value within half a step of it rounds onto its end, losing no more than any rounding;
    non-finite values count as outside). ``suggested`` is the fixed qspec of the same width
    that covers every finite value seen (``covering``), ``None`` when there is none."""

    name: str
    qspec: str
    low: float
    high: float
    count: int
    total: int
    fraction: float
    observed_min: float
    observed_max: float
    suggested: QuantizationSpec | None = field(default=None, compare=False)

    def passes(self, threshold: float = SATURATION_THRESHOLD) -> bool:
        """True when at most ``threshold`` (0.1 %) of the values are clipped."""
        return self.fraction <= threshold

    def instead(self, threshold: float = SATURATION_THRESHOLD) -> QuantizationSpec | None:
        """The qspec to use instead when this one does not pass ``threshold`` (the covering one),
        else ``None``."""
        return None if self.passes(threshold) else self.suggested

    def message(self) -> str:
        """One line for a console warning or a report."""
        text = (
            f"{self.name}: {self.count} of {self.total} calibration values "
            f"({100 * self.fraction:.3g} %) lie more than half a step outside {self.qspec}'s range "
            f"[{self.low:.6g}, {self.high:.6g}] (observed [{self.observed_min:.6g}, "
            f"{self.observed_max:.6g}])"
        )
        if self.suggested is not None and self.count:
            text += f"; {describe_qspec(self.suggested)} covers them"
        return text

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (for report.json)."""
        return {
            "name": self.name,
            "qspec": self.qspec,
            "range": [self.low, self.high],
            "outside": self.count,
            "total": self.total,
            "fraction": self.fraction,
            "observed": [self.observed_min, self.observed_max],
            "passes": self.passes(),
            "instead": None if self.passes() else describe_qspec(self.suggested),
        }


def saturation(observed: ObservedRange, qspec: QuantizationSpec | None) -> Saturation | None:
    """How much of ``observed`` the fixed-parameter ``qspec`` clips; ``None`` for ``None`` (float)
    and for qspecs whose parameters calibration chooses (they cover what they observe). Counts
    exactly (see ``ObservedRange.count_outside``)."""
    if qspec is None or not is_fixed(qspec):
        return None
    params = fixed_qparams(qspec)
    count = observed.count_outside(*params.rounding_range)
    finite = observed.count > observed.nonfinite
    suggested = None
    if finite and observed.max_abs > 0:
        signed = torch.int8 if qspec.dtype == torch.uint8 else qspec.dtype
        suggested = covering(observed.max_abs, signed)
    return Saturation(
        name=observed.name,
        qspec=describe_qspec(qspec),
        low=params.low,
        high=params.high,
        count=count,
        total=observed.count,
        fraction=count / observed.count if observed.count else 0.0,
        observed_min=observed.min if finite else math.nan,
        observed_max=observed.max if finite else math.nan,
        suggested=suggested,
    )


def saturation_report(
    observation: RangeObservation, quantizer: BoundaryQuantizer
) -> tuple[Saturation, ...]:
    """``saturation`` for every fixed-parameter qspec ``quantizer`` puts at a graph input, a
    graph output, and each grid sampler's image, grid and output, in that order (float and
    observed qspecs are left out). Raises ``ValueError`` when the quantizer's qspec counts differ
    from the observation's inputs and outputs, or when a fixed range was not counted during
    observation (pass the qspecs to ``observe_ranges(count_outside=...)``)."""
    if not isinstance(quantizer, BoundaryQuantizer):
        raise TypeError(f"quantizer must be a BoundaryQuantizer, got {type(quantizer).__name__}")
    quantizer.check_counts(len(observation.inputs), len(observation.outputs))
    pairs: list[tuple[ObservedRange, QuantizationSpec | None]] = [
        *zip(observation.inputs, quantizer.input_qspecs, strict=True),
        *zip(observation.outputs, quantizer.output_qspecs, strict=True),
    ]
    for image, grid, output in zip(
        observation.grid_sampler_images,
        observation.grid_sampler_grids,
        observation.grid_sampler_outputs,
        strict=True,
    ):
        pairs += [
            (image, quantizer.grid_sampler_image_qspec),
            (grid, quantizer.grid_sampler_grid_qspec),
            (output, quantizer.grid_sampler_output_qspec),
        ]
    report = (saturation(observed, qspec) for observed, qspec in pairs)
    return tuple(s for s in report if s is not None)


def _origin(node: Node) -> Node:
    """The tensor a value is: through a dequantize, the value its quantize read."""
    for _ in range(8):
        if not is_dequantize(node) or not isinstance(node.args[0], Node):
            break
        quantized = node.args[0]
        if not is_quantize(quantized) or not isinstance(quantized.args[0], Node):
            break
        node = quantized.args[0]
    return node


def _readers(quantize: Node) -> list[Node]:
    """The ops that read ``quantize``'s output (through its dequantizes)."""
    readers: dict[str, Node] = {}
    for user in quantize.users:
        for target in list(user.users) if is_dequantize(user) else [user]:
            readers[target.name] = target
    return [readers[name] for name in sorted(readers)]


_CLAMPS: Final = frozenset({"aten::clamp", "aten::hardtanh", "aten::clip"})


def _clamps_anyway(readers: list[Node], low: float, high: float) -> bool:
    """Every reader is a clamp to a range within ``[low, high]``: what the quantization
    clamps, the model clamps itself (the flow-warp demo's output ``clamp(x, -1, 1)`` read at
    SNORM8), so nothing is lost."""
    if not readers:
        return False
    for reader in readers:
        if target_name(reader).removesuffix(".default") not in _CLAMPS:
            return False
        bounds = [reader.args[k] if len(reader.args) > k else None for k in (1, 2)]
        if not all(isinstance(b, int | float) for b in bounds):
            return False
        lowest, highest = (float(b) for b in bounds)  # type: ignore[arg-type]
        if lowest < low or highest > high:
            return False
    return True


def clipping_report(
    converted: GraphModule,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    *,
    fixed: Iterable[QuantizationSpec] | None = None,
    on_sample: OnSample | None = None,
    watch: Iterable[str] = (),
) -> tuple[Saturation, ...]:
    """Every quantization inside ``converted`` (a PT2E ``convert_pt2e`` result) that clips
    calibration data, whatever chose its parameters: the backend's quantizer sharing one scale
    over a concatenation, a fixed qspec propagated along a chain, a requantization into a
    narrower range. Runs ``converted`` on every sample and, at each ``quantize_per_tensor``
    node, counts the values that lie more than half a step outside its representable range
    (those are clamped, not rounded). Graph inputs and grid-sampler outputs are left out
    (``saturation_report`` covers them). With ``fixed``, only quantizations with the parameters
    of one of those fixed qspecs are checked (an observer's choice, such as a histogram
    observer trimming outliers, is calibration's business). Returns one ``Saturation`` per
    clipping quantization (none when nothing clips), named by the tensor and the ops that read
    it (no suggested qspec: the parameters were not given there; widen the fixed qspec they
    were shared from, or leave it to calibration). ``watch``: names of tensors whose
    quantizations are always checked and reported, clipping or not, whatever their parameters
    (``BoundaryQuantizer.coordinate_inputs``: a predicted flow in pixels, which a fixed
    SNORM8 range would clip); they are named ``"coordinate input <name>"``."""
    if not isinstance(converted, GraphModule):
        raise TypeError(f"converted must be a GraphModule, got {type(converted).__name__}")
    samples = [tuple(sample) for sample in calibration]
    watched_names = set(watch)
    wanted = None
    if fixed is not None:
        wanted = set()
        for qspec in fixed:
            params = fixed_qparams(qspec)
            wanted.add(
                (
                    float(np.float32(params.scale)),
                    params.zero_point,
                    params.quant_min,
                    params.quant_max,
                )
            )
    watched: dict[Node, list[_Accumulator]] = {}
    sites: list[tuple[_Accumulator, float, int, int, int, str, bool]] = []
    for node in converted.graph.nodes:
        if not is_quantize(node) or len(node.args) < 6:
            continue
        source = node.args[0]
        if not isinstance(source, Node) or source.op == "placeholder" or is_grid_sampler(source):
            continue
        scale, zero_point = float(node.args[1]), int(node.args[2])
        quant_min, quant_max = int(node.args[3]), int(node.args[4])
        key = (float(np.float32(scale)), zero_point, quant_min, quant_max)
        always = _origin(source).name in watched_names
        if wanted is not None and key not in wanted and not always:
            continue
        half = scale / 2
        bounds = ((quant_min - zero_point) * scale - half, (quant_max - zero_point) * scale + half)
        readers = _readers(node)
        low, high = (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
        if _clamps_anyway(readers, low - half, high + half) and not always:
            continue
        kind = "coordinate input" if always else "tensor"
        name = f"{kind} {_origin(source).name}" + (
            f" (as read by {', '.join(r.name for r in readers)})" if readers else ""
        )
        accumulator = _Accumulator(name, "internal", len(sites), source, (bounds,))
        watched.setdefault(source, []).append(accumulator)
        dtype = str(node.args[5]).removeprefix("torch.")
        sites.append((accumulator, scale, zero_point, quant_min, quant_max, dtype, always))
    interpreter = _RangeInterpreter(converted, watched)
    with torch.no_grad():
        for done, sample in enumerate(samples, start=1):
            interpreter.run(*sample)
            if on_sample is not None:
                on_sample(done, len(samples))
    report = []
    for accumulator, scale, zero_point, quant_min, quant_max, dtype, always in sites:
        (bounds,) = accumulator.ranges
        observed = accumulator.result()
        count = observed.count_outside(*bounds)
        if not count and not always:
            continue
        finite = observed.count > observed.nonfinite
        report.append(
            Saturation(
                name=observed.name,
                qspec=f"{dtype}, scale {scale:.6g}, zero point {zero_point}",
                low=(quant_min - zero_point) * scale,
                high=(quant_max - zero_point) * scale,
                count=count,
                total=observed.count,
                fraction=count / observed.count if observed.count else 0.0,
                observed_min=observed.min if finite else math.nan,
                observed_max=observed.max if finite else math.nan,
                suggested=None,  # its parameters come from elsewhere: nothing to set here
            )
        )
    return tuple(sorted(report, key=lambda r: -r.fraction))


def boundary_fixed_qspecs(
    quantizer: BoundaryQuantizer,
) -> tuple[QuantizationSpec, ...]:
    """The fixed-parameter qspecs ``quantizer`` uses, for ``observe_ranges(count_outside=...)``."""
    qspecs = [
        *quantizer.input_qspecs,
        *quantizer.output_qspecs,
        quantizer.grid_sampler_image_qspec,
        quantizer.grid_sampler_grid_qspec,
        quantizer.grid_sampler_output_qspec,
    ]
    return tuple(q for q in qspecs if q is not None and is_fixed(q))
