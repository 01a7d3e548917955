"""The verdict as it was before it ran in bounded memory (issue 53), as the oracle of the new one:
the five modules of ``etkit_exporter.check`` that made it, read from git at ``ORACLE_COMMIT``
(every node's value of the quantized graph kept, every envelope run's tensors kept, the whole
localization on every verification), loaded beside the current package under another name.
The new verdict must give the same verdict and the same figures, figure for figure.

The repository's history is part of the repository: a clone without it (a shallow one) cannot
run this oracle, and says so in one line."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
ORACLE_COMMIT: Final = "5eb688f7732dc2f3fdda11d92632315c57c19a63"  # the last before the change
MODULES: Final = ("envelope", "references", "coordinates", "verdict", "verify")
PACKAGE: Final = "etkit_oracle_check"


def load(scratch: Path) -> Any:
    """The old ``check.verify`` module (its ``verify_export``), its siblings loaded with it."""
    if PACKAGE in sys.modules:
        return importlib.import_module(f"{PACKAGE}.verify")
    folder = scratch / PACKAGE
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    for name in MODULES:
        path = f"apps/exporter/src/etkit_exporter/check/{name}.py"
        shown = subprocess.run(
            ["git", "show", f"{ORACLE_COMMIT}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        if shown.returncode != 0:
            raise RuntimeError(
                f"the verdict oracle needs {path} at {ORACLE_COMMIT[:10]} from git history "
                f"(git said: {shown.stderr.strip()}); clone with history (no --depth)"
            )
        text = shown.stdout
        for other in MODULES:
            text = text.replace(f"etkit_exporter.check.{other}", f"{PACKAGE}.{other}")
        (folder / f"{name}.py").write_text(text)
    sys.path.insert(0, str(scratch))
    return importlib.import_module(f"{PACKAGE}.verify")


# What differs by design: how long a call took, the new verification's cost figures, and the
# figures of rules added since the oracle (issue 54's structured bias: per channel, value band
# and border ring; a model it fails still differs in "passes" and "result", as it must)
_VOLATILE: Final = ("seconds", "stages", "structured_bias")


_STRUCTURED_REASON: Final = re.compile(r" in the (channel \d+|top band|bottom band|border ring) \(")


def comparable(value: Any) -> Any:
    """``value`` (a verification's JSON) without the fields that differ from run to run (and the
    structured bias rule's own reasons, added since the oracle)."""
    if isinstance(value, dict):
        return {
            k: [r for r in v if not _STRUCTURED_REASON.search(str(r))]
            if k == "reasons" and isinstance(v, list)
            else comparable(v)
            for k, v in value.items()
            if k not in _VOLATILE
        }
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def first_difference(new: Any, old: Any, where: str = "verification") -> str | None:
    """Where two verifications first differ (a path and both values), or ``None``."""
    if isinstance(new, dict) and isinstance(old, dict):
        for key in sorted(set(new) | set(old)):
            if key not in new or key not in old:
                return f"{where}.{key}: only in the {'new' if key in new else 'old'} verdict"
            found = first_difference(new[key], old[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(new, list) and isinstance(old, list):
        if len(new) != len(old):
            return f"{where}: {len(new)} items against {len(old)}"
        for k, (a, b) in enumerate(zip(new, old, strict=True)):
            found = first_difference(a, b, f"{where}[{k}]")
            if found:
                return found
        return None
    return None if new == old else f"{where}: {new!r} now, {old!r} before"
