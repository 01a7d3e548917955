from __future__ import annotations

import importlib.metadata

import etkit_partition


def test_version_matches_distribution_metadata() -> None:
    assert etkit_partition.__version__ == importlib.metadata.version("etkit-partition")
