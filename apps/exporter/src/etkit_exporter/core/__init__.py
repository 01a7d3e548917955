"""The lowest layer: what every other layer may use (errors, backend ids, diagnostics,
calibration files, the version)."""
