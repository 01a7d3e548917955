"""``etkit doctor``: a real run as a subprocess, and how it reports a failing component."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from etkit_exporter.cli import doctor


def test_doctor_reports_every_component_working() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "etkit_exporter.cli.main", "doctor"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    components = [name for name, _ in doctor.CHECKS]
    assert len(lines) == len(components) + 1
    for line, component in zip(lines, components, strict=False):
        assert line.startswith("[ok  ]") and component in line
    assert "llvmpipe" in done.stdout  # the Vulkan device's name
    assert "all working" in lines[-1]


def test_failing_check_gives_fix_and_nonzero_status(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> str:
        raise doctor.CheckFailedError("model-converter --version failed", "pip install it")

    def crashing() -> str:
        raise OSError("boom")

    monkeypatch.setattr(
        doctor, "CHECKS", [("python", doctor.check_python), ("broken", broken), ("crash", crashing)]
    )
    results = doctor.run_checks()
    assert [r.ok for r in results] == [True, False, False]
    out = io.StringIO()
    doctor.print_results(results, out)
    text = out.getvalue()
    assert "[FAIL] broken" in text and "-> fix: pip install it" in text
    assert "OSError: boom" in text
    assert "2 of 3 not working" in text
    from etkit_exporter.cli.main import main

    assert main(["doctor"]) == 1


def test_unknown_component_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "etkit_exporter.cli.main", "doctor", "--only", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "invalid choice" in done.stderr
