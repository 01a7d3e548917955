from __future__ import annotations

import importlib.metadata

import etkit_exporter


def test_version_matches_distribution_metadata() -> None:
    assert etkit_exporter.__version__ == importlib.metadata.version("etkit-exporter")
