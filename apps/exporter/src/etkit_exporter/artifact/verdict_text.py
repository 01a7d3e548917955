"""A verification verdict (report.json's ``verification["verdict"]``) in words: one line per
failing output and where the program first diverges, for report.md, ``etkit inspect`` and the
``VerificationError`` message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

QUANTIZED_REFERENCE: Final = "quantized PT2E model"


def verdict_lines(verdict: Mapping[str, Any]) -> list[str]:
    """One line per fact of a failed verdict: each failing output (by how much), each wrong
    sampling position, where the program first diverges."""
    lines = []
    for o in verdict.get("outputs", []):
        if o.get("passes", True):
            continue
        figures = [_db_text(o.get("psnr_db"))]
        if "max_steps" in o:
            figures.append(f"{o['max_steps']:g} steps max")
        figures.append(f"max abs error {o['max_abs_error']:.4g}")
        lines.append(
            f"output {o['output']} vs the {QUANTIZED_REFERENCE}: {', '.join(figures)}; "
            + "; ".join(o.get("reasons", []))
        )
    for c in verdict.get("coordinates", []):
        if not c.get("passes", True):
            lines.append(coordinate_text(c))
    loop = verdict.get("loop_divergence")
    if loop:  # the loop over frames (check.loop)
        drifted = f" (state {', '.join(loop['states'])} drifted)" if loop.get("states") else ""
        lines.append(
            f"the loop: from frame {loop['frame']}, output {', '.join(loop['outputs'])} leaves "
            f"the rounding envelope of the quantized model's own loop{drifted}"
        )
    divergence = verdict.get("divergence")
    if divergence:
        lines.append("first divergence: " + divergence_text(divergence))
    elif loop and not any(not o.get("passes", True) for o in verdict.get("outputs", [])):
        pass  # frame 0 passed: the loop's line says where
    elif verdict.get("result") == "fail":
        lines.append(
            "first divergence: "
            + str(verdict.get("localization_note") or "no delegate call's output could be compared")
        )
    return lines


def tolerance_text(tolerance: Mapping[str, Any]) -> str:
    """The verdict's rules with a verdict's tolerance, in words (the docs' "The verdict's rules",
    ``docs/explanation/verdict.md``)."""
    text = (
        f"outputs within the rounding envelope ({tolerance.get('samples', 0):g} runs of the "
        f"quantized model rounding the other way within {tolerance.get('band', 0):g} steps of "
        "a boundary; 99.9 % prediction bounds on error power and mean), sampling positions "
        f"shifted less than {tolerance.get('coordinate_bias_px', 0):g} px"
    )
    if tolerance.get("max_steps") is not None:
        text += f", no value more than {tolerance['max_steps']:g} steps off"
    return text


def envelope_lines(verdict: Mapping[str, Any]) -> list[str]:
    """One line per output and per judged coordinate tensor: the program's figures against the
    bounds the rounding envelope gives."""
    lines = []
    for o in verdict.get("outputs", []):
        if "power_bound_steps2" not in o:
            continue
        lines.append(
            f"output {o['output']}: error power {o['power_steps2']:.3g} {o.get('unit', 'steps')}^2 "
            f"(envelope bound {o['power_bound_steps2']:.3g}), mean {o['mean_steps']:+.3g} "
            f"(bound {o['bias_bound_steps']:.3g}): {'pass' if o['passes'] else 'fail'}"
        )
    lines += [coordinate_text(c) for c in verdict.get("coordinates", [])]
    return lines


def coordinate_text(row: Mapping[str, Any]) -> str:
    """A judged coordinate tensor (``check.coordinates``) in one line."""
    bias = ", ".join(f"{b:+.3g}" for b in row.get("bias_px", []))
    text = (
        f"coordinates: {row['node']} (feeding {row['sampler']}, image {row['image'][0]}x"
        f"{row['image'][1]}) moves sampling positions by ({bias}) px on average, "
        f"{row['rms_px']:.3g} px root mean square (bound {row['rms_bound_px']:.3g})"
    )
    if not row.get("passes", True):
        text += ": " + "; ".join(row.get("reasons", []))
    return text


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
