"""Where the command-line tools of the Arm ML SDK wheels are."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


class ToolNotFoundError(FileNotFoundError):
    """A command-line tool the pipeline needs is not installed."""


_PACKAGES = {
    "model-converter": "ai-ml-sdk-model-converter==0.11.0",
    "scenario_runner": "ai-ml-sdk-scenario-runner==0.11.0",
    "vgf_dump": "ai-ml-sdk-vgf-library==0.11.0",
    "vulkaninfo": "Debian's vulkan-tools (apt-get install vulkan-tools)",
}


def find_tool(name: str) -> str:
    """The path of ``name``: next to this Python (a virtual environment's ``bin``), else on PATH.
    Raises ``ToolNotFoundError`` naming what provides it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise ToolNotFoundError(
        f"{name} not found next to {sys.executable} or on PATH; install "
        f"{_PACKAGES.get(name, name)} (scripts/setup.sh does)"
    )


def configure_model_converter() -> str:
    """Points the Arm VGF backend at model-converter (``MODEL_CONVERTER_PATH``) when it would
    not find it itself, as when this Python's virtual environment is not activated. Returns the
    path it will use; raises ``ToolNotFoundError`` when there is none."""
    current = os.environ.get("MODEL_CONVERTER_PATH")
    if current and os.access(current, os.X_OK):
        return current
    path = find_tool("model-converter")
    os.environ["MODEL_CONVERTER_PATH"] = path
    return path
