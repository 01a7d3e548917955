"""The whole suite's order: test files heaviest first, so that two workers (``scripts/check.sh``:
``-n 2 --dist loadfile --no-loadscope-reorder``) finish together instead of one running the
last heavy file alone (pytest-xdist's own reorder puts files with many tests first, and the
heaviest files here hold few slow tests: the isolated installs, the fuzz seeds, the zoos).

``FILE_SECONDS``: each heavy file's wall time on one worker, estimated from ``--durations`` of
full runs on this project's 2-core machines (rounded; it only orders the files). Files not
listed follow, those with more tests first; tests keep their order within a file.

A watchdog (``pytest_runtest_protocol``): a test whose setup, call and teardown together run
past ``TEST_LIMIT_SECONDS`` (``ETKIT_TEST_LIMIT`` overrides it; 0 turns it off) is a hang, not a
slow test: every thread's Python stack is written down (the run's summary prints it) and a
``TimeoutError`` is raised in the test (``SIGALRM``), which fails it and lets the run go on;
a hang that holds the interpreter (a deadlock in C code) is ended 2 minutes later by exiting
the process (``faulthandler``; pytest-xdist reports the test as crashed). Either way the run
ends instead of running into CI's limit with nothing printed. The slowest test (a module's
exports in its first test's setup) takes about 70 s on this project's 2-core machines; a
DDP test whose gloo ranks deadlocked at exit was the hang it found."""

from __future__ import annotations

import faulthandler
import hashlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO

import pytest

TEST_LIMIT_SECONDS: Final = 600.0

FILE_SECONDS: Final = {
    "tests/test_real_models.py": 220,
    "tests/test_packaging.py": 90,
    "tests/test_fuzz.py": 100,
    "apps/exporter/tests/test_verdict.py": 250,
    "apps/exporter/tests/test_export.py": 200,
    "tests/test_gym_zoo.py": 150,
    "tests/test_verdict_mutations.py": 150,
    "apps/exporter/tests/test_sizes.py": 150,
    "apps/exporter/tests/test_artifacts.py": 150,
    "apps/exporter/tests/test_cli_conventions.py": 150,
    "tests/test_third_party_zoo.py": 90,
    "tests/test_one_vgf.py": 100,
    "apps/exporter/tests/test_scenario_export.py": 80,
    "apps/exporter/tests/test_bundle.py": 70,
    "apps/exporter/tests/test_qat_export.py": 100,
    "libs/gridsampler/tests/test_qat_ddp.py": 60,
    "libs/quant/tests/test_qat.py": 60,
    "tests/test_docs.py": 100,  # the site's build (about 11 s) and every guide example run
    "apps/exporter/tests/test_state.py": 130,  # recurrent exports, their loops, a VGF loop
    "tests/test_recurrent_fuzz.py": 30,
}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


# Upstream sentinels, the tests named ``test_upstream_*``: facts of the pinned ExecuTorch, torch
# and torchao that an etkit workaround rests on (upstream's Arm backend clamps int8 at -128,
# XNNPACK misreads an unannotated in-place ReLU, ...). They can change only with the lock,
# requirements/constraints.txt, so the suite leaves them to `pytest -m extended` while the lock
# is the one they last passed on (UPSTREAM_CHECKED holds its sha256; scripts/lock.sh runs them
# after locking and writes it when they pass), and runs them when it is not. 14 tests, about
# 2 minutes of CI.
SENTINEL_PREFIX: Final = "test_upstream_"
_ROOT: Final = Path(__file__).resolve().parent
UPSTREAM_CHECKED: Final = _ROOT / "tests" / "upstream_checked.sha256"
LOCK: Final = _ROOT / "requirements" / "constraints.txt"


def sentinels_checked(lock: Path = LOCK, record: Path = UPSTREAM_CHECKED) -> bool:
    """Whether the upstream sentinels passed on this lock: ``record``'s first word is the
    sha256 of ``lock``."""
    if not lock.is_file() or not record.is_file():
        return False
    words = record.read_text().split()
    return bool(words) and words[0] == hashlib.sha256(lock.read_bytes()).hexdigest()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if sentinels_checked():
        for item in items:
            if getattr(item, "originalname", item.name).startswith(SENTINEL_PREFIX):
                item.add_marker(pytest.mark.extended)
    counts = Counter(_file(item) for item in items)
    first = {}
    for index, item in enumerate(items):
        first.setdefault(_file(item), index)

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int, int]:
        index, item = indexed
        name = _file(item)
        return (-FILE_SECONDS.get(name, 0), -counts[name], first[name], index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


_HANGS: Final = Path(__file__).resolve().parent / ".pytest_cache" / "etkit-hangs"
_hang_log: list[TextIO] = []  # this process's, opened at its first test
_STARTED: Final = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    limit = float(os.environ.get("ETKIT_TEST_LIMIT", TEST_LIMIT_SECONDS))
    if limit <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _hang_log:
        _HANGS.mkdir(parents=True, exist_ok=True)
        _hang_log.append((_HANGS / f"{os.getpid()}.txt").open("w"))
    log = _hang_log[0]

    def hung(signum: int, frame: object) -> None:
        print(f"[watchdog] {item.nodeid} ran past {limit:.0f} s: a hang", file=log)
        faulthandler.dump_traceback(file=log, all_threads=True)
        log.flush()
        raise TimeoutError(f"[watchdog] the test ran past {limit:.0f} s (stacks in the summary)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, limit)
    # the last resort: a hang holding the interpreter never runs the handler
    faulthandler.dump_traceback_later(limit + 120, exit=True, file=log)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Prints what the watchdog wrote during this run (files of this run's processes)."""
    for log in sorted(_HANGS.glob("*.txt")) if _HANGS.is_dir() else []:
        if log.stat().st_mtime < _STARTED:
            continue
        text = log.read_text(errors="replace").strip()
        if text:
            terminalreporter.section(f"hung test (process {log.stem})")
            terminalreporter.write_line(text)
