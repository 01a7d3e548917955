"""The docs site (``mkdocs.yml``) builds with warnings as errors, its reference holds every public
name of every library, and the guides' Python examples still match the code.

- ``mkdocs build --strict``: a broken link or anchor, a module or function that does not exist,
  a cross-reference to nothing, an ``etkit-export``/``etkit`` option the parsers do not have
  (``docs/hooks/cli_reference.py``) each fail it; so does a page left out of the navigation.
- The reference: the site's inventory (``objects.inv``, written by mkdocstrings) holds every
  name in each library's ``__all__`` and every public function and class of its public modules.
- The examples: every ```` ```python ```` block of the pages that defines what it uses and
  exports nothing runs (a model factory it defines makes a model that runs); every other one
  runs its imports, and each call of an etkit function, class or method it names binds to that
  callable's signature (an export takes minutes: its calls are checked, not made).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import subprocess
import sys
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LIBRARIES = {
    "etkit_quant": "libs/quant/src",
    "etkit_partition": "libs/partition/src",
    "etkit_layout": "libs/layout/src",
    "etkit_gridsampler": "libs/gridsampler/src",
    "etkit_pterunner": "libs/pterunner/src",
}


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    return subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def inventory(site: Path) -> set[str]:
    data = (site / "objects.inv").read_bytes()
    start = 0
    for _ in range(4):  # the four header lines of a Sphinx inventory
        start = data.index(b"\n", start) + 1
    return {line.split()[0] for line in zlib.decompress(data[start:]).decode().splitlines()}


def public_objects(package: str, source: str) -> Iterator[str]:
    """The paths of each library's ``__all__`` names and of the public functions and classes of
    its public modules."""
    module = griffe.load(package, search_paths=[ROOT / source], allow_inspection=False)
    assert isinstance(module, griffe.Module)
    yield from (f"{package}.{n}" for n in module.exports or () if not str(n).startswith("_"))

    def walk(obj: griffe.Module) -> Iterator[str]:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:  # (dunders: filtered out)
                continue
            if member.is_module:
                yield from walk(member)  # type: ignore[arg-type]
            elif member.is_function or member.is_class:
                yield member.path

    yield from walk(module)


def test_the_site_builds_and_holds_every_public_name(site: Path) -> None:
    names = inventory(site)
    missing = [
        path
        for package, source in LIBRARIES.items()
        for path in public_objects(package, source)
        if path not in names
    ]
    assert missing == [], f"{len(missing)} public names not in the reference: {missing[:20]}"
    assert "etkit_exporter.export.pipeline.export_model" in names
    cli = (site / "reference" / "cli.html").read_text()
    for option in ("--verify-tolerance", "--sampler-delegate", "--qat-checkpoint", "--etdump"):
        assert option in cli, option


@pytest.mark.parametrize(
    ("page", "complaint"),
    [
        ("[a link](nowhere.md)\n", "nowhere.md"),
        ("::: etkit_quant.no_such_function\n", "no_such_function"),
    ],
)
def test_a_broken_link_or_a_missing_function_fails_the_build(
    tmp_path: Path, page: str, complaint: str
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Test\n\n" + page)
    config = tmp_path / "mkdocs.yml"
    plugins = (
        "plugins:\n  - mkdocstrings:\n      handlers:\n"
        f"        python:\n          paths: [{ROOT / 'libs/quant/src'}]\n"
    )
    config.write_text("site_name: test\nstrict: true\n" + (plugins if ":::" in page else ""))
    result = mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert complaint in result.stdout + result.stderr


def test_an_option_the_commands_do_not_have_is_named() -> None:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.pop(0)
    page = (
        "`etkit-export demo --verify --verify-tolerence samples=4`, `--sizes`, `--no-such`\n"
        "```sh\netkit run out --input a.png --etdump x  # --anything in a comment\n"
        "etkit inspect out --jsn\n```\n"
    )
    assert sorted(cli_reference.unknown_options(page)) == [
        "etkit inspect: no option --jsn",
        "etkit-export: no option --verify-tolerence",
        "no etkit option --no-such",
    ]


def pages_outside_the_site() -> list[Path]:
    """The Markdown a reader meets outside ``docs/``: READMEs, ARCHITECTURE.md, the pages the
    site includes (``--8<--``) and the measurement files. (CHANGELOGs name what was.)"""
    return sorted(
        {
            ROOT / "README.md",
            ROOT / "ARCHITECTURE.md",
            *ROOT.glob("libs/*/README.md"),
            *ROOT.glob("apps/*/README.md"),
            *ROOT.glob("libs/*/docs/*.md"),
            *ROOT.glob("apps/*/docs/*.md"),
            *ROOT.glob("bench/results/*.md"),
        }
    )


def test_the_pages_outside_the_site_name_what_exists() -> None:
    """The READMEs' and included pages' dotted etkit names and etkit options are checked as the
    site's are (``docs/hooks/cli_reference.py``)."""
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.pop(0)
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in pages_outside_the_site()
        for problem in [
            *cli_reference.missing_names(path.read_text(), str(ROOT)),
            *cli_reference.unknown_options(path.read_text()),
        ]
    ]
    assert problems == []


def python_examples() -> Iterator[tuple[str, str]]:
    for path in sorted(DOCS.rglob("*.md")):
        for index, block in enumerate(
            re.findall(r"^```python\n(.*?)^```", path.read_text(), re.M | re.S)
        ):
            yield f"{path.relative_to(DOCS)}#{index}", block


def callee(node: ast.expr, names: dict[str, Any]) -> Any:
    """The object a call's function expression names, through imported names and attributes;
    ``None`` where it is not known without running the example."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = callee(node.value, names)
        if owner is None:
            return None
        assert hasattr(owner, node.attr), f"{ast.unparse(node)}: no attribute {node.attr!r}"
        return getattr(owner, node.attr)
    return None


# What takes minutes (an export, QAT) or a written export: an example calling these is checked
# against the code, not run.
HEAVY = frozenset({"export_model", "qat_prepare", "load_program", "open"})


def self_contained(tree: ast.Module) -> bool:
    """Whether the example defines every name it reads and calls nothing ``HEAVY``."""
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    for node in ast.walk(tree):
        loaded = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        if loaded and (node.id not in defined or node.id in HEAVY):  # type: ignore[attr-defined]
            return False
        if isinstance(node, ast.Attribute) and node.attr in HEAVY:
            return False
    return True


@pytest.mark.parametrize(("where", "code"), list(python_examples()))
def test_a_guide_example_matches_the_code(where: str, code: str) -> None:
    """A self-contained example runs (and a model factory ``make`` it defines makes a model that
    runs on its example inputs); every other one is checked against the code's signatures."""
    tree = ast.parse(code, where)
    if self_contained(tree):
        # A module of its own: torch.export (strict) reads a traced function's globals by
        # importing its module, as for a module's classes.
        example = types.ModuleType("example")
        sys.modules["example"] = example
        try:
            exec(compile(tree, where, "exec"), example.__dict__)
            if "make" in example.__dict__:
                model, inputs = example.make()
                model(*inputs)
        finally:
            del sys.modules["example"]
        return
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module([node], []), where, "exec"), names)
    names.pop("__builtins__", None)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = callee(node.func, names)
        module = getattr(function, "__module__", "") or ""
        if function is None or not module.startswith("etkit_") or not callable(function):
            continue
        signature = inspect.signature(function)
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        # f(*args) or f(**kwargs) passes what is not known without running it: the arguments
        # named must bind, the ones left out may be in the unpacking.
        unpacked = any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        )
        arguments = [None] * sum(not isinstance(a, ast.Starred) for a in node.args)
        bind = signature.bind_partial if unpacked else signature.bind
        try:
            bind(*arguments, **keywords)
        except TypeError as error:
            raise AssertionError(f"{where}: {ast.unparse(node)[:80]}: {error}") from None
