"""etkit-exporter: the export pipeline, its CLI, reports, demo models, run and verify.

``export_model``, ``ExportResult``, ``ExportError`` and ``qat_prepare`` (a model prepared for
quantization-aware training as ``export_model`` would quantize it) are imported on first use, so
that the command-line tools can quiet torch's and torchao's import-time messages first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etkit_exporter.check.tolerance import VerifyTolerance
    from etkit_exporter.check.verdict import VerificationError
    from etkit_exporter.core.errors import ExportError
    from etkit_exporter.export.pipeline import ExportResult, export_model
    from etkit_exporter.export.qat import qat_prepare

from etkit_exporter.core.version import __version__

__all__ = [
    "ExportError",
    "ExportResult",
    "VerificationError",
    "VerifyTolerance",
    "__version__",
    "export_model",
    "qat_prepare",
]


def __getattr__(name: str) -> Any:
    if name == "ExportError":
        from etkit_exporter.core import errors

        return errors.ExportError
    if name in ("ExportResult", "export_model"):
        from etkit_exporter.export import pipeline

        return getattr(pipeline, name)
    if name == "qat_prepare":
        from etkit_exporter.export import qat

        return qat.qat_prepare
    if name == "VerificationError":
        from etkit_exporter.check import verdict

        return verdict.VerificationError
    if name == "VerifyTolerance":
        from etkit_exporter.check import tolerance

        return tolerance.VerifyTolerance
    raise AttributeError(f"module 'etkit_exporter' has no attribute {name!r}")
