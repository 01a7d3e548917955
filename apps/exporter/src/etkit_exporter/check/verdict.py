"""The verdict of a verification: whether each output of the written program is close enough to
the quantized PT2E model (the program's own definition), and, when one is not, the first delegate
call whose output diverges from that model's value of the same tensor.

The tolerance (``VerifyTolerance``) is written down in apps/exporter/README.md ("Verification
verdict") with its reasoning. In short, for an integer output in steps of its scale, all of:

- PSNR against the quantized PT2E model of at least ``min_psnr_db`` (a scrambled or wrong
  output is 8-32 dB; rounding differences along a network leave 44 dB and more), unless no
  value is more than one step off (rounding, however few steps the tensor spans);
- at most ``max_fraction`` of the values more than ``steps`` steps off (a warp by a flow one
  step off moves a few textured pixels by many steps: RAFT's warped frame 26 steps at a few
  pixels; a kernel that is wrong is wrong nearly everywhere);
- a mean signed error of at most ``max_bias_steps`` steps, plus three standard errors of that
  mean (rounding differences are as often up as down; a kernel or layout that shifts values is
  not; the standard error lets a few values, a classifier's logits, round one way together).

An integer output outside the first two rules, but unbiased, passes when it is no further from
the float model than the quantized PT2E model is, by ``float_margin_db`` (accumulated rounding:
``accept_accumulated_rounding``).

A float output is judged the same way with ``float_error`` (a fraction of the reference's range)
in place of ``steps`` (no bias rule); in a float export (no quantization), whose reference is
the float model itself, its PSNR floor is ``float_min_psnr_db``.

``etkit run model.bpte`` checks a bundled program's outputs by the same rule
(``within_tolerance``: at most a fraction of the values more than k steps off), with the bundle's
own tolerance (k = 0 steps, no value off: the integer paths are exact).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

import torch
from executorch.devtools import Inspector
from executorch.devtools.etrecord import parse_etrecord

from etkit_exporter.artifact.etrecord import ETRECORD_NAME, INSTRUCTION_MAP_NAME
from etkit_exporter.artifact.staging import check_destination
from etkit_exporter.artifact.verdict_text import QUANTIZED_REFERENCE, verdict_lines
from etkit_exporter.check.metrics import psnr, within_tolerance
from etkit_exporter.check.references import (
    conditional_values,
    quantize_qparams,
    reference_values,
)
from etkit_exporter.core.errors import ExportError
from etkit_exporter.core.io_params import program_input
from etkit_exporter.programs.runtime import run_with_etdump

FAILED_SUFFIX: Final = ".failed-verification"
_BIAS_ERRORS: Final = 3.0  # standard errors of the mean the bias rule allows beyond its limit
# The quantized PT2E model at least this close to the float model (PSNR) for the float model to
# be the yardstick of accumulated rounding (``accept_accumulated_rounding``)
_ANCHOR_DB: Final = 20.0


@dataclass(frozen=True)
class VerifyTolerance:
    """How far an output of the written program may be from the quantized PT2E model (see the
    module docstring and the README). Give it as ``export_model(verify_tolerance=...)``, or as
    text (``parse_tolerance``: ``"psnr=36,steps=2,fraction=0.1"``) to ``--verify-tolerance`` and
    ``verify_tolerance`` in ``export.toml``."""

    min_psnr_db: float = 36.0
    steps: int = 2
    max_fraction: float = 0.10
    max_bias_steps: float = 0.5
    float_error: float = 0.02
    float_min_psnr_db: float = 60.0
    float_margin_db: float | None = 1.0  # None: no accumulated-rounding rule

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name == "float_margin_db":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"VerifyTolerance.{item.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"VerifyTolerance.{item.name} must be a finite number >= 0, got {value!r}"
                )
        if int(self.steps) != self.steps:
            raise ValueError(f"VerifyTolerance.steps must be a whole number, got {self.steps!r}")
        if self.max_fraction > 1:
            raise ValueError(
                f"VerifyTolerance.max_fraction is a fraction (0..1), got {self.max_fraction!r}"
            )

    def as_dict(self) -> dict[str, float | None]:
        return {k: None if v is None else float(v) for k, v in asdict(self).items()}

    def text(self) -> str:
        """The tolerance as ``parse_tolerance`` reads it."""
        values = self.as_dict()
        return ",".join(
            f"{key}={'off' if values[name] is None else format(values[name], 'g')}"
            for key, name in TOLERANCE_KEYS.items()
        )


# The keys of the text form and the fields they set
TOLERANCE_KEYS: Final = {
    "psnr": "min_psnr_db",
    "steps": "steps",
    "fraction": "max_fraction",
    "bias": "max_bias_steps",
    "float-error": "float_error",
    "float-psnr": "float_min_psnr_db",
    "float-margin": "float_margin_db",
}


def parse_tolerance(text: str) -> VerifyTolerance:
    """A ``VerifyTolerance`` from ``key=value`` pairs separated by commas (keys: psnr, steps,
    fraction, bias, float-error, float-psnr, float-margin, which also takes ``off``; each one
    left out keeps its default); ``ValueError`` naming the wrong pair otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"a verify tolerance is text such as 'psnr=36,steps=2', got {text!r}")
    values: dict[str, float | None] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, number = (s.strip() for s in pair.partition("="))
        key = key.replace("_", "-")
        if not sep or key not in TOLERANCE_KEYS:
            raise ValueError(
                f"verify tolerance {text!r}: {pair!r} is not KEY=NUMBER with KEY one of "
                f"{', '.join(TOLERANCE_KEYS)} (e.g. 'psnr=36,steps=2,fraction=0.1')"
            )
        if key == "float-margin" and number == "off":
            values[TOLERANCE_KEYS[key]] = None
            continue
        if key == "fraction" and number.endswith("%"):
            number, scale = number[:-1], 0.01
        else:
            scale = 1.0
        try:
            values[TOLERANCE_KEYS[key]] = float(number) * scale
        except ValueError:
            raise ValueError(f"verify tolerance {text!r}: {number!r} is not a number") from None
    if "steps" in values:
        steps = values["steps"]
        if steps is None or steps != int(steps):
            raise ValueError(f"verify tolerance {text!r}: steps must be a whole number")
        values["steps"] = int(steps)
    try:
        return VerifyTolerance(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ValueError(f"verify tolerance {text!r}: {error}") from None


def check_tolerance(value: object) -> VerifyTolerance:
    """``value`` as a ``VerifyTolerance``: ``None`` (the defaults), one, or its text."""
    if value is None:
        return VerifyTolerance()
    if isinstance(value, VerifyTolerance):
        return value
    if isinstance(value, str):
        return parse_tolerance(value)
    raise TypeError(
        f"verify_tolerance must be a VerifyTolerance or text such as 'psnr=36,steps=2', got "
        f"{type(value).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# Judging one tensor


def judge_tensor(
    actual: torch.Tensor,
    reference: torch.Tensor,
    scale: float | None,
    tolerance: VerifyTolerance,
    *,
    float_reference: bool = False,
) -> dict[str, Any]:
    """``actual`` against ``reference`` (both real values, the same shape): PSNR, max abs error,
    and, with ``scale`` (an integer tensor's step), the steps apart (max, share more than
    ``tolerance.steps`` off, mean signed error); without, the share further than
    ``tolerance.float_error`` of the reference's range. ``float_reference``: the reference is
    the float model (a float export), so the float PSNR floor applies. Returns the figures,
    ``passes`` and, when it does not, ``reasons`` (one line each)."""
    a, r = actual.double().reshape(-1), reference.double().reshape(-1)
    difference = a - r
    db = psnr(a, r)
    result: dict[str, Any] = {
        "psnr_db": db,
        "max_abs_error": float(difference.abs().max()) if difference.numel() else 0.0,
    }
    reasons: list[str] = []
    if scale is not None:
        signed = torch.round(difference / scale)
        off = signed.abs()
        result["max_steps"] = int(off.max()) if off.numel() else 0
        result["fraction_over"] = (
            float((off > tolerance.steps).double().mean()) if off.numel() else 0.0
        )
        result["mean_steps"] = float(signed.mean()) if off.numel() else 0.0
        # The mean of n rounding differences wanders by std/sqrt(n): on a 4-value output
        # (logits) three values a step down is rounding, on a picture it is a shift.
        spread = float(signed.std(unbiased=False)) if off.numel() > 1 else 0.0
        bias_limit = tolerance.max_bias_steps + _BIAS_ERRORS * spread / math.sqrt(
            max(off.numel(), 1)
        )
        floor = tolerance.min_psnr_db
        if not within_tolerance(
            int((off > tolerance.steps).sum()), off.numel(), tolerance.max_fraction
        ):
            reasons.append(
                f"{100 * result['fraction_over']:.3g} % of values more than {tolerance.steps} "
                f"steps off (at most {100 * tolerance.max_fraction:g} %)"
            )
        if abs(result["mean_steps"]) > bias_limit:
            result["biased"] = True
            reasons.append(
                f"mean error {result['mean_steps']:+.3g} steps (at most "
                f"{tolerance.max_bias_steps:g} either way, {bias_limit:.3g} over "
                f"{off.numel()} values)"
            )
    else:
        peak = float(r.max() - r.min()) if r.numel() else 0.0
        limit = tolerance.float_error * (peak or 1.0)
        off = difference.abs()
        result["fraction_over"] = float((off > limit).double().mean()) if off.numel() else 0.0
        floor = tolerance.float_min_psnr_db if float_reference else tolerance.min_psnr_db
        if not within_tolerance(int((off > limit).sum()), off.numel(), tolerance.max_fraction):
            reasons.append(
                f"{100 * result['fraction_over']:.3g} % of values more than "
                f"{100 * tolerance.float_error:g} % of the reference's range off (at most "
                f"{100 * tolerance.max_fraction:g} %)"
            )
    # Within one step everywhere is rounding, whatever the PSNR: a tensor whose values span a
    # few steps (RAFT's correlation lookups) is 33 dB from its reference at one step.
    rounding_only = scale is not None and result["max_steps"] <= 1
    if db is not None and db < floor and not rounding_only:
        reasons.insert(0, f"PSNR {db:.2f} dB (at least {floor:g} dB)")
    result["passes"] = not reasons
    if reasons:
        result["reasons"] = reasons
    return result


# ---------------------------------------------------------------------------------------------
# The verdict on the outputs


def judge_outputs(
    actual: Sequence[torch.Tensor],
    references: Sequence[torch.Tensor],
    io_outputs: Sequence[Mapping[str, Any]],
    tolerance: VerifyTolerance,
    *,
    float_export: bool = False,
    float_references: Sequence[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """report.json's ``verification["verdict"]``: each program output (dequantized, in any
    layout of the reference's shape) against the quantized PT2E model's (``references``), with
    the scale of ``io_outputs`` (``io_quant_params.json``'s). With ``float_references`` (the
    float model's outputs), an integer output that misses the PSNR or share rule but is not
    biased passes when it is as close to the float model as the quantized PT2E model is
    (``accept_accumulated_rounding``). ``{"result": "pass" | "fail", "tolerance": {...},
    "outputs": [...], "failing_outputs": [...], "divergence": None}``."""
    outputs = []
    floats = float_references if float_references is not None else [None] * len(references)
    for index, (y, ref, entry, fref) in enumerate(
        zip(actual, references, io_outputs, floats, strict=True)
    ):
        y = y.contiguous().reshape(ref.shape)
        step = _output_step(entry)
        judged = judge_tensor(y, ref, step, tolerance, float_reference=float_export)
        if fref is not None and step is not None and not float_export:
            judged = accept_accumulated_rounding(judged, y, ref, fref.reshape(ref.shape), tolerance)
        outputs.append({"output": index, "reference": QUANTIZED_REFERENCE, **judged})
    failing = [o for o in outputs if not o["passes"]]
    return {
        "result": "fail" if failing else "pass",
        "tolerance": tolerance.as_dict(),
        "outputs": outputs,
        "failing_outputs": [o["output"] for o in failing],
        "divergence": None,
    }


def accept_accumulated_rounding(
    judged: dict[str, Any],
    actual: torch.Tensor,
    reference: torch.Tensor,
    float_reference: torch.Tensor,
    tolerance: VerifyTolerance,
) -> dict[str, Any]:
    """``judged`` (``judge_tensor``'s figures for an integer output against the quantized PT2E
    model) with the output's PSNR against the float model and the PT2E model's, and, when it
    failed on PSNR or on the share of values off but not on bias, passing if the program is no
    further from the float model than the PT2E model is, by ``tolerance.float_margin_db``, and
    the PT2E model is itself within ``_ANCHOR_DB`` of the float model. Rounding differences
    that a deep or recurrent network carries from layer to layer (eight residual blocks, a
    flow refined four times, a nearest sampler at a computed theta) leave the program and the
    PT2E model equally far from the float model and further from each other; a wrong kernel or
    layout adds its own error and moves the program away from the float model."""
    program_db, model_db = psnr(actual, float_reference), psnr(reference, float_reference)
    judged = {**judged, "psnr_vs_float_db": program_db, "reference_psnr_vs_float_db": model_db}
    if judged["passes"] or judged.get("biased") or tolerance.float_margin_db is None:
        return judged
    program = math.inf if program_db is None else program_db
    model = math.inf if model_db is None else model_db
    if model < _ANCHOR_DB or program < model - tolerance.float_margin_db:
        return judged
    reasons = judged.pop("reasons")
    return {
        **judged,
        "passes": True,
        "accepted": (
            f"as close to the float model as the quantized PT2E model ({program:.2f} dB "
            f"against its {model:.2f} dB, at most {tolerance.float_margin_db:g} dB less): "
            "accumulated rounding, not a wrong program"
        ),
        "rounding_reasons": reasons,
    }


class VerificationError(ExportError):
    """``export_model(..., verify=True)``: an output of the written program is further from the
    quantized PT2E model than the tolerance allows. ``failures``: per failing output its index,
    ``psnr_db``, ``max_steps`` (integer outputs), ``max_abs_error``, ``fraction_over``, the
    ``reasons`` and the ``tolerance``; ``divergence``: the first delegate call whose output
    diverges (instruction, backend, ops, node, figures, source line), or ``None``; ``kept``: the
    folder holding the failed export (beside ``artifacts_root``), or ``None``. The message has
    one line per fact."""

    def __init__(
        self,
        failures: list[dict[str, Any]],
        divergence: dict[str, Any] | None,
        kept: Path | None,
        lines: Sequence[str],
        root: Path | None = None,
    ) -> None:
        self.failures = failures
        self.divergence = divergence
        self.kept = kept
        text = ["verification failed: the written program is not within tolerance of the "
                f"{QUANTIZED_REFERENCE}", *lines]  # fmt: skip
        if kept is not None:
            where = f"; {root} is as it was" if root is not None else ""
            text.append(f"the failed export is kept in {kept} (its report.md says why){where}")
        super().__init__("\n".join(text))


def verification_error(
    verdict: Mapping[str, Any], kept: Path | None, root: Path | None = None
) -> VerificationError:
    """The ``VerificationError`` of a failed ``verdict``."""
    tolerance = dict(verdict.get("tolerance", {}))
    failures = [
        {**{k: v for k, v in o.items() if k != "passes"}, "tolerance": tolerance}
        for o in verdict.get("outputs", [])
        if not o.get("passes", True)
    ]
    divergence = verdict.get("divergence")
    return VerificationError(
        failures, dict(divergence) if divergence else None, kept, verdict_lines(verdict), root
    )


def failed_folder(root: Path) -> Path:
    """Where a failed verification's export is kept: ``DIR.failed-verification`` beside ``DIR``."""
    return root.with_name(root.name + FAILED_SUFFIX)


# ---------------------------------------------------------------------------------------------
# Localization: the first delegate call whose output diverges


def localize(
    folder: Path,
    tolerance: VerifyTolerance,
    delegate_calls: Sequence[Any] | None,
    io_params: Mapping[str, Any],
    *,
    float_export: bool = False,
    program_outputs: Sequence[torch.Tensor] | None = None,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None, list[dict[str, Any]]]:
    """Each delegate call of a run of ``folder/model.pte`` on the example inputs against the
    quantized PT2E model's value of the same tensor (the node of the ETRecord's quantized edge
    graph that ``etrecord.json`` says the call writes, that graph run on the same inputs):
    figures and verdict by ``judge_tensor``. ``delegate_calls``: the runner's records of the
    verified run (``keep_delegate_io``); ``None`` runs the program again in
    ``executorch.runtime`` with an ETDump and reads the delegate calls' outputs from its debug
    buffer. ``program_outputs``: the program's outputs as the verdict judges them
    (dequantized).
    Returns the first failing call (``None`` if none), every row, a note when nothing could be
    compared, and each program output judged on its own inputs."""

    record_path, map_path = folder / ETRECORD_NAME, folder / INSTRUCTION_MAP_NAME
    if not record_path.is_file() or not map_path.is_file():
        return (
            None,
            [],
            f"the export has no {ETRECORD_NAME} and {INSTRUCTION_MAP_NAME} to map delegate "
            "outputs to graph nodes",
            [],
        )
    record = parse_etrecord(str(record_path))
    mapping = json.loads(map_path.read_text())["instructions"]
    references = reference_values(record)
    observed = (
        _runner_outputs(delegate_calls)
        if delegate_calls is not None
        else _etdump_outputs(folder, record, io_params)
    )
    calls = []
    for instruction, backend, outputs in observed:
        entry = mapping.get(str(instruction)) or {}
        names = entry.get("outputs") or []
        outputs = list(outputs)[-len(names) :] if names else []  # an ETDump logs inputs first
        calls.append((instruction, backend, entry, list(zip(outputs, names, strict=False))))
    # each node computed by the quantized model from the program's own values upstream of it
    own, output_names = conditional_values(
        record,
        {n: v for *_, pairs in calls for v, n in pairs if n and isinstance(v, torch.Tensor)},
    )
    rows: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for instruction, backend, entry, pairs in calls:
        row: dict[str, Any] = {
            "instruction": instruction,
            "backend": backend,
            "ops": entry.get("ops", ""),
            "delegate": entry.get("lowered_module"),
        }
        judged: list[dict[str, Any]] = []
        local: list[dict[str, Any]] = []
        for k, (value, name) in enumerate(pairs):
            node = references.nodes.get(name)
            figures = _judge_call_output(
                value, references.quantized.get(name), node, tolerance, float_export
            )
            if figures is None:
                continue
            judged.append({"output": k, "node": name, **figures})
            mine = _judge_call_output(value, own.get(name), node, tolerance, float_export)
            if mine is not None:
                local.append(mine)
        if judged:
            worst = _worst(judged)
            row.update(
                {
                    "node": worst["node"],
                    "psnr_db": worst["psnr_db"],
                    "max_steps": worst.get("max_steps"),
                    "max_abs_error": worst["max_abs_error"],
                    "fraction_over": worst["fraction_over"],
                    "passes": all(j["passes"] for j in judged),
                }
            )
            if local:
                own_worst = _worst(local)
                row["own_inputs"] = {
                    "psnr_db": own_worst["psnr_db"],
                    "max_steps": own_worst.get("max_steps"),
                    "passes": all(j["passes"] for j in local),
                }
            if not row["passes"]:
                row["reasons"] = worst.get("reasons", [])
                row["source"] = _source_line(references.nodes.get(worst["node"]))
        rows.append(row)
        if first is None and row.get("passes") is False:
            row["first_failing"] = True
            first = dict(row)
    if first is not None and first.get("own_inputs", {}).get("passes"):
        # within tolerance on its own inputs: it carries a difference from upstream
        wrong = next((r for r in rows if r.get("own_inputs", {}).get("passes") is False), None)
        first["first_wrong_on_own_inputs"] = None if wrong is None else wrong["instruction"]
    note = None
    if not any("passes" in row for row in rows):
        note = "no delegate call's output maps to a node of the quantized graph"
    own_outputs = _outputs_on_own_inputs(
        program_outputs, output_names, own, references.nodes, io_params, tolerance, float_export
    )
    return first, rows, note, own_outputs


def _outputs_on_own_inputs(
    outputs: Sequence[torch.Tensor] | None,
    names: Sequence[str | None],
    own: Mapping[str, Any],
    nodes: Mapping[str, torch.fx.Node],
    io_params: Mapping[str, Any],
    tolerance: VerifyTolerance,
    float_export: bool,
) -> list[dict[str, Any]]:
    """Each program output (dequantized, as the verdict judges it) against the quantized
    model's value of it computed from the program's own values upstream (the last delegate
    calls' outputs): ``judge_tensor``'s figures, or ``{"compared": False}``."""
    judged: list[dict[str, Any]] = []
    entries = io_params.get("outputs", [])
    for k, (value, name) in enumerate(zip(outputs or [], names, strict=False)):
        reference = own.get(name) if name else None
        if not isinstance(reference, torch.Tensor) or reference.numel() != value.numel():
            judged.append({"output": k, "compared": False})
            continue
        if not reference.dtype.is_floating_point:
            qparams = quantize_qparams(nodes.get(name or ""))
            if qparams is None:
                judged.append({"output": k, "compared": False})
                continue
            reference = (reference.double() - qparams[1]) * qparams[0]
        entry = entries[k] if k < len(entries) else {}
        step = _output_step(entry)
        figures = judge_tensor(
            value.double().contiguous().reshape(reference.shape),
            reference.double(),
            step,
            tolerance,
            float_reference=float_export,
        )
        judged.append({"output": k, "node": name, "compared": True, **figures})
    return judged


def accept_amplified_rounding(
    verdict: dict[str, Any], rows: Sequence[Mapping[str, Any]], own_outputs: Sequence[Any]
) -> bool:
    """Passes the failing outputs of ``verdict`` (in place) when the program is right op by op:
    every delegate call that could be compared is within tolerance on its own inputs (the
    quantized model's ops run on the program's values upstream of it), and so is every program
    output; an op outside the delegates that went wrong would put the next call, or the output,
    off on its own inputs. What is left is the model amplifying the per-op rounding the
    tolerance allows (a nearest sampler at a computed grid picks other pixels where a one-step
    difference upstream crosses a pixel boundary). Returns whether it passed them."""
    compared = [r for r in rows if "own_inputs" in r]
    if not compared or any(not r["own_inputs"]["passes"] for r in compared):
        return False
    if any("own_inputs" not in r for r in rows if "passes" in r):
        return False
    failing = [o for o in verdict.get("outputs", []) if not o.get("passes", True)]
    by_index = {o["output"]: o for o in own_outputs}
    if not failing or any(
        not by_index.get(o["output"], {}).get("compared") or not by_index[o["output"]].get("passes")
        for o in failing
    ):
        return False
    first = next((r["instruction"] for r in rows if r.get("passes") is False), None)
    for o in failing:
        mine = by_index[o["output"]]
        o["passes"] = True
        o["rounding_reasons"] = o.pop("reasons", [])
        o["accepted"] = (
            "every delegate call and this output within tolerance on their own inputs (the "
            "quantized model's ops run on the program's values upstream; this output "
            f"{'identical' if mine['psnr_db'] is None else format(mine['psnr_db'], '.2f') + ' dB'}"
            "): the model amplifies per-op rounding"
            + ("" if first is None else f", first past the tolerance at instruction {first}")
        )
    verdict["result"] = "pass"
    verdict["failing_outputs"] = []
    return True


def _judge_call_output(
    value: Any,
    reference: Any,
    node: torch.fx.Node | None,
    tolerance: VerifyTolerance,
    float_export: bool,
) -> dict[str, Any] | None:
    """A delegate call's output ``value`` against ``reference`` (the value of the quantized
    graph's ``node``): ``judge_tensor``'s figures, in steps of the node's scale for an integer
    output; ``None`` where the two cannot be compared."""
    if not isinstance(value, torch.Tensor) or not isinstance(reference, torch.Tensor):
        return None
    if value.numel() != reference.numel():
        return None
    qparams = quantize_qparams(node)
    if qparams is not None and not value.dtype.is_floating_point:
        scale, zero_point = qparams
        actual = (value.double() - zero_point) * scale
        expected = (reference.double() - zero_point) * scale
        return judge_tensor(
            actual.reshape(expected.shape), expected, _judged_step(value, scale), tolerance
        )
    if value.dtype.is_floating_point:
        return judge_tensor(
            value.double().reshape(reference.shape),
            reference.double(),
            None,
            tolerance,
            float_reference=float_export,
        )
    return None


def _output_step(entry: Mapping[str, Any]) -> float | None:
    """The step a program output is judged in (``_judged_step``), from its
    ``io_quant_params.json`` entry; ``None`` for a float output."""
    scale, dtype = entry.get("scale"), getattr(torch, str(entry.get("dtype")), torch.int8)
    return None if scale is None else _judged_step(torch.empty(0, dtype=dtype), float(scale))


def _worst(judged: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Of a call's judged outputs, a failing one first, then the one most steps off."""
    return min(judged, key=lambda j: (j["passes"], -(j.get("max_steps") or 0)))


def _judged_step(value: torch.Tensor, scale: float) -> float:
    """The step an integer output (of the program or of a delegate call) is judged in: its own
    for 8 bits; for wider types the step of the same range in 8 bits (the tolerance's steps are
    8-bit steps: an int16 grid computed in float on two backends is a few of its own steps
    apart, 0.0003 of the range, as RAFT's lookup grids measured 16 steps and 78.8 dB; an int16
    affine grid returned by the program moves by up to 82 of its steps, 0.32 8-bit steps, when
    the int8 theta it is computed from rounds one step apart). ``value``: a tensor of the
    output's dtype, which says the width (float: judged in ``scale``)."""
    bits = torch.iinfo(value.dtype).bits if not value.dtype.is_floating_point else 8
    return scale * 2.0 ** max(0, bits - 8)


def _runner_outputs(calls: Sequence[Any]) -> list[tuple[int, str, list[torch.Tensor]]]:
    return [
        (int(call.instruction), str(call.backend_id), list(call.outputs or ())) for call in calls
    ]


def _etdump_outputs(
    folder: Path, record: Any, io_params: Mapping[str, Any]
) -> list[tuple[int, str, list[torch.Tensor]]]:
    """The delegate calls of a run of ``folder/model.pte`` in ``executorch.runtime`` with an
    ETDump, on the record's representative inputs: instruction, backend, and the tensors its
    debug buffer holds for the call (its inputs, then its outputs: ``localize`` takes the
    last ones)."""

    inputs = [
        program_input(x, entry)
        for x, entry in zip(record._representative_inputs, io_params["inputs"], strict=True)
    ]
    found: list[tuple[int, str, list[torch.Tensor]]] = []
    with tempfile.TemporaryDirectory(prefix="etkit-verdict-") as scratch:
        etdump, debug = Path(scratch) / "run.etdp", Path(scratch) / "run.debug"
        run_with_etdump(folder / "model.pte", inputs, etdump, debug)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inspector = Inspector(
                etdump_path=str(etdump), etrecord=record, debug_buffer_path=str(debug)
            )
        for block in inspector.event_blocks:
            for event in block.events:
                instruction = getattr(event, "_instruction_id", None)
                if event.name != "DELEGATE_CALL" or instruction is None:
                    continue
                data = [d for d in (event.debug_data or []) if isinstance(d, torch.Tensor)]
                found.append((int(instruction), str(event.delegate_backend_name or ""), data))
    return found


_FRAME: Final = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_QDQ_NAMES: Final = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
                     "dequantize_per_channel", "_to_dim_order_copy", "clone")  # fmt: skip


def _source_line(node: torch.fx.Node | None) -> str | None:
    """The model's source line that computes ``node``'s value (its stack trace's innermost frame
    outside torch), through the quantize/dequantize and layout copies after it."""
    for _ in range(8):
        if node is None:
            return None
        trace = node.meta.get("stack_trace")
        if isinstance(trace, str) and not any(q in str(node.target) for q in _QDQ_NAMES):
            frames = [
                m
                for m in _FRAME.finditer(trace)
                if "torch/" not in m.group(1) and "torchao/" not in m.group(1)
            ]
            if frames:
                file, line, function, code = frames[-1].groups()
                return f"{file}:{line} in {function}: {code.strip()}"
        previous = node.args[0] if node.args else None
        node = previous if isinstance(previous, torch.fx.Node) else None
    return None


# ---------------------------------------------------------------------------------------------
# A failed verification's export: kept beside the artifacts folder, never in its place


def failed_destination(root: Path, force: bool) -> Any:
    """The ``artifacts.Destination`` a failed verification's export goes to
    (``failed_folder(root)``), checked before any work as the artifacts folder is: an earlier
    failed export there is replaced only with ``force``."""

    return check_destination(failed_folder(Path(root)), force)


def keep_failed(
    staging: Any,
    destination: Any,
    force: bool,
    producer: dict[str, Any],
    verification: Mapping[str, Any],
    root: Path,
) -> None:
    """When ``verification``'s verdict failed: commits ``staging`` (an ``artifacts.Staging``
    holding the whole export, its report saying "verification failed") to ``destination``
    (``failed_destination``) instead of the artifacts folder, its manifest saying so, and raises
    the ``VerificationError``. Returns when the verdict passed."""
    verdict = verification.get("verdict") or {}
    if verdict.get("result") != "fail":
        return
    staging.retarget(destination)
    staging.commit(force, producer={**producer, "verification": "failed"})
    raise verification_error(verdict, destination.requested, root)


def verdict_notes(verification: Mapping[str, Any] | None) -> list[str]:
    """What ``etkit inspect`` says of an export's verdict (report.json's), one line each."""
    verdict = (verification or {}).get("verdict")
    if not verdict:
        return ["verification verdict: none (export with --verify)"]
    tolerance = VerifyTolerance(**{k: v for k, v in verdict.get("tolerance", {}).items()})
    lines = [f"verification verdict: {verdict.get('result')} (tolerance {tolerance.text()})"]
    return lines + verdict_lines(verdict)
