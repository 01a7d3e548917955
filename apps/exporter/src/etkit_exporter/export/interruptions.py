"""What can stop an export from outside it: SIGTERM, turned into an exit that unwinds (so the
staging folder goes, as with Ctrl-C), and a full disk, found in an error's chain of causes so
that the export says so in one line."""

from __future__ import annotations

import errno
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def disk_full(error: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error in ``error``'s chain of causes, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (so the staging folder is removed) and exits 143; only where
    SIGTERM has its default action and on the main thread, as Python allows."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
