"""The verdict's judgement: whether a tensor of the written program differs from the quantized
PT2E model's (the program's own definition) by no more than legitimate rounding does.

The yardstick is the rounding envelope (``check.envelope``): the quantized model rerun with
each activation quantize rounding to the other neighbour near its rounding boundary, as a
correct integer backend may. Per tensor, in steps of its scale (a float tensor: in 1/255 of
its range), with ``D`` the program's difference from the quantized model and ``D_k`` each
envelope run's:

- power: ``mean(D^2)`` at most the 99.9 % prediction bound of the envelope's ``mean(D_k^2)``
  (and at least what the halves-rounding runs give, and one value one step off);
- bias: ``|mean(D)|`` at most the prediction bound of the envelope's ``|mean(D_k)|`` (or the
  halves-rounding runs'), plus three standard errors of the program's own mean (a 4-logit
  output's mean wanders by more than a picture's);
- ``max_steps``, when the tolerance sets it: no value further;
- structured bias (an output's ``regions``, ``structured_regions``): the mean difference in
  each output channel, in the top and bottom value bands (the last ``BAND_STEPS`` steps of the
  range, where a wrong clamp shows) and in the image's border ring (``RING_PX`` pixels) at most
  the prediction bound of the envelope runs' means there plus three of the envelope's own
  standard errors there (not the program's: a noisier program earns no looser bound), and
  never less than one value one step off. A loop compounds what one frame hides.

No rule accepts a difference without bounding it. A float export (no quantization) has no
envelope: its outputs are held to ``float_min_psnr_db`` against the float model and to the bias
rule with three standard errors.

An envelope run is judged by its figures alone (``RunFigures``: power, mean, largest
difference), so a run can be reduced to them as it finishes (``output_reducer``) and a
verification at 1080p keeps three numbers per run and tensor, never the runs' tensors: the
same figures as from the tensors, in the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from etkit_exporter.artifact.verdict_text import QUANTIZED_REFERENCE
from etkit_exporter.check.envelope import Envelope, OutputReducer, prediction_bound
from etkit_exporter.check.metrics import psnr
from etkit_exporter.check.tolerance import VerifyTolerance

_SE: Final = 3.0  # standard errors of the program's own mean the bias rule allows
_FLOAT_UNITS: Final = 255.0  # a float tensor is judged in 1/255 of its range (an 8-bit step)
# float32 arithmetic in two orders: a float tensor's mean may differ by this many units unbiased
_FLOAT_NOISE: Final = 1e-3
# Relative slack on the bounds: a step measured on float32 dequantized values reads 1 +- 1e-6
# or so (seed 6017: one of two values one step off gave a power of 0.5000013 against the bound
# of one value one step off, 0.5); a thousandth of a bound is far below any step.
_FLOAT32_SLACK: Final = 1e-3


def _moments(difference: torch.Tensor) -> tuple[float, float, float]:
    """Power (mean square), mean and the standard error of the mean of a difference."""
    n = difference.numel()
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(difference.mean())
    spread = float(difference.std(unbiased=False)) if n > 1 else 0.0
    return float((difference * difference).mean()), mean, spread / math.sqrt(n)


@dataclass(frozen=True)
class RunFigures:
    """What the judgement reads of one envelope run's tensor against the reference, in units:
    the power and mean of the difference, the largest difference, and per structured region
    (``structured_regions``) the mean and its standard error."""

    power: float
    mean: float
    max_units: float
    regions: tuple[tuple[float, float], ...] = ()


BAND_STEPS: Final = 3  # the top and bottom value bands: this many steps from the range's ends
RING_PX: Final = 2  # the border ring's width
MIN_REGION: Final = 32  # values a region needs to be judged on its own
MAX_CHANNELS: Final = 64  # an output of more channels is judged per band and ring only


@dataclass(frozen=True)
class Region:
    """A part of an output judged for bias on its own: ``name`` ("channel 2", "top band",
    "border ring") and ``mask`` (of the output's shape) or ``channel``."""

    name: str
    size: int
    mask: torch.Tensor | None = None
    channel: int | None = None

    def values(self, difference: torch.Tensor) -> torch.Tensor:
        if self.channel is not None:
            return difference[:, self.channel].reshape(-1)
        assert self.mask is not None
        return difference[self.mask]


def structured_regions(reference: torch.Tensor, entry: Mapping[str, Any]) -> list[Region]:
    """The regions of an output (``reference``, real values; ``entry`` its io_quant_params.json
    entry) judged for bias on their own: each channel (2 to ``MAX_CHANNELS``), the values within
    ``BAND_STEPS`` steps of the quantization range's ends (a float output: of the reference's
    range, in 1/255), the ``RING_PX`` border ring of an image (4-D, at least 8 x 8); each of at
    least ``MIN_REGION`` values."""
    regions: list[Region] = []
    if reference.dim() >= 2 and 2 <= reference.shape[1] <= MAX_CHANNELS:
        count = reference.numel() // reference.shape[1]
        if count >= MIN_REGION:
            regions += [Region(f"channel {c}", count, channel=c) for c in range(reference.shape[1])]
    scale = entry.get("scale")
    if scale is not None and entry.get("quant_min") is not None:
        zero = float(entry.get("zero_point") or 0)
        low = (float(entry["quant_min"]) - zero + BAND_STEPS) * float(scale)
        high = (float(entry["quant_max"]) - zero - BAND_STEPS) * float(scale)
    elif scale is not None:  # a range not given: the reference's ends
        low = float(reference.min()) + BAND_STEPS * float(scale) if reference.numel() else 0.0
        high = float(reference.max()) - BAND_STEPS * float(scale) if reference.numel() else 0.0
    else:
        peak = float(reference.max() - reference.min()) if reference.numel() else 0.0
        low = float(reference.min()) + BAND_STEPS * peak / _FLOAT_UNITS if peak else -math.inf
        high = float(reference.max()) - BAND_STEPS * peak / _FLOAT_UNITS if peak else math.inf
    for name, mask in (("top band", reference >= high), ("bottom band", reference <= low)):
        size = int(mask.sum())
        if size >= MIN_REGION:
            regions.append(Region(name, size, mask=mask))
    if reference.dim() == 4 and min(reference.shape[-2:]) >= 4 * RING_PX + 4:
        ring = torch.ones(reference.shape, dtype=torch.bool)
        ring[..., RING_PX:-RING_PX, RING_PX:-RING_PX] = False
        regions.append(Region("border ring", int(ring.sum()), mask=ring))
    return regions


def _region_moments(
    difference: torch.Tensor, regions: Sequence[Region]
) -> tuple[tuple[float, float], ...]:
    """Per region: the mean of ``difference`` (of the output's shape) there and its standard
    error."""
    figures = []
    for region in regions:
        _, mean, standard_error = _moments(region.values(difference))
        figures.append((mean, standard_error))
    return tuple(figures)


def judge_unit(reference: torch.Tensor, scale: float | None) -> float:
    """The unit a tensor is judged in: its ``scale``, or for a float tensor (``None``) 1/255 of
    the reference's range."""
    r = reference.double().reshape(-1)
    peak = float(r.max() - r.min()) if r.numel() else 0.0
    return scale if scale is not None else (peak or 1.0) / _FLOAT_UNITS


def run_figures(
    run: torch.Tensor,
    reference: torch.Tensor,
    unit: float,
    regions: Sequence[Region] = (),
    shape: Sequence[int] | None = None,
) -> RunFigures:
    """One envelope run's ``RunFigures`` (``run`` and ``reference``: real values of one size;
    ``regions`` of the output's ``shape``)."""
    r = reference.double().reshape(-1)
    e = run.double().reshape(-1)
    difference = (e - r) / unit
    power, mean, _ = _moments(difference)
    largest = float((e - r).abs().max() / unit) if r.numel() else 0.0
    parts = _region_moments(difference.reshape(tuple(shape)), regions) if regions and shape else ()
    return RunFigures(power, mean, largest, parts)


def judge_tensor(
    actual: torch.Tensor,
    reference: torch.Tensor,
    scale: float | None,
    tolerance: VerifyTolerance,
    *,
    envelope: Sequence[torch.Tensor | RunFigures] = (),
    modes: Sequence[torch.Tensor | RunFigures] = (),
    float_reference: bool = False,
    regions: Sequence[Region] = (),
) -> dict[str, Any]:
    """``actual`` against ``reference`` (real values of one shape) with the envelope's runs of
    the same tensor (``envelope``: the dithered runs, ``modes``: the halves-rounding runs; each
    its values or its ``RunFigures``; see the module docstring), in steps of ``scale``
    (``None``: a float tensor, judged in 1/255 of the reference's range). Without an envelope
    (a float export, ``float_reference``) the PSNR floor and the bias rule decide. Returns the
    figures, ``passes`` and, when it does not, ``reasons`` (one line each)."""
    a, r = actual.double().reshape(-1), reference.double().reshape(-1)
    unit = judge_unit(r, scale)
    difference = (a - r) / unit
    n = difference.numel()
    power, mean, standard_error = _moments(difference)
    shape = tuple(reference.shape)
    parts = _region_moments(difference.reshape(shape), regions) if regions else ()
    result: dict[str, Any] = {
        "psnr_db": psnr(a, r),
        "max_abs_error": float((a - r).abs().max()) if n else 0.0,
        "max_steps": float(difference.abs().max()) if n else 0.0,
        "mean_steps": mean,
        "power_steps2": power,
        "unit": "steps" if scale is not None else "1/255 of the range",
    }
    del a, difference
    if scale is not None:
        result["max_steps"] = round(result["max_steps"])
    reasons: list[str] = []
    name = "steps" if scale is not None else "units"
    if len(envelope) >= 2:
        runs = [_figures(e, r, unit, regions, shape) for e in envelope]
        mode_runs = [_figures(e, r, unit, regions, shape) for e in modes]
        power_bound = max(
            prediction_bound([run.power for run in runs]),
            max((run.power for run in mode_runs), default=0.0),
            1.0 / max(n, 1),  # one value one step off
        )
        bias_bound = (
            max(
                prediction_bound([abs(run.mean) for run in runs]),
                max((abs(run.mean) for run in mode_runs), default=0.0),
            )
            + _SE * standard_error
        )
        result.update(
            {
                "envelope_power_steps2": sum(run.power for run in runs) / len(runs),
                "power_bound_steps2": power_bound,
                "bias_bound_steps": bias_bound,
                "envelope_max_steps": max(run.max_units for run in runs),
            }
        )
        if power > power_bound * (1 + _FLOAT32_SLACK):
            reasons.append(
                f"error power {power:.4g} {name}^2 (the rounding envelope allows {power_bound:.3g})"
            )
        if parts and all(len(run.regions) == len(parts) for run in (*runs, *mode_runs)):
            structured = _judge_regions(regions, parts, runs, mode_runs, name)
            result["structured_bias"] = structured["figures"]
            reasons += structured["reasons"]
    else:
        bias_bound = _SE * standard_error + (_FLOAT_NOISE if scale is None else 0.0)
        result["bias_bound_steps"] = bias_bound
        floor = tolerance.float_min_psnr_db
        if float_reference and result["psnr_db"] is not None and result["psnr_db"] < floor:
            reasons.append(f"PSNR {result['psnr_db']:.2f} dB (at least {floor:g} dB)")
    if abs(mean) > bias_bound * (1 + _FLOAT32_SLACK):
        result["biased"] = True
        reasons.append(f"mean error {mean:+.3g} {name} (at most {bias_bound:.3g} either way)")
    if tolerance.max_steps is not None and result["max_steps"] > tolerance.max_steps:
        reasons.append(f"{result['max_steps']:g} {name} off (at most {tolerance.max_steps})")
    result["passes"] = not reasons
    if reasons:
        result["reasons"] = reasons
    return result


def _figures(
    run: torch.Tensor | RunFigures,
    reference: torch.Tensor,
    unit: float,
    regions: Sequence[Region] = (),
    shape: Sequence[int] | None = None,
) -> RunFigures:
    if isinstance(run, RunFigures):
        return run
    return run_figures(run, reference, unit, regions, shape)


def _judge_regions(
    regions: Sequence[Region],
    parts: Sequence[tuple[float, float]],
    runs: Sequence[RunFigures],
    mode_runs: Sequence[RunFigures],
    name: str,
) -> dict[str, Any]:
    """The structured bias rule (module docstring) over ``regions``: the program's mean there
    (``parts``) against the envelope runs'. Returns per region its figures and the reasons."""
    figures, reasons = [], []
    for j, region in enumerate(regions):
        mean = parts[j][0]
        envelope_se = sum(run.regions[j][1] for run in runs) / len(runs)
        bound = (
            max(
                prediction_bound([abs(run.regions[j][0]) for run in runs]),
                max((abs(run.regions[j][0]) for run in mode_runs), default=0.0),
            )
            + _SE * envelope_se
        )
        figures.append({"region": region.name, "mean": mean, "bound": bound})
        bound = max(bound, 1.0 / region.size)  # one value one step off
        if abs(mean) > bound * (1 + _FLOAT32_SLACK):
            reasons.append(
                f"mean error {mean:+.3g} {name} in the {region.name} (at most {bound:.3g} "
                "either way)"
            )
    return {"figures": figures, "reasons": reasons}


# ---------------------------------------------------------------------------------------------
# The verdict on the outputs


def output_reducer(
    references: Sequence[torch.Tensor], io_outputs: Sequence[Mapping[str, Any]]
) -> OutputReducer:
    """What an envelope run keeps of output ``index``: its ``RunFigures`` against the quantized
    model's output (``references``), in the unit ``judge_outputs`` judges it in."""
    flat = [ref.double().reshape(-1) for ref in references]  # once, not once a run
    units = [
        judge_unit(ref, _output_step(entry)) for ref, entry in zip(flat, io_outputs, strict=True)
    ]
    parts = [structured_regions(ref, e) for ref, e in zip(references, io_outputs, strict=True)]
    shapes = [tuple(ref.shape) for ref in references]

    def reduce(index: int, value: torch.Tensor) -> RunFigures:
        real = _real(value, io_outputs[index])
        return run_figures(real, flat[index], units[index], parts[index], shapes[index])

    return reduce


def judge_outputs(
    actual: Sequence[torch.Tensor],
    references: Sequence[torch.Tensor],
    io_outputs: Sequence[Mapping[str, Any]],
    tolerance: VerifyTolerance,
    *,
    envelope: Envelope | None = None,
    float_export: bool = False,
) -> dict[str, Any]:
    """report.json's ``verification["verdict"]``: each program output (dequantized, in any
    layout of the reference's shape) against the quantized PT2E model's (``references``), with
    the scale of ``io_outputs`` (``io_quant_params.json``'s) and the rounding ``envelope`` of
    those outputs (their values, or ``output_reducer``'s figures). ``{"result": "pass" |
    "fail", "tolerance": {...}, "outputs": [...], "failing_outputs": [...], "divergence":
    None}``."""
    outputs = []
    for index, (y, ref, entry) in enumerate(zip(actual, references, io_outputs, strict=True)):
        y = y.contiguous().reshape(ref.shape)
        step = _output_step(entry)
        dithered, modes = envelope.outputs(index) if envelope is not None else ([], [])
        judged = judge_tensor(
            y,
            ref,
            step,
            tolerance,
            envelope=[_real(e, entry) for e in dithered],
            modes=[_real(e, entry) for e in modes],
            float_reference=float_export,
            regions=structured_regions(ref, entry),
        )
        outputs.append({"output": index, "reference": QUANTIZED_REFERENCE, **judged})
    failing = [o for o in outputs if not o["passes"]]
    verdict: dict[str, Any] = {
        "result": "fail" if failing else "pass",
        "tolerance": tolerance.as_dict(),
        "outputs": outputs,
        "failing_outputs": [o["output"] for o in failing],
        "divergence": None,
    }
    if envelope is not None:
        verdict["envelope"] = {
            "samples": len(envelope.dithered),
            "band_steps": envelope.band,
            "dithered_quantizes": envelope.dithered_quantizes,
        }
    return verdict


def _real(value: Any, entry: Mapping[str, Any]) -> Any:
    """An envelope run's output as the reference gives it (the quantized model's outputs are
    real values; an integer one is dequantized with its IO parameters); figures pass."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype.is_floating_point or entry.get("scale") is None:
        return value
    return (value.double() - float(entry.get("zero_point") or 0)) * float(entry["scale"])


def _output_step(entry: Mapping[str, Any]) -> float | None:
    """The step a program output is judged in (its scale), from its ``io_quant_params.json``
    entry; ``None`` for a float output."""
    scale = entry.get("scale")
    return None if scale is None else float(scale)
