"""Fixtures of the exporter's tests: the tests that lower to VGF themselves find model-converter
whether or not the virtual environment is active, as the exporter arranges for its users."""

from __future__ import annotations

import pytest

from etkit_exporter.vgf.tools import configure_model_converter


@pytest.fixture(autouse=True, scope="session")
def _arm_tools_found() -> None:
    configure_model_converter()
