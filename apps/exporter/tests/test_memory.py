"""Peak resident memory by stage (core/memory.py), the one-line refusal of a stage that will not
fit, and the CLI's progress lines of a verification's stages."""

from __future__ import annotations

import io

import pytest

from etkit_exporter.core import memory
from etkit_exporter.core.errors import ExportError


def test_nested_watches_each_see_their_own_peak() -> None:
    if not memory.reset_peak():
        pytest.fail("this Linux does not reset VmHWM: the stage peaks would read None")
    with memory.watch() as outer:
        with memory.watch() as inner:
            block = bytearray(300 * memory.MB)  # touched: resident
            block[::4096] = b"\x01" * len(block[::4096])
            del block
            inner_peak = inner()
        with memory.watch() as later:
            later_peak = later()
        outer_peak = outer()
    assert inner_peak is not None and later_peak is not None and outer_peak is not None
    # the outer watch kept the inner's peak although the later watch reset the kernel's
    assert outer_peak >= inner_peak > later_peak + 250 * memory.MB


def test_a_stage_that_will_not_fit_is_refused_in_one_line() -> None:
    free = memory.available()
    assert free is not None
    with pytest.raises(ExportError) as caught:
        memory.require(free * 2, "the rounding envelope", "verify at a smaller size")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the rounding envelope needs about ")
    assert "MB free: verify at a smaller size" in message
    memory.require(1, "a tiny stage", "nothing")  # fits: no error


def test_verification_progress_lines() -> None:
    from etkit_exporter.cli.export import _Progress

    stream = io.StringIO()
    progress = _Progress(stream)
    progress.step("envelope of the outputs", 0, 0)
    progress.step("envelope of the outputs", 3, 18)  # a pipe gets one line per part
    progress.step("coordinates and localization", 0, 0)
    assert stream.getvalue().splitlines() == [
        "verify: envelope of the outputs",
        "verify: coordinates and localization",
    ]
