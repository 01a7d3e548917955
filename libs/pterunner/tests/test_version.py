from __future__ import annotations

import importlib.metadata

import etkit_pterunner


def test_version_matches_distribution_metadata() -> None:
    assert etkit_pterunner.__version__ == importlib.metadata.version("etkit-pterunner")
