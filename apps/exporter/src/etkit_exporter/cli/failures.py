"""How ``etkit-export`` reports a failure: one line per fact on the stderr the command started
with, each starting on a line of its own, in the command's words (``cli_words``), with
refusals of options the target cannot honour as usage errors (``refusal``); and the filter that
keeps torch.export's partial-graph dump off stderr without ``--verbose``. Imports nothing heavy
(the argument errors are imported where they are needed, after the export has loaded them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from etkit_exporter.core.diagnostics import exception_chain, reason_line


class WithoutPartialGraphs:
    """A stream (stderr) that drops the partial graph ``torch.export`` prints before it raises
    on data-dependent control flow (``class GraphModule(torch.nn.Module): ...``, dozens of lines
    before the export's one-line error; ``--verbose`` keeps it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._dropped = False

    def write(self, text: str) -> int:
        dropped, self._dropped = self._dropped, text.startswith("class GraphModule(")
        if self._dropped or (dropped and text == "\n"):  # print writes its end on its own
            return len(text)
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class OpenLine:
    """The stream progress is written to (stdout), remembering whether the last progress line
    was left open (a terminal's updating line has no end until the next stage), so that a
    failure's lines start on a line of their own instead of after "done in 0.84 s"."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.open = False

    def write(self, text: str) -> int:
        if text:
            self.open = not text.endswith("\n")
        return int(self._stream.write(text))

    def end_line(self) -> None:
        """Ends a progress line left open."""
        if self.open:
            self.write("\n")
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def print_failure(stream: Any, progress: OpenLine, lines: Sequence[str]) -> None:
    """A failure's lines, each ``etkit-export: <line>``, on ``stream``: the stderr the command
    started with (never through ``WithoutPartialGraphs``, which is only there for torch's
    dump), after any progress line left open is ended, flushed at once."""
    progress.end_line()
    for line in lines:
        print(f"etkit-export: {line}", file=stream, flush=True)


def refusal(error: BaseException) -> str | None:
    """The refusal in ``error``'s chain of an option the target cannot honour
    (``UnproducibleQspecError``, which a stage wraps in its ``ExportError``), or ``None``."""
    from etkit_exporter.export.arguments import UnproducibleQspecError

    for cause in exception_chain(error):
        if isinstance(cause, UnproducibleQspecError):
            return reason_line(str(cause))
    return None


def cli_words(error: BaseException) -> str:
    """``error``'s message in the command's words where the API's differ."""
    from etkit_exporter.export.arguments import QspecCountError

    if isinstance(error, QspecCountError):
        option = f"--quant-{error.boundary}"
        return (
            f"{option} is given {error.given} time{'' if error.given == 1 else 's'} but the "
            f"model has {error.count} "
            f"{error.boundary}{'' if error.count == 1 else 's'}: give one {option} per "
            f"{error.boundary}, in order ('float' leaves one in float)"
        )
    return str(error)
