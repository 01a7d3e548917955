"""The verdict's outcome: a failed verification's error (``VerificationError``, one line per
fact), where its export is kept (beside the artifacts folder, never in its place), and what
``etkit inspect`` says of a verdict.

The verdict itself is made in three parts, one module each: the tolerance it is held to
(``check.tolerance``), the judgement of the program's outputs against the rounding envelope
(``check.judgement``) and, where the program diverges, the localization
(``check.localization``, with the coordinate rule of ``check.coordinates``).
``etkit run model.bpte`` checks a bundled program's outputs by its own rule
(``metrics.within_tolerance``), with the bundle's tolerance (0 steps: the integer paths are
exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from etkit_exporter.artifact.staging import check_destination
from etkit_exporter.artifact.verdict_text import QUANTIZED_REFERENCE, verdict_lines
from etkit_exporter.check.tolerance import VerifyTolerance
from etkit_exporter.core.errors import ExportError

FAILED_SUFFIX: Final = ".failed-verification"


class VerificationError(ExportError):
    """``export_model(..., verify=True)``: an output of the written program is further from the
    quantized PT2E model than the tolerance allows. ``failures``: per failing output its figures
    as the verdict gives them (``output``, ``psnr_db``, ``max_abs_error``, ``max_steps``,
    ``mean_steps``, ``power_steps2``, the envelope's bounds, the ``reasons``) and the
    ``tolerance``; ``divergence``: the first delegate call whose output
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
