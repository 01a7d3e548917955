"""Every failed export says why in one line without --verbose: the stage that failed and the
reason, on a line of its own. Real failures: ExecuTorch's verifier refusing an op outside Core
ATen, XNNPACK's runtime refusing a program when it loads (the 16-bit conv output that
``refuse_unproducible_outputs`` now refuses first, with that refusal switched off), and
Arm's VGF backend failing in model-converter, whose reason was only in the chain's outer error
("Vgf compiler failed.\\nRepro command: ...\\nStderr:\\n<model-converter's error>") while the
one line named the innermost, the ``CalledProcessError`` (its command and exit status)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from executorch.backends.arm.vgf.backend import vgf_compile

from etkit_exporter.core.diagnostics import reason_line, root_cause

POOL = """\
import torch


class UnevenPool(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool2d(torch.relu(x), 5)


def make():
    return UnevenPool(), (torch.rand(1, 2, 16, 16),)
"""


def _model_converter_failure() -> BaseException:
    """The error chain the Arm VGF backend raises when model-converter fails (here on a TOSA
    file that is not one): its own ``RuntimeError`` over the ``CalledProcessError``."""
    with pytest.raises(RuntimeError) as failed:
        vgf_compile(b"not a TOSA flatbuffer", [])
    return failed.value


def _export(argv: list[str], monkeypatch: pytest.MonkeyPatch, folder: Path) -> int:
    from etkit_exporter.cli.export import main

    monkeypatch.chdir(folder)
    return main(argv)


def test_a_failing_stage_prints_its_reason_line_without_verbose(tmp_path: Path) -> None:
    """A real stage failure, in a subprocess as a user runs it: the reason is on stderr."""
    (tmp_path / "pool.py").write_text(POOL)
    command = Path(sys.executable).parent / "etkit-export"
    done = subprocess.run(
        [str(command), "-m", "pool.py:make", "-t", "xnnpack", "-o", "out"],
        capture_output=True, text=True, check=False, cwd=tmp_path, env=dict(os.environ),
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    reason = [line for line in lines if line.startswith("etkit-export: export failed: stage '")]
    assert len(reason) == 1, done.stderr
    assert "aten.adaptive_max_pool2d.default is not a Core ATen op" in reason[0], done.stderr
    assert lines[-1] == "  (--verbose shows the whole chain of errors)", done.stderr
    assert not (tmp_path / "out").exists()


def test_the_runtime_refusing_the_program_is_the_line_without_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command the report names: q3.12 on the resample demo's conv output for XNNPACK,
    with the new up-front refusal switched off, fails in stage 'load', and the line says what
    XNNPACK said."""
    from etkit_exporter.export import quantization

    monkeypatch.setattr(quantization, "refuse_unproducible_outputs", lambda *_: None)
    argv = ["demo", "resample", "--target", "xnnpack", "--quant-output", "q3.12"]
    assert _export([*argv, "--quant-output", "snorm8", "-o", "out"], monkeypatch, tmp_path) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("etkit-export: export failed:")]
    assert "stage 'load' failed" in line, err
    assert "Failed to create convolution node" in line, err
    assert "xnn_status_invalid_parameter" in line, err


def test_a_failed_tool_is_named_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arm's model-converter failing inside a stage: the line gives model-converter's error,
    not only "Command '[...]' returned non-zero exit status 255"."""
    from etkit_exporter.export import pipeline

    failure = _model_converter_failure()

    def fails(*_: Any, **__: Any) -> None:
        raise failure

    monkeypatch.setattr(pipeline, "normalize_program", fails)
    assert _export(["demo", "stn", "-t", "vgf", "-o", "out"], monkeypatch, tmp_path) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("etkit-export: export failed:")]
    tool = "CalledProcessError: model-converter exited with status"
    assert f"stage 'normalize' failed: {tool}" in line, line
    assert "error:" in line.split(tool, 1)[1], line
    assert not (tmp_path / "out").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_starts_a_line_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The progress line a terminal shows ("capture done in 0.31 s", no end of line until the
    next stage) is ended before the failure's line, which would otherwise follow it."""
    from etkit_exporter.export import pipeline

    def fails(*_: Any, **__: Any) -> None:
        raise ValueError("\nthe reason, after a blank first line")

    monkeypatch.setattr(pipeline, "normalize_program", fails)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert _export(["demo", "stn", "-t", "xnnpack", "-o", "out"], monkeypatch, tmp_path) == 1
    shown = terminal.getvalue()
    assert "capture" in shown and "done in" in shown and shown.endswith("\n"), repr(shown)
    err = capsys.readouterr().err
    assert err.startswith(
        "etkit-export: export failed: stage 'normalize' failed: ValueError: the reason, after a "
        "blank first line\n"
    ), err


def test_root_cause_of_a_failed_tool_holds_the_tools_error() -> None:
    line = root_cause(_model_converter_failure())
    assert line.startswith("CalledProcessError: model-converter exited with status "), line
    assert "error:" in line and "\n" not in line, line


def test_reason_line_keeps_what_a_heading_introduces() -> None:
    assert reason_line("Failed running conv:\nshapes [1, 2] and [3] differ") == (
        "Failed running conv: shapes [1, 2] and [3] differ"
    )
    assert reason_line("\n\n  only line \n") == "only line"
    text = "Tool failed.\nRepro command:\n  tool -i x\nStderr:\nnote: x\nx:1: error: bad\nStdout:\n"
    assert reason_line(text) == "Tool failed; stderr: x:1: error: bad"
    assert reason_line(str(_model_converter_failure())).startswith("Vgf compiler failed; stderr: ")
    assert len(reason_line("x" * 1000)) == 400
