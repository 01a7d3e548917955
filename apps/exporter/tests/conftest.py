"""Fixtures of the exporter's tests: the tests that lower to VGF themselves find model-converter
whether or not the virtual environment is active, as the exporter arranges for its users."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from etkit_exporter.vgf.tools import configure_model_converter


@pytest.fixture(autouse=True, scope="session")
def _arm_tools_found() -> None:
    configure_model_converter()


# Runs etkit-export's main() on each argument list in ONE fresh interpreter (torch and
# ExecuTorch imported once, not once per case): each case's exit status, stderr and stdout, as
# a separate process per case would see them.
_BATCH = """
import contextlib, io, json, sys
from etkit_exporter.cli.export import main
runs = []
for argv in json.loads(sys.argv[1]):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    runs.append({"code": code, "stderr": err.getvalue(), "stdout": out.getvalue()})
print(json.dumps(runs))
"""


def run_cli_batch(cases: list[list[str]], cwd: Path) -> list[dict[str, Any]]:
    """``etkit-export`` on each of ``cases`` (argument lists), in one process in ``cwd``: a
    ``{"code", "stderr", "stdout"}`` per case."""
    done = subprocess.run(
        [sys.executable, "-c", _BATCH, json.dumps(cases)],
        cwd=cwd, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(runs) == len(cases)
    return runs


@pytest.fixture(scope="session")
def cli_batch() -> Any:
    return run_cli_batch
