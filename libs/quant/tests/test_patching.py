"""``PatchedWhileEntered``: installed on the first entry, restored on the last exit, also after
a raise, and across threads."""

from __future__ import annotations

import threading

import pytest

from etkit_quant.patching import PatchedWhileEntered


def test_installed_once_and_restored_on_the_last_exit_also_after_a_raise() -> None:
    calls: list[str] = []
    patch = PatchedWhileEntered(lambda: calls.append("install"), lambda: calls.append("restore"))
    with pytest.raises(RuntimeError), patch.entered():
        with patch.entered():
            assert calls == ["install"]
        assert calls == ["install"]  # the outer block still holds it
        raise RuntimeError
    assert calls == ["install", "restore"]
    with patch.entered():
        pass
    assert calls == ["install", "restore", "install", "restore"]


def test_threads_share_one_installation() -> None:
    calls: list[str] = []
    patch = PatchedWhileEntered(lambda: calls.append("install"), lambda: calls.append("restore"))
    inside, leave = threading.Barrier(3), threading.Event()

    def hold() -> None:
        with patch.entered():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()  # both threads are inside
    assert calls == ["install"]
    leave.set()
    for thread in threads:
        thread.join()
    assert calls == ["install", "restore"]
