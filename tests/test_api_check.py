"""``scripts/api_check.py``: each library's public API against its last release (griffe, from
the sources). The real libraries pass; a public function renamed in a scratch copy of a library
fails until the version is bumped as the README's policy says and the CHANGELOG names it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "api_check.py"


def api_check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, check=False
    )


def test_the_libraries_keep_their_released_api() -> None:
    result = api_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 libraries" in result.stdout
    for folder in sorted((ROOT / "libs").glob("*/pyproject.toml")):
        version = re.search(r'^version = "(.+)"', folder.read_text(), re.M)
        assert version is not None
        snapshots = sorted((folder.parent / "api").glob("*.json"))
        assert snapshots, f"{folder.parent.name}: no released API snapshot"


def scratch_quant(tmp_path: Path) -> Path:
    """A copy of etkit-quant (sources, pyproject, CHANGELOG, API snapshots) as ``libs/quant``
    of a scratch root."""
    library = tmp_path / "libs" / "quant"
    source = ROOT / "libs" / "quant"
    shutil.copytree(source / "src", library / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(source / "api", library / "api")
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(source / name, library / name)
    return library


def test_a_renamed_public_function_fails_without_its_bump_and_changelog(tmp_path: Path) -> None:
    library = scratch_quant(tmp_path)
    assert api_check("--root", tmp_path, "libs/quant").returncode == 0
    graph = library / "src" / "etkit_quant" / "graph.py"
    graph.write_text(graph.read_text().replace("def tensor_value(", "def node_tensor("))

    result = api_check("--root", tmp_path, "libs/quant")
    assert result.returncode == 1
    assert "without a minor version bump" in result.stdout
    assert "tensor_value" in result.stdout
    assert all(line.startswith("etkit-quant 0.1.0: ") for line in result.stdout.splitlines())

    pyproject = library / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    result = api_check("--root", tmp_path, "libs/quant")
    assert result.returncode == 1
    assert "CHANGELOG.md has no '## 0.2.0'" in result.stdout

    changelog = library / "CHANGELOG.md"
    text = changelog.read_text().replace(
        "## Unreleased\n", "## 0.2.0\n- `node_tensor`.\n\n## Unreleased\n", 1
    )
    changelog.write_text(text)
    result = api_check("--root", tmp_path, "libs/quant")
    assert result.returncode == 1
    assert "names no 'tensor_value'" in result.stdout

    changelog.write_text(text.replace("- `node_tensor`.", "- `tensor_value` is `node_tensor`."))
    result = api_check("--root", tmp_path, "libs/quant")
    assert result.returncode == 0, result.stdout


def test_an_added_function_needs_no_bump(tmp_path: Path) -> None:
    library = scratch_quant(tmp_path)
    graph = library / "src" / "etkit_quant" / "graph.py"
    graph.write_text(graph.read_text() + "\n\ndef new_query() -> None:\n    pass\n")
    assert api_check("--root", tmp_path, "libs/quant").returncode == 0


def test_a_bad_folder_is_one_line(tmp_path: Path) -> None:
    result = api_check("--root", tmp_path, "libs/nothing")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "not a package folder" in result.stderr


def test_a_broken_snapshot_is_one_line(tmp_path: Path) -> None:
    library = scratch_quant(tmp_path)
    (library / "api" / "0.1.0.json").write_text("{not json")
    result = api_check("--root", tmp_path, "libs/quant")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "0.1.0.json: not an API snapshot" in result.stderr
