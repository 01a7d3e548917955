"""Ctrl-C and SIGTERM stop an export even when Python loses their exception.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal is handled; one
raised inside a weakref callback or a finalizer is printed as "Exception ignored" and dropped.
torch's lowering runs thousands of them (``WeakKeyDictionary``'s ``remove``, where a Ctrl-C 2.5 s
into a VGF export's ``lower_main`` was lost, and the export replaced the previous one with exit
0). ``Staging`` remembers each stop signal; the commit and the CLI's stage progress raise it
again."""

from __future__ import annotations

import signal
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from etkit_exporter.artifact.staging import MANIFEST, Staging, check_destination

PRODUCER = {"tool": "test"}
OLD = {"model.pte": "old program"}


@pytest.fixture(autouse=True)
def _ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C with Python's own handler, as a terminal gives it (a suite started in the
    background inherits SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _lose(signum: int) -> None:
    """``signum`` arriving while Python runs a weakref callback: its exception is raised there,
    written to stderr as "Exception ignored" and dropped."""

    class Node:
        pass

    node = Node()
    ref = weakref.ref(node, lambda _: signal.raise_signal(signum))
    del node  # the callback runs here
    assert ref() is None


def _export(target: Path, files: dict[str, str]) -> None:
    with Staging(check_destination(target, True)) as staging:
        for name, text in files.items():
            (staging.path / name).write_text(text)
        staging.commit(True, PRODUCER)


def _content(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.name != MANIFEST}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".etkit-" in p.name)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_lost_exception_is_a_lost_exception() -> None:
    """The premise: without ``Staging``, a Ctrl-C in a weakref callback raises nothing."""
    _lose(signal.SIGINT)


def _terminate(signum: int, _frame: FrameType | None) -> Any:
    raise SystemExit(128 + signum)  # as the pipeline's SIGTERM handler does


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    ("signum", "stop"),
    [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)],
)
def test_a_stop_signal_whose_exception_was_lost_still_stops_the_commit(
    tmp_path: Path, signum: int, stop: type[BaseException]
) -> None:
    target = tmp_path / "out"
    _export(target, OLD)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with pytest.raises(stop), Staging(check_destination(target, True)) as staging:
            (staging.path / "model.pte").write_text("new program")
            _lose(signum)
            staging.commit(True, PRODUCER)
        # the handlers put back
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is _terminate
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _content(target) == OLD
    assert _leftovers(tmp_path) == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_real_export_stops_at_the_next_stage_when_its_ctrl_c_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``etkit-export`` in this process: a Ctrl-C lost inside the first stage ends the export
    with 130 before the second stage, the previous export as it was."""
    from etkit_exporter.cli.export import main
    from etkit_exporter.export import pipeline

    target = tmp_path / "out"
    _export(target, OLD)
    checked = pipeline.check_grid_samplers

    def check_then_lose_a_ctrl_c(*args: Any, **kwargs: Any) -> Any:
        result = checked(*args, **kwargs)
        _lose(signal.SIGINT)
        return result

    monkeypatch.setattr(pipeline, "check_grid_samplers", check_then_lose_a_ctrl_c)
    status = main(["demo", "resample", "--target", "xnnpack", "--out", str(target), "--force"])
    out, err = capsys.readouterr()
    assert status == 130, err
    assert "stage normalize" not in out
    assert "interrupted; nothing was written" in err
    assert _content(target) == OLD
    assert _leftovers(tmp_path) == []
