"""etkit-exporter: the export pipeline, its CLI, reports, demo models, run and verify.

``export_model``, ``ExportResult`` and ``ExportError`` are imported on first use, so that the
command-line tools can quiet torch's and torchao's import-time messages first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etkit_exporter.pipeline import ExportError, ExportResult, export_model
    from etkit_exporter.verdict import VerificationError, VerifyTolerance

__version__ = "0.1.0"

__all__ = [
    "ExportError",
    "ExportResult",
    "VerificationError",
    "VerifyTolerance",
    "__version__",
    "export_model",
]


def __getattr__(name: str) -> Any:
    if name in ("ExportError", "ExportResult", "export_model"):
        from etkit_exporter import pipeline

        return getattr(pipeline, name)
    if name in ("VerificationError", "VerifyTolerance"):
        from etkit_exporter import verdict

        return getattr(verdict, name)
    raise AttributeError(f"module 'etkit_exporter' has no attribute {name!r}")
