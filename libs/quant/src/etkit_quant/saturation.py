"""What fixed quantization parameters clip of the calibration data: ``saturation`` /
``saturation_report`` for every fixed-parameter qspec at a boundary or grid sampler (from the
observed ranges, with the covering qspec to use instead past ``SATURATION_THRESHOLD``), and
``clipping_report`` for every quantization inside a converted graph."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant.boundary import BoundaryQuantizer
from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize, target_name
from etkit_quant.narrow_ranges import KEPT_RANGE_KEY
from etkit_quant.qspecs import covering, describe_qspec, fixed_qparams, is_fixed
from etkit_quant.ranges import ObservedRange, RangeObservation, _Accumulator, _RangeInterpreter
from etkit_quant.samples import OnSample

SATURATION_THRESHOLD: Final = 0.001
"""The largest fraction of calibration values a fixed qspec may clip before it is reported as
failing (0.1 %)."""


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
    """The ops that read ``quantize``'s output (through its dequantizes, and through the clamp
    ``narrow_ranges`` keeps a range with)."""
    readers: dict[str, Node] = {}
    for user in quantize.users:
        for target in list(user.users) if is_dequantize(user) else [user]:
            if target.meta.get(KEPT_RANGE_KEY):  # narrow_ranges' clamp: its quantize's readers
                kept = [u for u in target.users if is_quantize(u)]
                readers.update((r.name, r) for q in kept for r in _readers(q))
            else:
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
