"""The pipeline's stages: each timed, its peak resident memory watched
(``core.memory.watch``), announced to the caller as it ends (``on_stage``), a long one's
progress as it goes (``on_progress``), and a failure turned into one ``ExportError`` naming
the stage and what to do."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from etkit_exporter.core import memory
from etkit_exporter.core.diagnostics import advice, root_cause
from etkit_exporter.core.errors import ExportError
from etkit_exporter.export.arguments import StageCallback
from etkit_exporter.export.pass_profile import PassProfile

# (what, done, total) of a long stage as it goes: total 0 when a part starts whose length is
# not known (a verification's stages), else a count of runs
ProgressCallback = Callable[[str, int, int], None]


class Stages:
    """The stages of one export: ``timings`` (seconds) and ``peaks`` (peak resident MB) by
    stage name, shared by the stages at other sizes (``at``); ``growth``: how far each stage's
    peak rose above what the process held when it began (bytes), what a later stage that does
    the same work again can expect to need."""

    def __init__(
        self,
        callback: StageCallback | None,
        suffix: str = "",
        timings: Any = None,
        profile: PassProfile | None = None,
        *,
        progress: ProgressCallback | None = None,
        peaks: dict[str, float | None] | None = None,
    ) -> None:
        self.timings: dict[str, float] = {} if timings is None else timings
        self.peaks: dict[str, float | None] = {} if peaks is None else peaks
        self.growth: dict[str, int] = {}  # bytes a stage's peak rose above where it started
        self.callback, self.suffix, self.progress = callback, suffix, progress
        self.profile = PassProfile() if profile is None else profile  # upstream's calls timed

    def at(self, label: str) -> Stages:
        """The stages at another size: ``capture [540x960]``, timed with these."""
        return Stages(self.callback, f" [{label}]", self.timings, self.profile,
                      progress=self.progress, peaks=self.peaks)  # fmt: skip

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        name += self.suffix
        start = time.perf_counter()
        outer, self.profile.stage = self.profile.stage, name
        before = memory.resident()
        with memory.watch() as peak:
            try:
                yield
            except Exception as error:
                hint = advice(error)
                what_to_do = f". What to do: {hint}" if hint else ""
                raise ExportError(
                    f"stage '{name}' failed: {root_cause(error)}{what_to_do}"
                ) from error
            finally:
                self.profile.stage = outer
            high = peak()
        seconds = time.perf_counter() - start
        self.timings[name] = round(seconds, 3)
        self.peaks[name] = None if high is None else round(high / memory.MB, 1)
        if high is not None and before is not None:
            self.growth[name] = max(high - before, 0)
        if self.callback is not None:
            self.callback(name, seconds)
