from __future__ import annotations

import importlib.metadata

import etkit_layout


def test_version_matches_distribution_metadata() -> None:
    assert etkit_layout.__version__ == importlib.metadata.version("etkit-layout")
