"""Fixtures of etkit-partition's tests: the tests that lower to VGF run Arm's model-converter."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _model_converter_found() -> None:
    """Arm's VGF backend finds model-converter on PATH or through ``MODEL_CONVERTER_PATH``; the
    ai-ml-sdk-model-converter wheel (in this package's ``test`` extra) puts it beside this
    Python, which is not on PATH when the virtual environment is not activated."""
    current = os.environ.get("MODEL_CONVERTER_PATH")
    if current and os.access(current, os.X_OK):
        return
    beside = Path(sys.executable).parent / "model-converter"
    found = str(beside) if beside.is_file() else shutil.which("model-converter")
    if found is None:
        pytest.fail(
            f"model-converter not found next to {sys.executable} or on PATH: install "
            "etkit-partition[test] (it brings ai-ml-sdk-model-converter)"
        )
    os.environ["MODEL_CONVERTER_PATH"] = found
