"""A verification verdict (report.json's ``verification["verdict"]``) in words: one line per
failing output and where the program first diverges, for report.md, ``etkit inspect`` and the
``VerificationError`` message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

QUANTIZED_REFERENCE: Final = "quantized PT2E model"


def verdict_lines(verdict: Mapping[str, Any]) -> list[str]:
    """One line per fact of a verdict: each output passed as accumulated rounding, each failing
    output (by how much), where the program first diverges."""
    lines = accepted_lines(verdict)
    for o in verdict.get("outputs", []):
        if o.get("passes", True):
            continue
        figures = [_db_text(o.get("psnr_db"))]
        if "max_steps" in o:
            figures.append(f"{o['max_steps']} steps max")
        figures.append(f"max abs error {o['max_abs_error']:.4g}")
        lines.append(
            f"output {o['output']} vs the {QUANTIZED_REFERENCE}: {', '.join(figures)}; "
            + "; ".join(o.get("reasons", []))
        )
    divergence = verdict.get("divergence")
    if divergence:
        lines.append("first divergence: " + divergence_text(divergence))
    elif verdict.get("result") == "fail":
        lines.append(
            "first divergence: "
            + str(verdict.get("localization_note") or "no delegate call's output could be compared")
        )
    return lines


def accepted_lines(verdict: Mapping[str, Any]) -> list[str]:
    """One line per output that passed as accumulated rounding (outside the PSNR or share rule
    against the PT2E model, as close to the float model as that model is)."""
    lines = []
    for o in verdict.get("outputs", []):
        if o.get("accepted"):
            lines.append(
                f"output {o['output']} vs the {QUANTIZED_REFERENCE}: {_db_text(o.get('psnr_db'))}; "
                + "; ".join(o.get("rounding_reasons", []))
                + f"; passes: {o['accepted']}"
            )
    return lines


def divergence_text(divergence: Mapping[str, Any]) -> str:
    """A divergence (``localize``'s first failing call) in one line."""
    what = f"instruction {divergence['instruction']}, {divergence['backend']} delegate"
    if divergence.get("ops"):
        what += f" ({divergence['ops']})"
    figures = [_db_text(divergence.get("psnr_db"))]
    if divergence.get("max_steps") is not None:
        figures.append(f"{divergence['max_steps']} steps max")
    text = f"{what}: its output {divergence.get('node') or ''} is {', '.join(figures)} from the "
    text += f"{QUANTIZED_REFERENCE}'s value of the same tensor"
    if divergence.get("reasons"):
        text += f" ({'; '.join(divergence['reasons'])})"
    if divergence.get("source"):
        text += f"; source: {divergence['source']}"
    own = divergence.get("own_inputs")
    if own is not None:
        own_figures = _db_text(own.get("psnr_db"))
        if own.get("max_steps") is not None:
            own_figures += f", {own['max_steps']} steps max"
        if own.get("passes"):
            wrong = divergence.get("first_wrong_on_own_inputs")
            text += (
                f"; on its own inputs it is within tolerance ({own_figures} from the quantized "
                "model's ops run on them): it carries and amplifies a difference from upstream; "
                + (
                    "no delegate call is off on its own inputs"
                    if wrong is None
                    else f"the first call off on its own inputs is instruction {wrong}"
                )
            )
        else:
            text += f"; on its own inputs too ({own_figures}): the difference starts here"
    return text


def _db_text(value: float | None) -> str:
    return "identical (inf dB)" if value is None else f"{value:.2f} dB"
