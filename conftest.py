"""Shared by every test under this workspace."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _arm_tools_found() -> None:
    """Lowering to VGF finds model-converter whether or not the virtual environment is active,
    as the exporter arranges for its users."""
    from etkit_exporter.tools import configure_model_converter

    configure_model_converter()
