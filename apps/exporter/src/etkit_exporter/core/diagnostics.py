"""Finding the cause of a failure: the innermost error of an exception chain with the pass that
raised it, and the log lines that C++ code (the ExecuTorch runtime, XNNPACK, etkit's kernels)
wrote to stderr while Python saw only "error 0x1"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_PASS_NAME = re.compile(r"running the '([^']+)' pass")
# Wrappers that name themselves instead of the pass that failed inside them.
_WRAPPER_PASSES = frozenset({"_ExportedProgramGraphPassAdapter"})
# ExecuTorch's ET_LOG line: "[method.cpp:123] message" from the pip wheel's runtime, or
# "E 00:00:01.234567 executorch:method.cpp:123] message" from a build with log levels.
_NATIVE_ERROR = re.compile(r"^(?:\[|[EF] \d\d:\d\d:\d\d\.\d+ )[\w.:/-]+:\d+\] (.*)$")
_MAX_MESSAGE = 400
# ExecuTorch's edge dialect refuses an op outside Core ATen (exir's verifier), on every target.
_NOT_CORE_ATEN = re.compile(r"Operator (?:torch\._ops\.)?(\S+?) is not in Core ATen opset")
# What to do about such an op where etkit knows more than "write it another way".
_NOT_CORE_ATEN_ADVICE = {
    "aten.adaptive_max_pool2d.default": (
        "etkit rewrites it as max_pool2d where each output size divides its input size: choose "
        "such sizes, or pool with max_pool2d"
    ),
}


def exception_chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first (``__cause__``, else an unsuppressed
    ``__context__``)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif not current.__suppress_context__:
            current = current.__context__
        else:
            current = None
    return chain


def _first_line(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def reason_line(text: str) -> str:
    """``text`` (an error's message) on one line, keeping its reason where the first line is only
    a heading: a first line ending in ":" is joined with the next one, and the first error line
    of a "Stderr:" section (a failed tool's own output: the Arm backend's "Vgf compiler failed."
    is followed by lines "Repro command:", the command, "Stderr:" and model-converter's error)
    is added after it."""
    lines = [part.strip() for part in text.splitlines() if part.strip()]
    if not lines:
        return ""
    line = lines[0]
    if line.endswith(":") and len(lines) > 1 and lines[1].lower() != "stderr:":
        line = f"{line} {lines[1]}"
    heading = next((k for k, part in enumerate(lines) if part.lower() == "stderr:"), None)
    if heading is not None:
        section: list[str] = []
        for part in lines[heading + 1 :]:
            if part.lower() == "stdout:":
                break
            section.append(part)
        said = _error_of(section)
        if said:
            line = f"{line} {said}" if line.endswith(":") else f"{line.rstrip('.')}; stderr: {said}"
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def _error_of(lines: list[str]) -> str:
    """A tool's reason among its output lines: the first that says "error", else the first."""
    return next((part for part in lines if "error" in part.lower()), next(iter(lines), ""))


def _error_text(error: BaseException) -> str:
    """``error``'s reason on one line. A failed subprocess (``CalledProcessError``, whose text
    is only the command and the status) is named by its tool and status, with the error line of
    what it wrote when that was captured."""
    if not isinstance(error, subprocess.CalledProcessError):
        return reason_line(str(error))
    command = error.cmd[0] if isinstance(error.cmd, list | tuple) and error.cmd else error.cmd
    tool = Path(str(command)).name or "a command"
    said = ""
    for output in (error.stderr, error.output):
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        if isinstance(text, str):
            said = said or _error_of([p.strip() for p in text.splitlines() if p.strip()])
    line = f"{tool} exited with status {error.returncode}" + (f": {said}" if said else "")
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def root_cause(error: BaseException) -> str:
    """One line: the innermost error's type and the reason in its text (``reason_line``: its
    first line, with what a heading line introduces), and the innermost pass named on the way
    (torch's pass manager wraps a failing pass in an error that names it)."""
    chain = exception_chain(error)
    passes = [
        name for e in chain for name in _PASS_NAME.findall(str(e)) if name not in _WRAPPER_PASSES
    ]
    innermost = next(
        (e for e in reversed(chain) if _first_line(str(e))),
        chain[-1],
    )
    text = _error_text(innermost) or "(no message)"
    where = f" in pass {passes[-1]}" if passes else ""
    return f"{type(innermost).__name__}{where}: {text}"


def advice(error: BaseException) -> str:
    """What to do about a failure whose cause etkit recognizes in ``error``'s chain, in one
    sentence, or ""."""
    for cause in exception_chain(error):
        found = _NOT_CORE_ATEN.search(str(cause))
        if found:
            op = found.group(1)
            what = _NOT_CORE_ATEN_ADVICE.get(
                op, "write that part of the model with ops torch decomposes into Core ATen"
            )
            return (
                f"{op} is not a Core ATen op and torch has no decomposition of it, so ExecuTorch "
                f"lowers it for no target; {what}"
            )
    return ""


@dataclass
class NativeLog:
    """What native code wrote to the process's stderr inside ``capture_native_log``."""

    text: str = ""
    errors: list[str] = field(default_factory=list)


@contextmanager
def capture_native_log(echo: bool = False) -> Iterator[NativeLog]:
    """Redirects file descriptor 2 (where C++ code logs) into a temporary file for the block,
    then puts it back; ``log.errors`` holds the messages of ExecuTorch's log lines.
    ``echo`` writes the captured text to stderr afterwards. Python's ``sys.stderr`` points at
    the same descriptor for the block, so what is written there is captured too."""
    log = NativeLog()
    sys.stderr.flush()
    saved, python_stderr = os.dup(2), sys.stderr
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        # The pip runtime logs through Python's sys.stderr, which a host (pytest, an IDE) may
        # have pointed elsewhere than descriptor 2.
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115  (closed in finally)
        try:
            yield log
        finally:
            sys.stderr.close()
            sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode(errors="replace")
            log.errors = [
                match[1]
                for line in log.text.splitlines()
                if (match := _NATIVE_ERROR.match(line.strip()))
            ]
            if echo and log.text:
                sys.stderr.write(log.text)
                sys.stderr.flush()
