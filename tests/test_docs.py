"""The docs site (``mkdocs.yml``) builds with warnings as errors, its reference holds every public
name of every library, and the guides' Python examples run.

- ``mkdocs build --strict``: a broken link or anchor, a module or function that does not exist,
  a cross-reference to nothing, an ``etkit-export``/``etkit`` option the parsers do not have
  (``docs/hooks/cli_reference.py``) each fail it; so does a page left out of the navigation.
- The reference: the site's inventory (``objects.inv``, written by mkdocstrings) holds every
  name in each library's ``__all__`` and every public function and class of its public modules.
- The examples: every ```` ```python ```` block of the pages under ``docs/`` runs, exports and
  QAT included, as a reader would run it, and so does every block of the files those pages
  include (``--8<--``, pymdownx.snippets: the libraries' READMEs, the exporter's ``docs/``), as
  part of the page that includes them: a page's blocks in order in one namespace and working
  folder, with what the page's prose assumes the reader has (a model, its inputs, calibration
  samples, a written export) added first at small size (``docs_context.py``). The pages share
  what is slow: the "Run a program" guide runs the export the "Your own model" guide writes.
  (The shell blocks' ``etkit-export``/``etkit`` options are checked by the build.)"""

from __future__ import annotations

import ast
import contextlib
import re
import subprocess
import sys
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import docs_context
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


SNIPPET = re.compile(r'--8<-- "(?P<path>[^":]+)(?::(?P<start>\d*))?(?::(?P<end>\d*))?"')


class Example(NamedTuple):
    """A ```` ```python ```` block: the file it is written in (relative to the repository) and
    the line its code starts on there."""

    source: str
    line: int
    code: str


def page_lines(path: Path, root: Path, start: int = 1, end: int = 0) -> list[tuple[str, Path, int]]:
    """The lines ``start`` to ``end`` (0: the last) of ``path`` as the site renders them, each
    with the file and line it comes from: a ``--8<-- "FILE[:START[:END]]"`` line is replaced by
    those lines of FILE (relative to ``root``, pymdownx.snippets' ``base_path``), which may
    include others."""
    lines = path.read_text().splitlines()
    rendered: list[tuple[str, Path, int]] = []
    for number in range(start, (end or len(lines)) + 1):
        text = lines[number - 1]
        if not text.strip().startswith("--8<--"):
            rendered.append((text, path, number))
        elif match := SNIPPET.fullmatch(text.strip()):
            included = root / match["path"]
            rendered += page_lines(included, root, int(match["start"] or 1), int(match["end"] or 0))
        else:  # a form of pymdownx.snippets read here as none: its examples would go unrun
            raise ValueError(f"{path}:{number}: a snippet line not understood: {text}")
    return rendered


def python_examples(docs: Path = DOCS, root: Path = ROOT) -> dict[str, list[Example]]:
    """Each page's ```` ```python ```` blocks, its included files' among them, in the order the
    site renders them, by the page's path under ``docs/``."""
    examples: dict[str, list[Example]] = {}
    for path in sorted(docs.rglob("*.md")):
        lines = page_lines(path, root)
        opened: int | None = None
        for index, (text, source, _) in enumerate(lines):
            if opened is None and text == "```python":
                opened = index + 1
            elif opened is not None and text.startswith("```"):
                block = lines[opened:index]
                if any(origin != source for _, origin, _ in block):
                    raise ValueError(f"{source}: a Python block ends in another file")
                example = Example(
                    str(source.relative_to(root)),
                    block[0][2] if block else lines[index][2],
                    "".join(f"{text}\n" for text, _, _ in block),
                )
                examples.setdefault(str(path.relative_to(docs)), []).append(example)
                opened = None
    return examples


EXAMPLES = python_examples()


class Pages:
    """Runs the guides' examples as a reader would: a page's examples in order, in one namespace
    (a module of its own, registered while the tests run: ``torch.export``, strict, imports a
    traced class's module) and one working folder of the page's own, each after what its
    context adds (``docs_context.CONTEXT``). Each example runs once; a page's later example
    runs the ones before it first, and an earlier page's when a context asks for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, types.ModuleType] = {}
        self.ran: dict[str, int] = {}  # how many of each page's examples have run
        self.failed: dict[str, str] = {}

    def folder(self, page: str) -> Path:
        folder = self.root / re.sub(r"\W", "-", page.removesuffix(".md"))
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def run(self, page: str, index: int) -> dict[str, Any]:
        """The page's namespace once its examples up to ``index`` have run."""
        if page not in self.modules:
            name = "docs_example_" + re.sub(r"\W", "_", page.removesuffix(".md"))
            self.modules[page] = sys.modules[name] = types.ModuleType(name)
        namespace = self.modules[page].__dict__
        while (number := self.ran.get(page, 0)) <= index:
            if page in self.failed:
                raise AssertionError(f"{page}#{number} not run: {self.failed[page]} failed")
            self.ran[page] = number + 1
            try:
                self._run(page, number, namespace)
            except BaseException:
                self.failed[page] = f"{page}#{number}"
                raise
        return namespace

    def _run(self, page: str, number: int, namespace: dict[str, Any]) -> None:
        source, line, code = EXAMPLES[page][number]
        tree = ast.increment_lineno(ast.parse(code), line - 1)  # tracebacks name the file's line
        context = docs_context.CONTEXT.get(f"{page}#{number}")
        defined = set(namespace)
        with contextlib.chdir(folder := self.folder(page)):
            if context is not None:
                namespace.update(context(folder, self))
            exec(compile(tree, source, "exec"), namespace)
        if "make" in namespace and "make" not in defined:  # a model factory: its model runs
            model, inputs = namespace["make"]()
            model(*inputs)

    def close(self) -> None:
        for module in self.modules.values():
            sys.modules.pop(module.__name__, None)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    pages = Pages(tmp_path_factory.mktemp("examples"))
    yield pages
    pages.close()


def test_the_examples_of_included_files_are_the_pages(tmp_path: Path) -> None:
    """A page's examples include those of the lines it includes (``--8<--``, with a line range
    and through an included file's own include), in the site's order, each named by the file
    and line it is written on; a snippet form not read here fails rather than hides examples."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "lib").mkdir()
    block = "```python\n{}\n```\n"
    (tmp_path / "lib" / "inner.md").write_text("# Inner\n\n" + block.format("inner = 1"))
    (tmp_path / "lib" / "README.md").write_text(
        block.format("skipped = 0")  # lines 1-3: not included
        + "# Library\n"
        + block.format("readme = 1")  # code on line 6
        + '--8<-- "lib/inner.md"\n'
    )
    (tmp_path / "docs" / "page.md").write_text(
        block.format("first = 1") + '--8<-- "lib/README.md:4:"\n' + block.format("last = 1")
    )
    (tmp_path / "docs" / "other.md").write_text("No example.\n")
    examples = python_examples(tmp_path / "docs", tmp_path)
    assert examples == {
        "page.md": [
            Example("docs/page.md", 2, "first = 1\n"),
            Example("lib/README.md", 6, "readme = 1\n"),
            Example("lib/inner.md", 4, "inner = 1\n"),
            Example("docs/page.md", 6, "last = 1\n"),
        ]
    }
    (tmp_path / "docs" / "other.md").write_text("--8<--\nlib/README.md\n--8<--\n")  # a block
    with pytest.raises(ValueError, match=r"other\.md:1: a snippet line not understood"):
        python_examples(tmp_path / "docs", tmp_path)


def test_every_context_names_an_example() -> None:
    """A context left behind by an example that moved or went is found."""
    examples = {f"{page}#{i}" for page, blocks in EXAMPLES.items() for i in range(len(blocks))}
    assert sorted(set(docs_context.CONTEXT) - examples) == []


@pytest.mark.parametrize(
    ("page", "index"),
    [
        pytest.param(page, index, id=f"{page}#{index}")
        for page, blocks in EXAMPLES.items()
        for index in range(len(blocks))
    ],
)
def test_a_guide_example_runs(pages: Pages, page: str, index: int) -> None:
    """Every example runs, with the page's earlier examples and its context before it (and a
    model factory ``make`` it defines makes a model that runs on its example inputs)."""
    pages.run(page, index)
