"""A patch of upstream code in force while any thread is inside one of its blocks: the etkit
libraries and the exporter each work around upstream behaviour this way (torchao's batch-norm
fold, XNNPACK's pattern matching, torch's provenance copies), and share this one mechanism."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class PatchedWhileEntered:
    """``install`` when the first block is entered, ``restore`` when the last one is left (also
    when it raises): re-entrant, and across threads (one lock, one depth)."""

    def __init__(self, install: Callable[[], None], restore: Callable[[], None]) -> None:
        self._install, self._restore = install, restore
        self._lock = threading.Lock()
        self._depth = 0

    @contextmanager
    def entered(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._restore()
