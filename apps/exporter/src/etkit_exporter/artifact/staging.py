"""The artifacts folder: where an export may go, what it may replace, and replacing it so that a
kill at any instant leaves either the previous export or the new one in place.

Rules (the docs' reference, "Where exports go, and what ``--force`` replaces",
``docs/reference/artifacts.md``, says the same to users):

- An export is written into a staging folder ``.NAME.etkit-new-XXXXXXXX`` beside ``NAME`` and
  committed by an atomic exchange of the two folders (``renameat2(RENAME_EXCHANGE)``; where the
  file system has no exchange: rename the old aside to ``.NAME.etkit-old-XXXXXXXX``, rename the
  new in, delete the old). Every export holds ``etkit-manifest.json``: each file etkit wrote
  there, with its size and SHA-256. It is written last, so a folder with a valid manifest is a
  complete export.
- An existing folder is replaced only when it is empty or its content is exactly what its
  manifest lists (so etkit can prove it wrote every file it deletes), and, for an export, only
  with ``force``. The working folder, its ancestors, the home folder, the root and mount points
  are refused whatever they hold. A symbolic link is followed to its target, and said so.
- A live export holds an advisory lock (``flock``) on its staging folder. The next export into the
  same place finishes or rolls back an interrupted replacement and deletes the stale staging
  folders of this naming whose owner died; it leaves those a live export holds. Creating,
  recovering and committing happen under a lock on the parent folder, so two exports into one
  place serialize there and leave one complete export.
- A stop signal (Ctrl-C, SIGTERM) received while the folder is staged stops the export before
  the commit even when Python lost its exception: Python raises ``KeyboardInterrupt`` wherever
  the main thread is, and one raised inside a finalizer or a weakref callback (torch's lowering
  runs thousands) is printed as "Exception ignored" and dropped. ``Staging`` remembers each stop
  signal its handler saw; ``raise_stop_signal`` (before the commit's swap, and the CLI after each
  stage) raises it again.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

logger = logging.getLogger(__name__)

MANIFEST: Final = "etkit-manifest.json"
MANIFEST_FORMAT: Final = 1
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100


class DestinationError(ValueError):
    """The artifacts folder names a place etkit will not write or replace; the message says why
    and what to do instead."""


@dataclass(frozen=True)
class Destination:
    """Where an export goes: ``path`` (symbolic links resolved) and what is there now."""

    requested: Path
    path: Path
    replaces: str  # "nothing", "an empty folder" or "an earlier etkit export"
    notes: tuple[str, ...] = field(default=())


def _forbidden_reason(path: Path) -> str | None:
    """Why ``path`` (resolved) may never be an artifacts folder, or ``None``."""
    if path == Path(path.anchor):
        return "it is the root of the file system"
    cwd = Path.cwd().resolve()
    if path == cwd:
        return "it is the working folder"
    if cwd.is_relative_to(path):
        return f"it holds the working folder ({cwd})"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError):
        home = None
    if home is not None and (path == home or home.is_relative_to(path)):
        return "it is the home folder or holds it"
    if path.is_dir() and os.path.ismount(path):
        return "it is a mount point, and etkit replaces a folder by renaming it"
    return None


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Files of measured times (they differ from run to run): listed by name only, so that two exports
# of one model have the same manifest; etkit replaces them whatever they hold
MEASURED: Final = frozenset({"timings.json"})


def write_manifest(folder: Path, producer: dict[str, Any]) -> None:
    """Lists every file under ``folder`` (size and SHA-256; the ``MEASURED`` ones by name) in
    ``folder/etkit-manifest.json``. Written last: its presence marks a complete export. Holds
    no path outside the folder."""
    files: dict[str, dict[str, Any]] = {}
    measured: list[str] = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise OSError(f"{path} is a symbolic link; an export holds plain files only")
        if path.is_file() and path.name != MANIFEST:
            relative = path.relative_to(folder).as_posix()
            if relative in MEASURED:
                measured.append(relative)
                continue
            files[relative] = {"size": path.stat().st_size, "sha256": _file_digest(path)}
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "producer": producer, "files": files}
    if measured:
        manifest["measured"] = measured
    staged = folder / f".{MANIFEST}.partial"
    with staged.open("w") as stream:
        stream.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    staged.rename(folder / MANIFEST)


def foreign_content(folder: Path, limit: int = 5) -> list[str] | None:
    """What in ``folder`` etkit cannot prove it wrote: ``None`` when the folder has no valid
    manifest, else the files (at most ``limit``) that are missing from the manifest, differ from
    it, or are not plain files; ``[]`` for an intact export."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        listed = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(listed, dict):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    foreign: list[str] = []
    seen: set[str] = set()
    measured = set(manifest.get("measured") or []) & MEASURED
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            foreign.append(f"{relative} (not a plain file)")
        elif path.is_file() and relative in measured:
            continue
        elif path.is_file() and relative != MANIFEST:
            entry = listed.get(relative)
            seen.add(relative)
            if not isinstance(entry, dict):
                foreign.append(relative)
            elif entry.get("size") != path.stat().st_size or entry.get("sha256") != _file_digest(
                path
            ):
                foreign.append(f"{relative} (changed since etkit wrote it)")
        if len(foreign) >= limit:
            return foreign
    for relative in sorted(set(listed) - seen):
        foreign.append(f"{relative} (listed but missing)")
    return foreign[:limit]


def _replaceable(path: Path, requested: Path) -> str:
    """What ``path`` holds, if etkit may replace it; raises ``DestinationError`` otherwise."""
    if not path.exists():
        return "nothing"
    if not path.is_dir():
        raise DestinationError(
            f"{requested} is a file, not a folder: give the path of a folder for the artifacts"
        )
    if not any(path.iterdir()):
        return "an empty folder"
    foreign = foreign_content(path)
    if foreign is None:
        raise DestinationError(
            f"{requested} holds files and is not an etkit export (it has no valid {MANIFEST}); "
            "etkit replaces only folders it wrote, even with --force: choose a new or empty folder"
        )
    if foreign:
        raise DestinationError(
            f"{requested} is an etkit export that now holds files etkit did not write: "
            f"{', '.join(foreign)}; move them out or choose another folder (nothing was deleted)"
        )
    return "an earlier etkit export"


def check_destination(requested: str | Path, force: bool) -> Destination:
    """Checks, before any work, that an export may be written at ``requested``, after
    finishing or rolling back what a killed export left there (``recover``; said in ``notes``).

    Raises ``DestinationError`` for a place etkit never writes or replaces (see the module
    docstring) and ``FileExistsError`` for an earlier etkit export without ``force``."""
    requested = Path(requested)
    _check_name_length(requested)
    notes: list[str] = []
    if requested.is_symlink():
        target = requested.resolve()
        notes.append(
            f"{requested} is a symbolic link to {target}: the export goes there and the link stays"
        )
    path = requested.resolve()
    reason = _forbidden_reason(path)
    if reason is not None:
        raise DestinationError(
            f"refusing to use {str(requested) or repr('')} ({path}) as the artifacts folder: "
            f"{reason}; give a folder of its own, e.g. artifacts/NAME"
        )
    if path.parent.is_dir() and os.access(path.parent, os.W_OK | os.X_OK):
        with _folder_lock(path.parent):
            notes += recover(path)  # what a killed export left, before judging what is there
    replaces = _replaceable(path, requested)
    if replaces == "an earlier etkit export" and not force:
        raise FileExistsError(
            f"{requested} holds an earlier etkit export; pass force=True (--force) to replace it, "
            "or choose another folder"
        )
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot write the artifacts beside {requested}: {existing} is not a folder this user "
            "can write; choose another --out"
        )
    return Destination(requested, path, replaces, tuple(notes))


# The longest suffix etkit puts on an artifacts folder's name: a failed verification's export is
# staged as ".NAME.failed-verification.etkit-new-XXXXXXXX"
_FAILED_SUFFIX: Final = ".failed-verification"
_STAGING_AFFIXES: Final = len(".") + len(".etkit-new-") + 8


def _check_name_length(requested: Path) -> None:
    """Refuses, in one line, a path whose folder names are longer than the file system takes
    (with room for the names etkit stages the export under), before anything touches it."""
    existing = requested.absolute().parent
    while not existing.is_dir() and existing != existing.parent:
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in requested.parts[:-1]:
        if len(os.fsencode(part)) > name_max:
            raise DestinationError(
                f"--out/artifacts_root has a folder name of {len(os.fsencode(part))} bytes "
                f"({part[:24]}...); this file system takes at most {name_max}: choose a "
                "shorter path"
            )
    length = len(os.fsencode(requested.name))
    failed = requested.name.endswith(_FAILED_SUFFIX)
    affixes = _STAGING_AFFIXES + (0 if failed else len(_FAILED_SUFFIX))
    if length + affixes > name_max:
        raise DestinationError(
            f"the artifacts folder's name is {length} bytes ({requested.name[:24]}...); etkit "
            f"stages it under a name {affixes} bytes longer and this file system takes at most "
            f"{name_max}: choose a name of at most {name_max - affixes} bytes"
        )
    if len(os.fsencode(str(requested.absolute()))) + affixes >= path_max:
        raise DestinationError(
            f"the artifacts folder's path is longer than this system takes ({path_max} bytes "
            "with etkit's staging suffix): choose a shorter path"
        )


# -- locks and names ------------------------------------------------------------------------


@contextmanager
def _folder_lock(folder: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on a folder; yields whether it was taken."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(name)}\.etkit-(new|old)-[0-9a-z_]{{8}}")


def _fresh_name(parent: Path, name: str, kind: str) -> Path:
    while True:
        candidate = parent / f".{name}.etkit-{kind}-{secrets.token_hex(4)}"
        if not candidate.exists():
            return candidate


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two folders; ``False`` where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    path_arg, fd_arg = ctypes.c_char_p, ctypes.c_int
    renameat2.argtypes = [fd_arg, path_arg, fd_arg, path_arg, ctypes.c_uint]
    status = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if status == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


# -- recovery --------------------------------------------------------------------------------


def recover(path: Path) -> list[str]:
    """Finishes or rolls back a replacement at ``path`` that a killed export left, and deletes
    stale staging folders of this naming whose owner died. Returns what it did, one line each.
    Call with the parent folder locked."""
    parent, name = path.parent, path.name
    if not parent.is_dir():
        return []
    done: list[str] = []
    pattern = _pattern(name)

    def modified(folder: Path) -> float:
        try:
            return folder.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    candidates = sorted(
        (p for p in parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir()),
        key=modified,
        reverse=True,
    )
    stale: list[tuple[Path, str]] = []
    for candidate in candidates:
        with _folder_lock(candidate, blocking=False) as free:
            if free:
                stale.append((candidate, pattern.fullmatch(candidate.name)[1]))  # type: ignore[index]
    if not path.exists():
        complete = [p for p, kind in stale if kind == "new" and foreign_content(p) == []]
        earlier = [p for p, kind in stale if kind == "old" and foreign_content(p) == []]
        chosen = complete[0] if complete else earlier[0] if earlier else None
        if chosen is not None:
            chosen.rename(path)
            stale = [(p, k) for p, k in stale if p != chosen]
            action = "finished" if chosen in complete else "rolled back"
            done.append(f"{action} an interrupted replacement of {path} (from {chosen.name})")
    for candidate, kind in stale:
        if kind == "old" and foreign_content(candidate) != []:
            logger.warning("left %s: it is not an intact etkit export", candidate)
            continue
        shutil.rmtree(candidate, ignore_errors=True)
        done.append(f"removed {candidate.name}, left by an export that did not finish")
    return done


# -- staging and commit ----------------------------------------------------------------------


_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
_SignalHandler = Callable[[int, FrameType | None], Any]


class _StopSignals:
    """While installed (main thread only): every Python-level handler of SIGINT and SIGTERM
    (Python's own ``KeyboardInterrupt``, the pipeline's ``SystemExit(143)``) wrapped so that
    each signal it is called for is remembered, with the handler, until ``raise_stop_signal``
    calls that handler again. Signals with their default action or ignored are left alone."""

    active: Final[list[_StopSignals]] = []

    def __init__(self) -> None:
        self.received: list[tuple[int, _SignalHandler]] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in _STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                self._previous[signum] = handler
                signal.signal(signum, self._remembering(handler))
        _StopSignals.active.append(self)

    def _remembering(self, handler: _SignalHandler) -> _SignalHandler:
        def remember(signum: int, frame: FrameType | None) -> Any:
            self.received.append((signum, handler))
            return handler(signum, frame)

        return remember

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self in _StopSignals.active:
            _StopSignals.active.remove(self)


def raise_stop_signal() -> None:
    """Raises the exception of a stop signal (Ctrl-C: ``KeyboardInterrupt``; SIGTERM during an
    export: ``SystemExit(143)``) received while an export is staged, when that exception did
    not end the export (Python drops one raised in a finalizer); nothing otherwise."""
    for stops in reversed(_StopSignals.active):
        if stops.received:
            signum, handler = stops.received[0]
            stops.received.clear()
            handler(signum, None)


class Staging:
    """The folder an export is written into, and its commit into place.

    ``with Staging(destination) as staging:`` creates and locks ``staging.path`` (permissions
    from the umask, as a folder made with ``mkdir``); ``staging.commit(force, producer)``
    writes the manifest and swaps the folder into place. Leaving the block without a commit
    (any exception, ``KeyboardInterrupt`` included) deletes the staging folder. A stop signal
    received inside the block stops the commit even when its exception was lost (the module's
    docstring says how)."""

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.path = destination.path  # replaced on entry
        self.recovered: list[str] = []
        self._fd: int | None = None
        self._committed = False
        self._stops = _StopSignals()

    def __enter__(self) -> Staging:
        self._stops.install()
        try:
            return self._enter()
        except BaseException:
            self._stops.uninstall()
            raise

    def _enter(self) -> Staging:
        target = self.destination.path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with _folder_lock(target.parent):
                self.recovered = recover(target)
                staging = _fresh_name(target.parent, target.name, "new")
                staging.mkdir()  # the umask applies, unlike mkdtemp's 0700
                self._fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise DestinationError(
                f"cannot write the artifacts beside {self.destination.requested}: "
                f"{error.strerror} ({error.filename}); choose a folder this user can write"
            ) from error
        self.path = staging
        for line in self.recovered:
            logger.warning("%s", line)
        return self

    def retarget(self, destination: Destination) -> None:
        """Makes ``destination`` (beside the first one, in the same parent folder) the one
        ``commit`` puts the export in: renames the staging folder to that destination's staging
        name, so that recovery after a kill never takes it for the first destination's."""
        if destination.path.parent != self.destination.path.parent:
            raise ValueError(
                f"{destination.requested} is not beside {self.destination.requested}: a staged "
                "export can only be committed in the folder it was staged in"
            )
        with _folder_lock(destination.path.parent):
            renamed = _fresh_name(destination.path.parent, destination.path.name, "new")
            self.path.rename(renamed)  # the lock on the folder (its descriptor) goes with it
        self.path = renamed
        self.destination = destination

    def commit(self, force: bool, producer: dict[str, Any]) -> None:
        """Writes the manifest, then puts the staging folder in place of the destination,
        checking again (under the parent's lock) that what is there may be replaced."""
        write_manifest(self.path, producer)
        target, requested = self.destination.path, self.destination.requested
        old: Path | None = None
        with _folder_lock(target.parent):
            replaces = _replaceable(target, requested)
            if replaces == "an earlier etkit export" and not force:
                raise FileExistsError(
                    f"{requested} was written by another export while this one ran; pass "
                    "force=True (--force) to replace it"
                )
            raise_stop_signal()  # the last moment an interrupt can keep what is there
            if replaces == "nothing":
                self.path.rename(target)
            elif _exchange(self.path, target):
                old = self.path
            else:
                with _folder_lock(target) as _:
                    old = _fresh_name(target.parent, target.name, "old")
                    target.rename(old)
                    self.path.rename(target)
            self._committed = True
            self.path = target
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self._stops.uninstall()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._committed and self.path != self.destination.path:
            shutil.rmtree(self.path, ignore_errors=True)
