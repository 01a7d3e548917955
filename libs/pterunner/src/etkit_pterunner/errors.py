"""The errors of the ``.pte`` runner: each names what it refers to (the file, the method, the
instruction, the operator, the delegate, the input) and says what to do."""

from __future__ import annotations

from collections.abc import Sequence


class PteError(Exception):
    """Base class of the runner's errors."""


class PteFormatError(PteError, ValueError):
    """The bytes are not an ExecuTorch program this runner reads: not a ``.pte`` at all, a
    truncated or corrupt one, or one written with another flatbuffer schema version."""


class UnsupportedProgramError(PteError, ValueError):
    """The program is a valid ``.pte``, but a method uses an operator the runner has no kernel
    for, a delegate whose backend id has no registered implementation, or a value kind it
    cannot represent. ``issues`` lists every problem, one line each."""

    def __init__(self, method: str, issues: Sequence[str]) -> None:
        self.method = method
        self.issues = tuple(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(
            f"method '{method}' cannot run in the .pte runner ({len(self.issues)} "
            f"problem{'s' if len(self.issues) != 1 else ''}):\n{lines}"
        )


class ProgramInputError(PteError, ValueError):
    """The inputs given to ``run`` do not fit the method's inputs (count, kind, shape, dtype)."""


class ExecutionError(PteError, RuntimeError):
    """A kernel or a delegate failed while the method ran; the message names the instruction."""
