"""The artifacts folder: what an export may replace, replacement under kills at every step,
recovery, permissions and a full disk. Kills are real signals to real processes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from etkit_exporter.artifact.staging import (
    MANIFEST,
    DestinationError,
    Staging,
    check_destination,
    foreign_content,
    recover,
)

PRODUCER = {"tool": "test"}


def _export(target: Path, files: dict[str, str], force: bool = True) -> None:
    """A complete export made through the same staging and commit that ``export_model`` uses."""
    with Staging(check_destination(target, force)) as staging:
        for name, text in files.items():
            (staging.path / name).parent.mkdir(parents=True, exist_ok=True)
            (staging.path / name).write_text(text)
        staging.commit(force, PRODUCER)


def _content(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST
    }


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".etkit-" in p.name)


OLD = {"model.pte": "old program", "intermediates/a.vgf": "old vgf"}
NEW = {"model.pte": "new program", "report.md": "new report", "intermediates/b.tosa": "t"}


# -- what may be replaced ----------------------------------------------------------------------


@pytest.mark.parametrize("relative", [".", "", "..", "../.."])
def test_refuses_working_folder_and_its_ancestors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: str
) -> None:
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    (work / "mine.txt").write_text("keep")
    monkeypatch.chdir(work)
    with pytest.raises(DestinationError, match="working folder"):
        check_destination(relative, force=True)
    assert (work / "mine.txt").read_text() == "keep"


def test_refuses_home_and_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DestinationError, match="home folder"):
        check_destination(home, force=True)
    with pytest.raises(DestinationError, match="root of the file system"):
        check_destination("/", force=True)


def test_refuses_a_folder_etkit_did_not_write_even_with_force(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.png").write_bytes(b"\x89PNG")
    for force in (False, True):
        with pytest.raises(DestinationError, match="not an etkit export"):
            check_destination(folder, force=force)
    assert (folder / "holiday.png").read_bytes() == b"\x89PNG"


def test_refuses_an_export_holding_a_users_file(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _export(target, OLD)
    (target / "notes.txt").write_text("my notes")
    with pytest.raises(DestinationError, match=r"notes\.txt.*nothing was deleted"):
        check_destination(target, force=True)
    (target / "notes.txt").unlink()
    (target / "model.pte").write_text("edited by hand")
    with pytest.raises(DestinationError, match=r"model\.pte \(changed since etkit wrote it\)"):
        check_destination(target, force=True)


def test_refuses_a_file_without_suggesting_force(tmp_path: Path) -> None:
    (tmp_path / "model.pte").write_text("x")
    with pytest.raises(DestinationError, match="is a file, not a folder") as caught:
        check_destination(tmp_path / "model.pte", force=False)
    assert "force" not in str(caught.value)


def test_earlier_export_needs_force_and_empty_folder_does_not(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    assert check_destination(target, force=False).replaces == "an empty folder"
    _export(target, OLD, force=False)
    assert _content(target) == OLD
    with pytest.raises(FileExistsError, match="--force"):
        check_destination(target, force=False)
    _export(target, NEW, force=True)
    assert _content(target) == NEW and foreign_content(target) == []
    assert _leftovers(tmp_path) == []


def test_symbolic_link_is_followed_and_explained(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _export(real, OLD)
    link = tmp_path / "link"
    link.symlink_to(real)
    destination = check_destination(link, force=True)
    assert destination.path == real.resolve()
    assert any("symbolic link" in note and str(real) in note for note in destination.notes)
    _export(link, NEW)
    assert link.is_symlink() and _content(link) == NEW and _content(real) == NEW


def test_export_folder_follows_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        _export(tmp_path / "out", NEW)
    finally:
        os.umask(previous)
    for folder in (tmp_path / "out", tmp_path / "out" / "intermediates"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder


def test_failure_inside_the_block_leaves_the_previous_export(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _export(target, OLD)
    with pytest.raises(KeyboardInterrupt), Staging(check_destination(target, True)) as staging:
        (staging.path / "model.pte").write_text("half")
        raise KeyboardInterrupt
    assert _content(target) == OLD and _leftovers(tmp_path) == []


def test_export_written_meanwhile_is_not_replaced_without_force(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with Staging(check_destination(target, False)) as staging:
        (staging.path / "model.pte").write_text("slow")
        _export(target, OLD, force=False)  # another export finished first
        with pytest.raises(FileExistsError, match="another export"):
            staging.commit(False, PRODUCER)
    assert _content(target) == OLD and _leftovers(tmp_path) == []


# -- kills at every step of a replacement ------------------------------------------------------

_KILLER = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pathlib import Path
    from etkit_exporter.artifact import staging as artifacts

    target, kill_at, exchange = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    calls = 0

    def step() -> None:
        global calls
        calls += 1
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(function):
        def wrapper(*args, **kwargs):
            step()
            result = function(*args, **kwargs)
            step()
            return result
        return wrapper

    Path.rename = counted(Path.rename)
    Path.mkdir = counted(Path.mkdir)
    Path.write_text = counted(Path.write_text)
    shutil.rmtree = counted(shutil.rmtree)
    artifacts.write_manifest = counted(artifacts.write_manifest)
    real_exchange = artifacts._exchange
    artifacts._exchange = counted(real_exchange if exchange else (lambda a, b: False))
    with artifacts.Staging(artifacts.check_destination(target, True)) as staging:
        (staging.path / "model.pte").write_text("new program")
        (staging.path / "report.md").write_text("new report")
        staging.commit(True, {"tool": "test"})
    print("steps", calls)
    """
)


def _replace_killed_at(
    target: Path, kill_at: int, exchange: bool
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _KILLER, str(target), str(kill_at), "1" if exchange else "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "rename-aside"])
def test_kill_at_every_step_leaves_old_or_new(tmp_path: Path, exchange: bool) -> None:
    """SIGKILL before and after every file-system step of a replacement: the folder holds the
    old export or the new one at once, or after the next export's recovery; nothing stale stays."""
    new = {"model.pte": "new program", "report.md": "new report"}
    _export(tmp_path / "probe" / "out", OLD)
    done = _replace_killed_at(tmp_path / "probe" / "out", 0, exchange)
    assert done.returncode == 0, done.stderr
    steps = int(done.stdout.split()[-1])
    assert steps >= 8
    outcomes = set()
    for kill_at in range(1, steps + 1):
        parent = tmp_path / f"kill{kill_at}"
        target = parent / "out"
        _export(target, OLD)
        killed = _replace_killed_at(target, kill_at, exchange)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr)
        if target.exists():  # at every instant: old or new, intact
            assert foreign_content(target) == [] and _content(target) in (OLD, new), kill_at
        with pytest.raises(FileExistsError):  # the next export recovers first, then checks
            check_destination(target, force=False)
        assert foreign_content(target) == [] and _content(target) in (OLD, new), kill_at
        assert _leftovers(parent) == [], kill_at
        outcomes.add("new" if _content(target) == new else "old")
    assert outcomes == {"old", "new"}


def test_recovery_leaves_a_live_exports_staging_alone(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _export(target, OLD)
    with Staging(check_destination(target, True)) as live:
        (live.path / "model.pte").write_text("in progress")
        assert recover(target) == []  # locked by a live export
        assert live.path.exists()
        live.commit(True, PRODUCER)
    assert _content(target) == {"model.pte": "in progress"}


# -- real exports: signals, full disk ----------------------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _etkit_export(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """``etkit-export`` with Ctrl-C's default action, as a terminal gives it: a suite started
    in the background (``check.sh &`` from a script) ignores SIGINT, every child inherits that,
    and the export would then finish and exit 0."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "etkit-export"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,  # one call, before exec
    )


def _wait_for_stage(process: subprocess.Popen[str], stage: str) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(f"stage {stage}"):
            return
    raise AssertionError(f"no stage {stage}: {process.stderr.read() if process.stderr else ''}")


@pytest.fixture(scope="module")
def previous_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    parent = tmp_path_factory.mktemp("signals")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), "demo", "resample",
         "--target", "xnnpack", "--out", "out"],
        cwd=parent, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return parent / "out"


@pytest.mark.parametrize(
    ("sig", "stage", "status", "target"),
    [
        (signal.SIGTERM, "capture", 143, "xnnpack"),
        (signal.SIGKILL, "quantize", -signal.SIGKILL, "xnnpack"),
        # on demand (-m extended): SIGINT is CI's in the VGF lowering below
        pytest.param(signal.SIGINT, "lower_main", 130, "xnnpack", marks=pytest.mark.extended),
        (signal.SIGINT, "re_export", 130, "vgf"),  # VGF lowering: model-converter runs
    ],
)
def test_signal_during_a_real_export_keeps_the_previous_one(
    previous_export: Path, sig: int, stage: str, status: int, target: str
) -> None:
    before = {p: p.read_bytes() for p in previous_export.rglob("*") if p.is_file()}
    process = _etkit_export(
        "demo", "resample", "--target", target, "--out", "out", "--force",
        cwd=previous_export.parent,
    )  # fmt: skip
    _wait_for_stage(process, stage)
    if target == "vgf":
        time.sleep(1.0)  # into the VGF lowering
    sent = time.monotonic()
    process.send_signal(sig)
    process.wait(timeout=60)
    assert process.returncode == status
    # promptly: seconds, not the minutes the stage would take (5.6 s measured on a loaded
    # 2-core machine, under 2 s idle)
    assert time.monotonic() - sent < 15, "the export did not stop promptly"
    assert {p: p.read_bytes() for p in previous_export.rglob("*") if p.is_file()} == before
    if sig != signal.SIGKILL:  # Ctrl-C and SIGTERM clean up at once
        assert _leftovers(previous_export.parent) == []
        assert "is as it was" in (process.stderr.read() if process.stderr else "")
    recover(previous_export)
    assert _leftovers(previous_export.parent) == []


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    return mounted.returncode == 0


def test_full_disk_names_the_folder_and_keeps_the_previous_export(tmp_path: Path) -> None:
    """A real export onto a real full file system (a 2 MB tmpfs, where this user may mount one;
    otherwise ENOSPC injected into every write of the same export in a child process)."""
    disk = tmp_path / "disk"
    real_disk = _mount_tmpfs(disk, "2m")
    try:
        _export(disk / "out", OLD)
        env = dict(os.environ)
        if real_disk:
            with (disk / "filler").open("wb", buffering=0) as stream:
                try:
                    while True:
                        stream.write(b"\0" * 4096)
                except OSError:
                    pass
            command = [str(Path(sys.executable).parent / "etkit-export")]
        else:
            command = [sys.executable, "-c", _ENOSPC_EXPORT]
        done = subprocess.run(
            [*command, "demo", "resample", "--target", "xnnpack", "--out", "out", "--force"],
            cwd=disk, capture_output=True, text=True, timeout=600, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        (reason,) = [line for line in done.stderr.splitlines() if line.startswith("etkit-export")]
        assert "the disk is full" in reason and str(disk) in reason and "Traceback" not in reason
        assert _content(disk / "out") == OLD and foreign_content(disk / "out") == []
        assert _leftovers(disk) == []
    finally:
        if real_disk:
            subprocess.run(["umount", str(disk)], check=False)


_ENOSPC_EXPORT = textwrap.dedent(
    """
    import errno, sys
    from pathlib import Path
    from etkit_exporter.cli.export import main

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    Path.write_bytes = full
    sys.exit(main(sys.argv[1:]))
    """
)


def test_cli_refusals_are_one_line_usage_errors(tmp_path: Path, cli_batch: Any) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "file.pte").write_text("x")
    cases = (
        (".", "working folder"),
        ("", "working folder"),
        ("..", "holds the working folder"),
        ("file.pte", "is a file, not a folder"),
    )
    runs = cli_batch([["demo", "--out", out, "--force"] for out, _ in cases], tmp_path)
    for (out, message), run in zip(cases, runs, strict=True):
        assert run["code"] == 2, (out, run["stderr"])
        assert message in run["stderr"] and len(run["stderr"].strip().splitlines()) == 1, out
        assert "Traceback" not in run["stderr"]
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.pte", "keep.txt"]


@pytest.mark.parametrize("force", [False, True], ids=["no-force", "force"])
def test_two_concurrent_exports_into_one_folder_leave_one_whole_export(
    tmp_path: Path, force: bool
) -> None:
    extra = ["--force"] if force else []
    processes = [
        _etkit_export(
            "demo", "resample", "--target", "xnnpack", "--out", "out", *extra, cwd=tmp_path
        )
        for _ in range(2)
    ]
    statuses = sorted(p.wait(timeout=600) for p in processes)
    # without --force the second to finish finds the first's export and leaves it (exit 2)
    assert statuses == ([0, 0] if force else [0, 2]), statuses
    assert foreign_content(tmp_path / "out") == []
    assert (tmp_path / "out" / "model.pte").stat().st_size > 0
    assert _leftovers(tmp_path) == []


# -- names, measured files, a failed verification's folder ------------------------------------


def test_name_too_long_refused_before_anything_is_touched(tmp_path: Path) -> None:
    """A name the file system would take, but not with etkit's staging suffix, is refused in
    one line naming the limit; a name that fits is taken."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    for length in (300, name_max - 20):
        with pytest.raises(DestinationError, match="choose a name of at most") as caught:
            check_destination(tmp_path / ("x" * length), force=False)
        assert len(str(caught.value).splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    longest = name_max - len(".failed-verification") - len(".") - len(".etkit-new-") - 8
    _export(tmp_path / ("y" * longest), NEW, force=False)
    assert foreign_content(tmp_path / ("y" * longest)) == []


def test_measured_files_listed_by_name_only(tmp_path: Path) -> None:
    """timings.json (measured times) is in the manifest by name, so two exports of one model
    have the same manifest, and etkit still replaces it; any other changed file is refused."""
    for name, seconds in (("a", "1.5"), ("b", "2.25")):
        _export(tmp_path / name, {**NEW, "timings.json": seconds}, force=False)
    first, second = ((tmp_path / n / MANIFEST).read_bytes() for n in ("a", "b"))
    assert first == second and b'"measured"' in first
    (tmp_path / "a" / "timings.json").write_text("changed")
    assert foreign_content(tmp_path / "a") == []
    (tmp_path / "a" / "report.md").write_text("changed")
    assert foreign_content(tmp_path / "a") == ["report.md (changed since etkit wrote it)"]


def test_retargeted_staging_commits_beside_and_recovery_never_promotes_it(
    tmp_path: Path,
) -> None:
    """A failed verification's export is committed to its own folder beside the artifacts
    folder: the earlier export stays, and no staging folder of the artifacts folder's name is
    left for recovery to put in its place."""
    target, failed = tmp_path / "out", tmp_path / "out.failed-verification"
    _export(target, OLD)
    with Staging(check_destination(target, force=True)) as staging:
        for name, text in NEW.items():
            (staging.path / name).parent.mkdir(parents=True, exist_ok=True)
            (staging.path / name).write_text(text)
        staging.retarget(check_destination(failed, force=True))
        assert staging.path.name.startswith(".out.failed-verification.etkit-new-")
        staging.commit(True, {**PRODUCER, "verification": "failed"})
    assert _content(target) == OLD and _content(failed) == NEW
    assert recover(target) == [] and _leftovers(tmp_path) == []
    elsewhere = check_destination(tmp_path / "sub" / "x", force=True)
    with (
        pytest.raises(ValueError, match="not beside"),
        Staging(check_destination(target, force=True)) as staging,
    ):
        staging.retarget(elsewhere)
