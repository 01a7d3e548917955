from __future__ import annotations

import importlib.metadata

import etkit_gridsampler


def test_version_matches_distribution_metadata() -> None:
    assert etkit_gridsampler.__version__ == importlib.metadata.version("etkit-gridsampler")
