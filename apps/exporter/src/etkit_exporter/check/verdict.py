"""The verdict of a verification: whether each output of the written program differs from the
quantized PT2E model (the program's own definition) by no more than legitimate rounding does,
whether the coordinates it samples at are where that model samples, and, when it fails, the
first delegate call whose output diverges.

The yardstick is the rounding envelope (``check.envelope``): the quantized model rerun with
each activation quantize rounding to the other neighbour near its rounding boundary, as a
correct integer backend may. Per output, in steps of its scale (a float output: in 1/255 of
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
rule with three standard errors. The coordinate rule (``check.coordinates``) judges, in pixels
of the image sampled, every tensor a delegate call produces upstream of a sampler's grid.

``etkit run model.bpte`` checks a bundled program's outputs by its own rule
(``metrics.within_tolerance``), with the bundle's tolerance (0 steps: the integer paths are
exact).
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
from etkit_exporter.check.coordinates import judge_coordinates, sampler_sites
from etkit_exporter.check.envelope import (
    MAX_SAMPLES,
    MIN_SAMPLES,
    Envelope,
    prediction_bound,
    rounding_envelope,
)
from etkit_exporter.check.metrics import psnr
from etkit_exporter.check.references import (
    conditional_values,
    quantize_qparams,
    reference_program,
    reference_values,
)
from etkit_exporter.core.errors import ExportError
from etkit_exporter.core.io_params import program_input
from etkit_exporter.programs.runtime import run_with_etdump

FAILED_SUFFIX: Final = ".failed-verification"
_SE: Final = 3.0  # standard errors of the program's own mean the bias rule allows
_FLOAT_UNITS: Final = 255.0  # a float tensor is judged in 1/255 of its range (an 8-bit step)
# float32 arithmetic in two orders: a float tensor's mean may differ by this many units unbiased
_FLOAT_NOISE: Final = 1e-3


@dataclass(frozen=True)
class VerifyTolerance:
    """How the verdict judges (module docstring; apps/exporter/README.md, "Verification
    verdict"). Give it as ``export_model(verify_tolerance=...)``, or as text
    (``parse_tolerance``: ``"samples=16,band=0.02,max-steps=1"``) to ``--verify-tolerance`` and
    ``verify_tolerance`` in ``export.toml``.

    - ``samples``: dithered runs of the rounding envelope (4 to 64);
    - ``band``: how near its rounding boundary (in steps) a quantize may round the other way;
    - ``coordinate_bias_px``: the largest systematic shift of a sampling position (pixels);
    - ``float_min_psnr_db``: a float export's floor against the float model;
    - ``max_steps``: when set, no output value further than this many steps (off by default).
    """

    samples: int = 16
    band: float = 0.02
    coordinate_bias_px: float = 0.125
    float_min_psnr_db: float = 60.0
    max_steps: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name == "max_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"VerifyTolerance.{item.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"VerifyTolerance.{item.name} must be a finite number >= 0, got {value!r}"
                )
        for name in ("samples", "max_steps"):
            value = getattr(self, name)
            if value is not None and int(value) != value:
                raise ValueError(f"VerifyTolerance.{name} must be a whole number, got {value!r}")
        if not MIN_SAMPLES <= self.samples <= MAX_SAMPLES:
            raise ValueError(
                f"VerifyTolerance.samples must be in [{MIN_SAMPLES}, {MAX_SAMPLES}], got "
                f"{self.samples!r}"
            )
        if self.band > 0.5:
            raise ValueError(
                f"VerifyTolerance.band is at most 0.5 steps (either neighbour), got {self.band!r}"
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
    "samples": "samples",
    "band": "band",
    "coordinate-bias": "coordinate_bias_px",
    "float-psnr": "float_min_psnr_db",
    "max-steps": "max_steps",
}
# Keys of the verdict before the rounding envelope (etkit-exporter 0.1): refused with a reason
_RETIRED_KEYS: Final = ("psnr", "steps", "fraction", "bias", "float-error", "float-margin")


def parse_tolerance(text: str) -> VerifyTolerance:
    """A ``VerifyTolerance`` from ``key=value`` pairs separated by commas (keys: samples, band,
    coordinate-bias, float-psnr, max-steps, which also takes ``off``; each one left out keeps
    its default); ``ValueError`` naming the wrong pair otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"a verify tolerance is text such as 'max-steps=1', got {text!r}")
    values: dict[str, float | None] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, number = (s.strip() for s in pair.partition("="))
        key = key.replace("_", "-")
        if key in _RETIRED_KEYS:
            raise ValueError(
                f"verify tolerance {text!r}: {key!r} is gone: the verdict judges by the rounding "
                f"envelope now (keys {', '.join(TOLERANCE_KEYS)}; apps/exporter/README.md, "
                "'Verification verdict')"
            )
        if not sep or key not in TOLERANCE_KEYS:
            raise ValueError(
                f"verify tolerance {text!r}: {pair!r} is not KEY=NUMBER with KEY one of "
                f"{', '.join(TOLERANCE_KEYS)} (e.g. 'samples=32,max-steps=1')"
            )
        if key == "max-steps" and number == "off":
            values[TOLERANCE_KEYS[key]] = None
            continue
        try:
            values[TOLERANCE_KEYS[key]] = float(number)
        except ValueError:
            raise ValueError(f"verify tolerance {text!r}: {number!r} is not a number") from None
    for name in ("samples", "max_steps"):
        value = values.get(name)
        if value is not None:
            if value != int(value):
                raise ValueError(f"verify tolerance {text!r}: {name} must be a whole number")
            values[name] = int(value)
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
        f"verify_tolerance must be a VerifyTolerance or text such as 'max-steps=1', got "
        f"{type(value).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# Judging one tensor


def _moments(difference: torch.Tensor) -> tuple[float, float, float]:
    """Power (mean square), mean and the standard error of the mean of a difference."""
    n = difference.numel()
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(difference.mean())
    spread = float(difference.std(unbiased=False)) if n > 1 else 0.0
    return float((difference * difference).mean()), mean, spread / math.sqrt(n)


# Relative slack on the bounds: a step measured on float32 dequantized values reads 1 +- 1e-6
# or so (seed 6017: one of two values one step off gave a power of 0.5000013 against the bound
# of one value one step off, 0.5); a thousandth of a bound is far below any step.
_FLOAT32_SLACK: Final = 1e-3


def judge_tensor(
    actual: torch.Tensor,
    reference: torch.Tensor,
    scale: float | None,
    tolerance: VerifyTolerance,
    *,
    envelope: Sequence[torch.Tensor] = (),
    modes: Sequence[torch.Tensor] = (),
    float_reference: bool = False,
) -> dict[str, Any]:
    """``actual`` against ``reference`` (real values of one shape) with the envelope's values of
    the same tensor (``envelope``: the dithered runs, ``modes``: the halves-rounding runs; see
    the module docstring), in steps of ``scale`` (``None``: a float tensor, judged in 1/255 of
    the reference's range). Without an envelope (a float export, ``float_reference``) the PSNR
    floor and the bias rule decide. Returns the figures, ``passes`` and, when it does not,
    ``reasons`` (one line each)."""
    a, r = actual.double().reshape(-1), reference.double().reshape(-1)
    peak = float(r.max() - r.min()) if r.numel() else 0.0
    unit = scale if scale is not None else (peak or 1.0) / _FLOAT_UNITS
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
    if scale is not None:
        result["max_steps"] = round(result["max_steps"])
    reasons: list[str] = []
    name = "steps" if scale is not None else "units"
    if len(envelope) >= 2:
        runs = [_moments((e.double().reshape(-1) - r) / unit) for e in envelope]
        mode_runs = [_moments((e.double().reshape(-1) - r) / unit) for e in modes]
        power_bound = max(
            prediction_bound([p for p, _, _ in runs]),
            max((p for p, _, _ in mode_runs), default=0.0),
            1.0 / max(n, 1),  # one value one step off
        )
        bias_bound = (
            max(
                prediction_bound([abs(m) for _, m, _ in runs]),
                max((abs(m) for _, m, _ in mode_runs), default=0.0),
            )
            + _SE * standard_error
        )
        result.update(
            {
                "envelope_power_steps2": sum(p for p, _, _ in runs) / len(runs),
                "power_bound_steps2": power_bound,
                "bias_bound_steps": bias_bound,
                "envelope_max_steps": max(
                    float((e.double().reshape(-1) - r).abs().max() / unit) if n else 0.0
                    for e in envelope
                ),
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


# ---------------------------------------------------------------------------------------------
# The verdict on the outputs


def output_envelope(
    quantized_model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    tolerance: VerifyTolerance,
) -> Envelope | None:
    """The rounding envelope of the quantized model's outputs (``None`` for a model that is no
    FX graph)."""
    if not isinstance(quantized_model, torch.fx.GraphModule):
        return None
    return rounding_envelope(
        quantized_model, list(example_inputs), samples=tolerance.samples, band=tolerance.band
    )


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
    those outputs. ``{"result": "pass" | "fail", "tolerance": {...}, "outputs": [...],
    "failing_outputs": [...], "divergence": None}``."""
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


def _real(value: torch.Tensor, entry: Mapping[str, Any]) -> torch.Tensor:
    """An envelope run's output as the reference gives it (the quantized model's outputs are
    real values; an integer one is dequantized with its IO parameters)."""
    if value.dtype.is_floating_point or entry.get("scale") is None:
        return value
    return (value.double() - float(entry.get("zero_point") or 0)) * float(entry["scale"])


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


def judge_calls(
    folder: Path,
    tolerance: VerifyTolerance,
    delegate_calls: Sequence[Any] | None,
    io_params: Mapping[str, Any],
    *,
    float_export: bool = False,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None, list[dict[str, Any]]]:
    """Each delegate call of a run of ``folder/model.pte`` on the example inputs against the
    quantized PT2E model's value of the same tensor (the node of the ETRecord's quantized edge
    graph that ``etrecord.json`` says the call writes, that graph run on the same inputs) and
    that value's rounding envelope: figures and verdict by ``judge_tensor``; and every call
    output upstream of a sampler's grid judged in pixels (``check.coordinates``).
    ``delegate_calls``: the runner's records of the verified run (``keep_delegate_io``);
    ``None`` runs the program again in ``executorch.runtime`` with an ETDump and reads the
    delegate calls' outputs from its debug buffer.
    Returns the first failing call (``None`` if none), every row, a note when nothing could be
    compared, and the coordinate rows."""

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
    values = {n: v for *_, pairs in calls for v, n in pairs if n and isinstance(v, torch.Tensor)}
    program, inputs = reference_program(record)
    module = program.module()
    envelope = (
        None
        if float_export
        else rounding_envelope(
            module,
            inputs,
            samples=tolerance.samples,
            band=tolerance.band,
            capture={*values, *(s.grid for s in sampler_sites(module.graph))},
        )
    )
    # each node computed by the quantized model from the program's own values upstream of it
    own, _ = conditional_values(record, values)
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
            spread = envelope.node(name) if envelope is not None else ([], [])
            figures = _judge_call_output(
                value, references.quantized.get(name), node, tolerance, float_export, spread
            )
            if figures is None:
                continue
            judged.append({"output": k, "node": name, **figures})
            mine = _judge_call_output(value, own.get(name), node, tolerance, float_export, spread)
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
                    "mean_steps": worst.get("mean_steps"),
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
    coordinates = judge_coordinates(
        record, values, references, envelope, module.graph, tolerance.coordinate_bias_px
    )
    wrong_place = next((c for c in coordinates if not c["passes"]), None)
    if first is None and wrong_place is not None:
        row = next(r for r in rows if wrong_place["node"] in _names(r, calls))
        row["first_failing"] = True
        first = {**row, "passes": False, "reasons": wrong_place["reasons"]}
        first["source"] = _source_line(references.nodes.get(wrong_place["node"]))
    if first is not None and first.get("own_inputs", {}).get("passes"):
        # within tolerance on its own inputs: it carries a difference from upstream
        wrong = next((r for r in rows if r.get("own_inputs", {}).get("passes") is False), None)
        first["first_wrong_on_own_inputs"] = None if wrong is None else wrong["instruction"]
    note = None
    if not any("passes" in row for row in rows):
        note = "no delegate call's output maps to a node of the quantized graph"
    return first, rows, note, coordinates


def _names(row: Mapping[str, Any], calls: Sequence[Any]) -> set[str]:
    """The node names a call row's instruction writes."""
    for instruction, _backend, _entry, pairs in calls:
        if instruction == row["instruction"]:
            return {n for _v, n in pairs if n}
    return set()


def _judge_call_output(
    value: Any,
    reference: Any,
    node: torch.fx.Node | None,
    tolerance: VerifyTolerance,
    float_export: bool,
    spread: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], []),
) -> dict[str, Any] | None:
    """A delegate call's output ``value`` against ``reference`` (the value of the quantized
    graph's ``node``) and that node's envelope values (``spread``: dithered, modes):
    ``judge_tensor``'s figures, in steps of the node's scale for an integer output; ``None``
    where the two cannot be compared."""
    if not isinstance(value, torch.Tensor) or not isinstance(reference, torch.Tensor):
        return None
    if value.numel() != reference.numel():
        return None
    qparams = quantize_qparams(node)
    dithered, modes = spread
    if qparams is not None and not value.dtype.is_floating_point:
        scale, zero_point = qparams

        def real(t: torch.Tensor) -> torch.Tensor:
            return (t.double() - zero_point) * scale

        expected = real(reference)
        return judge_tensor(
            real(value).reshape(expected.shape),
            expected,
            scale,
            tolerance,
            envelope=[real(d) for d in dithered],
            modes=[real(d) for d in modes],
        )
    if value.dtype.is_floating_point:
        return judge_tensor(
            value.double().reshape(reference.shape),
            reference.double(),
            None,
            tolerance,
            envelope=[d.double() for d in dithered if d.dtype.is_floating_point],
            modes=[d.double() for d in modes if d.dtype.is_floating_point],
            float_reference=float_export,
        )
    return None


def _output_step(entry: Mapping[str, Any]) -> float | None:
    """The step a program output is judged in (its scale), from its ``io_quant_params.json``
    entry; ``None`` for a float output."""
    scale = entry.get("scale")
    return None if scale is None else float(scale)


def _worst(judged: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Of a call's judged outputs, a failing one first, then the one most steps off."""
    return min(judged, key=lambda j: (j["passes"], -(j.get("max_steps") or 0)))


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
        run_with_etdump(folder / "model.pte", inputs, etdump, debug, isolated=False)
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
