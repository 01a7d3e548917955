"""This process's memory as Linux counts it: the peak resident set of a stage (``VmHWM``, reset
at the stage's start through ``/proc/self/clear_refs``), what the machine has free
(``MemAvailable``), and the one-line refusal of a stage that will not fit.

Linux-only figures; elsewhere each reads ``None`` and nothing is refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from etkit_exporter.core.errors import ExportError

_STATUS: Final = Path("/proc/self/status")
_CLEAR_REFS: Final = Path("/proc/self/clear_refs")
_MEMINFO: Final = Path("/proc/meminfo")
MB: Final = 1024 * 1024


def _kilobytes(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def resident() -> int | None:
    """This process's resident memory now, bytes."""
    return _kilobytes(_STATUS, "VmRSS")


def peak() -> int | None:
    """This process's peak resident memory since it started or since ``reset_peak``, bytes."""
    return _kilobytes(_STATUS, "VmHWM")


def reset_peak() -> bool:
    """Starts this process's peak resident memory again from its resident memory now; whether
    the kernel did (it needs Linux 4.0 and a writable ``clear_refs``)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def available() -> int | None:
    """What the machine can give without swapping (``MemAvailable``), bytes."""
    return _kilobytes(_MEMINFO, "MemAvailable")


def require(estimate: int, what: str, hint: str) -> None:
    """Raises ``ExportError`` in one line when ``estimate`` bytes more than this process holds
    now will not fit in what the machine has free, before ``what`` starts: the estimate, what
    is free, and ``hint`` (what to do)."""
    free = available()
    if free is None or estimate <= free:
        return
    raise ExportError(
        f"{what} needs about {estimate / MB:,.0f} MB more and the machine has "
        f"{free / MB:,.0f} MB free: {hint}"
    )


class _Watch:
    """One open ``watch``: the highest peak it has seen."""

    def __init__(self, start: int) -> None:
        self.high = start


# The watches open now, each given the kernel's peak before that peak is reset
_OPEN: list[_Watch] = []


def _fold() -> None:
    now = peak()
    if now is not None:
        for box in _OPEN:
            box.high = max(box.high, now)


@contextmanager
def watch() -> Iterator[Callable[[], int | None]]:
    """Watches this process's peak resident memory over a block: yields a function that reads
    the peak since the block began (bytes; ``None`` where Linux's counters are missing). Watches
    nest: an inner one resets the kernel's peak, and every open watch keeps what it had seen."""
    _fold()
    counted = reset_peak()
    box = _Watch(resident() or 0)
    _OPEN.append(box)

    def read() -> int | None:
        if not counted:
            return None
        _fold()
        return box.high

    try:
        yield read
    finally:
        _fold()
        _OPEN[:] = [w for w in _OPEN if w is not box]
