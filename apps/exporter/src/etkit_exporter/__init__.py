"""etkit-exporter: the export pipeline, its CLI, reports, demo models, run and verify."""

__version__ = "0.1.0"

__all__ = ["__version__"]
