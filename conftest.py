"""The whole suite's order: test files heaviest first, so that two workers (``scripts/check.sh``:
``-n 2 --dist loadfile --no-loadscope-reorder``) finish together instead of one running the
last heavy file alone (pytest-xdist's own reorder puts files with many tests first, and the
heaviest files here hold few slow tests: the isolated installs, the fuzz seeds, the zoos).

``FILE_SECONDS``: each heavy file's wall time on one worker, estimated from ``--durations`` of
full runs on this project's 2-core machines (rounded; it only orders the files). Files not
listed follow, those with more tests first; tests keep their order within a file."""

from __future__ import annotations

from collections import Counter
from typing import Final

import pytest

FILE_SECONDS: Final = {
    "tests/test_real_models.py": 700,
    "tests/test_fuzz.py": 350,
    "tests/test_packaging.py": 330,
    "apps/exporter/tests/test_verdict.py": 250,
    "apps/exporter/tests/test_export.py": 200,
    "tests/test_gym_zoo.py": 150,
    "tests/test_verdict_mutations.py": 150,
    "apps/exporter/tests/test_sizes.py": 150,
    "apps/exporter/tests/test_artifacts.py": 150,
    "apps/exporter/tests/test_cli_conventions.py": 150,
    "tests/test_third_party_zoo.py": 120,
    "tests/test_one_vgf.py": 100,
    "apps/exporter/tests/test_scenario_export.py": 80,
    "apps/exporter/tests/test_bundle.py": 70,
    "apps/exporter/tests/test_qat_export.py": 100,
    "libs/gridsampler/tests/test_qat_ddp.py": 60,
    "libs/quant/tests/test_qat.py": 60,
}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    counts = Counter(_file(item) for item in items)
    first = {}
    for index, item in enumerate(items):
        first.setdefault(_file(item), index)

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int, int]:
        index, item = indexed
        name = _file(item)
        return (-FILE_SECONDS.get(name, 0), -counts[name], first[name], index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
