#!/usr/bin/env python3
"""Guards each library's public API against its last release (griffe, read from the sources:
nothing is imported).

    python scripts/api_check.py [libs/quant ...]      check every library (or those named)
    python scripts/api_check.py --release libs/quant  tag HEAD etkit-quant-v<version> (its
                                                      version) and write that commit's API to
                                                      libs/quant/api/<version>.json (commit it)

The public API is what griffe sees as public: the names in a module's ``__all__`` where it has
one (each package's ``__init__``), else its names without a leading underscore, in every module
whose name has none. The last release is the newest snapshot ``<package>/api/<version>.json``
(committed, so a clone without tags has it); a tag ``etkit-<name>-v<version>`` newer than every
snapshot is read from git instead. A breaking change (a public object removed or renamed, a
parameter removed, reordered or made required, ...) passes only with the version bump the
package's README states (0.x: the minor version; from 1.0: the major version) in its
``pyproject.toml`` and a line in its CHANGELOG.md under that version's heading naming each
broken object. Exit 0: no problem; 1: a problem, one line each; 2: a usage error.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent


class UsageError(Exception):
    """A bad argument or a package folder that is not a library; its text is the one line."""


Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise UsageError(f"version {text!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def show(version: Version) -> str:
    return ".".join(str(v) for v in version)


@dataclass(frozen=True)
class Library:
    """A library folder: its distribution name, version, import name and source folder."""

    folder: Path
    name: str
    version: Version
    package: str

    @property
    def source(self) -> Path:
        return self.folder / "src"

    @property
    def snapshots(self) -> Path:
        return self.folder / "api"

    def tag(self, version: Version) -> str:
        return f"{self.name}-v{show(version)}"

    @classmethod
    def read(cls, folder: Path) -> Library:
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            raise UsageError(f"{folder}: not a package folder (no pyproject.toml)")
        project = tomllib.loads(pyproject.read_text())["project"]
        packages = [p.parent.name for p in (folder / "src").glob("*/__init__.py")]
        if len(packages) != 1:
            raise UsageError(f"{folder}: not one package under src/ ({packages or 'none'})")
        return cls(folder, project["name"], parse_version(project["version"]), packages[0])


def load(library: Library) -> griffe.Module:
    module = griffe.load(library.package, search_paths=[library.source], allow_inspection=False)
    assert isinstance(module, griffe.Module)
    return module


def snapshot_text(module: griffe.Module, root: Path) -> str:
    """The module's API as JSON: signatures, no docstrings, paths relative to ``root``."""

    def strip(obj: griffe.Object) -> None:
        obj.docstring = None
        for member in obj.members.values():
            if not member.is_alias:
                strip(member)  # type: ignore[arg-type]

    strip(module)
    text = module.as_json(full=False, indent=None)
    return text.replace(json.dumps(str(root.resolve()) + "/")[1:-1], "")


def load_snapshot(path: Path) -> griffe.Module:
    try:
        module = json.loads(path.read_text(), object_hook=griffe.json_decoder)
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise UsageError(f"{path}: not an API snapshot ({error})") from None
    collection = griffe.ModulesCollection()
    collection.set_member(module.path, module)
    module._modules_collection = collection  # aliases inside resolve through it
    assert isinstance(module, griffe.Module)
    return module


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def release_tags(library: Library) -> dict[Version, str]:
    found = git("tag", "--list", f"{library.name}-v*")
    tags: dict[Version, str] = {}
    for tag in found.stdout.split() if found.returncode == 0 else []:
        try:
            tags[parse_version(tag.removeprefix(f"{library.name}-v"))] = tag
        except UsageError:
            continue
    return tags


def baseline(library: Library) -> tuple[Version, str, griffe.Module] | None:
    """The last release's version, where its API comes from, and the API; ``None`` before the
    first release."""
    snapshots = {parse_version(p.stem): p for p in library.snapshots.glob("*.json")}
    tags = release_tags(library) if library.folder.resolve().is_relative_to(ROOT) else {}
    newest_snapshot = max(snapshots, default=None)
    newest_tag = max(tags, default=None)
    if newest_tag is not None and (newest_snapshot is None or newest_tag > newest_snapshot):
        module = griffe.load_git(
            library.package,
            ref=tags[newest_tag],
            repo=ROOT,
            search_paths=[library.source.resolve().relative_to(ROOT)],
            allow_inspection=False,
        )
        assert isinstance(module, griffe.Module)
        return newest_tag, f"tag {tags[newest_tag]}", module
    if newest_snapshot is None:
        return None
    path = snapshots[newest_snapshot]
    return newest_snapshot, str(path.relative_to(library.folder)), load_snapshot(path)


def required_bump(old: Version) -> str:
    return "major" if old[0] >= 1 else "minor"


def bumped(old: Version, new: Version) -> bool:
    if old[0] >= 1:
        return new[0] > old[0]
    return new[:2] > old[:2]


def changelog_section(library: Library, version: Version) -> list[str] | None:
    """The lines under CHANGELOG.md's heading for ``version`` (``## 0.2.0``, with anything
    after the number), up to the next heading; ``None`` without one."""
    path = library.folder / "CHANGELOG.md"
    lines = path.read_text().splitlines() if path.is_file() else []
    heading = re.compile(rf"## {re.escape(show(version))}\b")
    for index, line in enumerate(lines):
        if heading.match(line):
            rest = lines[index + 1 :]
            end = next((k for k, t in enumerate(rest) if t.startswith("## ")), len(rest))
            return rest[:end]
    return None


def check(library: Library) -> Iterator[str]:
    """One line per problem of ``library``'s API against its last release."""
    found = baseline(library)
    if found is None:
        return
    old_version, origin, old = found
    label = f"{library.name} {show(library.version)}"
    if library.version < old_version:
        yield f"{label}: older than its last release {show(old_version)} ({origin})"
        return
    breakages = list(griffe.find_breaking_changes(old, load(library)))
    if not breakages:
        return
    explained = [b.explain(griffe.ExplanationStyle.ONE_LINE) for b in breakages]
    explained = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in explained]
    if not bumped(old_version, library.version):
        bump = required_bump(old_version)
        for line in explained:
            yield (
                f"{label}: breaking change since {show(old_version)} ({origin}) without a "
                f"{bump} version bump (the README's policy): {line}"
            )
        return
    section = changelog_section(library, library.version)
    if section is None:
        yield f"{label}: breaking changes, and CHANGELOG.md has no '## {show(library.version)}'"
        return
    text = "\n".join(section)
    for breakage, line in zip(breakages, explained, strict=True):
        if not re.search(rf"\b{re.escape(breakage.obj.name)}\b", text):
            yield (
                f"{label}: CHANGELOG.md's '## {show(library.version)}' names no "
                f"'{breakage.obj.name}': {line}"
            )


def release(library: Library, ref: str) -> str:
    """Tags commit ``ref`` as the release of ``library``'s version and writes the snapshot of
    its API there (committed sources only: what the working tree adds is not released)."""
    tag = library.tag(library.version)
    made = git("tag", tag, ref)
    if made.returncode != 0:
        raise UsageError(f"{library.name}: cannot tag {ref} as {tag}: {made.stderr.strip()}")
    module = griffe.load_git(
        library.package,
        ref=tag,
        repo=ROOT,
        search_paths=[library.source.resolve().relative_to(ROOT)],
        allow_inspection=False,
    )
    assert isinstance(module, griffe.Module)
    library.snapshots.mkdir(exist_ok=True)
    path = library.snapshots / f"{show(library.version)}.json"
    text = snapshot_text(module, ROOT)
    path.write_text(re.sub(r'"filepath": ?"[^"]*?/(libs/[^"]*)"', r'"filepath": "\1"', text) + "\n")
    return f"{library.name}: tagged {ref} {tag}, wrote {path.relative_to(ROOT)}"


def libraries(root: Path, named: list[str]) -> list[Library]:
    folders = [root / n for n in named] if named else sorted(root.glob("libs/*"))
    return [Library.read(f) for f in folders if named or (f / "pyproject.toml").is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("folders", nargs="*", help="library folders (default: every libs/*)")
    parser.add_argument("--release", action="store_true", help="record the API as released")
    parser.add_argument("--ref", default="HEAD", help="with --release: the commit released")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        found = libraries(args.root, args.folders)
    except (UsageError, KeyError, tomllib.TOMLDecodeError) as error:
        print(f"api_check: {error}", file=sys.stderr)
        return 2
    if args.release:
        try:
            for library in found:
                print(release(library, args.ref))
        except UsageError as error:
            print(f"api_check: {error}", file=sys.stderr)
            return 2
        return 0
    try:
        problems = [line for library in found for line in check(library)]
    except (UsageError, OSError, ValueError) as error:  # a snapshot or CHANGELOG unreadable
        print(f"api_check: {error}", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    if not problems:
        print(f"api_check: {len(found)} libraries, no breaking change without its version bump")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
