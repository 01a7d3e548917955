"""The upstream sentinels (tests named ``test_upstream_*``) are left to ``pytest -m extended``
only while the lock is the one they last passed on (root ``conftest.py``)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("etkit_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sentinels_are_left_out_only_for_the_lock_they_passed_on(tmp_path: Path) -> None:
    checked = _root_conftest().sentinels_checked
    lock, record = tmp_path / "constraints.txt", tmp_path / "upstream_checked.sha256"
    lock.write_text("executorch==1.5.1\ntorch==2.11.0\n")
    assert not checked(lock, record)  # never run: they run
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    record.write_text(f"{digest}  requirements/constraints.txt\n")  # sha256sum's line
    assert checked(lock, record)
    lock.write_text("executorch==1.6.0\ntorch==2.11.0\n")  # a new pin: they run again
    assert not checked(lock, record)
    record.write_text("")
    assert not checked(lock, record)


def test_the_record_is_of_the_lock_in_the_repository() -> None:
    """The recorded lock is this repository's (scripts/lock.sh writes both); a hand-edited lock
    that was not re-checked shows here, not as sentinels silently left out (they would run)."""
    record = (ROOT / "tests" / "upstream_checked.sha256").read_text().split()
    assert record[1:] == ["requirements/constraints.txt"]
    assert _root_conftest().sentinels_checked(), (
        "requirements/constraints.txt changed since the upstream sentinels last passed on it: "
        "scripts/lock.sh runs them and records the lock (this run ran them too)"
    )
