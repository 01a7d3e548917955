from __future__ import annotations

import importlib.metadata

import etkit_quant


def test_version_matches_distribution_metadata() -> None:
    assert etkit_quant.__version__ == importlib.metadata.version("etkit-quant")
