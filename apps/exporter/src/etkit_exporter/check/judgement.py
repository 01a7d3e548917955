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
- ``max_steps``, when the tolerance sets it: no value further.

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
    the power and mean of the difference, and the largest difference."""

    power: float
    mean: float
    max_units: float


def judge_unit(reference: torch.Tensor, scale: float | None) -> float:
    """The unit a tensor is judged in: its ``scale``, or for a float tensor (``None``) 1/255 of
    the reference's range."""
    r = reference.double().reshape(-1)
    peak = float(r.max() - r.min()) if r.numel() else 0.0
    return scale if scale is not None else (peak or 1.0) / _FLOAT_UNITS


def run_figures(run: torch.Tensor, reference: torch.Tensor, unit: float) -> RunFigures:
    """One envelope run's ``RunFigures`` (``run`` and ``reference``: real values of one size)."""
    r = reference.double().reshape(-1)
    e = run.double().reshape(-1)
    power, mean, _ = _moments((e - r) / unit)
    largest = float((e - r).abs().max() / unit) if r.numel() else 0.0
    return RunFigures(power, mean, largest)


def judge_tensor(
    actual: torch.Tensor,
    reference: torch.Tensor,
    scale: float | None,
    tolerance: VerifyTolerance,
    *,
    envelope: Sequence[torch.Tensor | RunFigures] = (),
    modes: Sequence[torch.Tensor | RunFigures] = (),
    float_reference: bool = False,
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
        runs = [_figures(e, r, unit) for e in envelope]
        mode_runs = [_figures(e, r, unit) for e in modes]
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


def _figures(run: torch.Tensor | RunFigures, reference: torch.Tensor, unit: float) -> RunFigures:
    return run if isinstance(run, RunFigures) else run_figures(run, reference, unit)


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

    def reduce(index: int, value: torch.Tensor) -> RunFigures:
        return run_figures(_real(value, io_outputs[index]), flat[index], units[index])

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
