"""No import cycle inside or between the libraries (``libs/*/src``): every import counts, at the
top of a module, inside a function, under ``TYPE_CHECKING``, read from the source with ``ast``
(nothing is imported). An import inside a function hides a cycle from Python but not from a
reader; the app's own layering is ``apps/exporter/tests/test_layers.py``."""

from __future__ import annotations

import ast
import graphlib
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ROOT / "libs"
# Cycles awaiting their fix, each as its sorted modules (none: the last, etkit_quant.qat
# importing check_calibration from the package, now imports it from etkit_quant.samples)
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path, source: Path) -> str:
    """``etkit_quant.graph`` for ``<source>/etkit_quant/graph.py``; a package's ``__init__`` is
    the package."""
    parts = list(path.relative_to(source).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` (module ``name``) imports anywhere in it, relative
    imports resolved; ``from package import name`` counts the submodule where ``name`` is one,
    else the package (whose ``__init__`` it runs)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # a submodule, or a name the package itself holds
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return (found & known) - {name}


def import_graph(sources: list[Path]) -> dict[str, set[str]]:
    """Each module under the ``src`` folders ``sources`` and the modules of them it imports."""
    files = {module_name(p, s): p for s in sources for p in sorted(s.rglob("*.py"))}
    return {
        name: imported(
            ast.parse(path.read_text(), str(path)), name, path.stem == "__init__", set(files)
        )
        for name, path in files.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of ``graph``, each as the chain of modules that comes back to its first;
    every cycle's edges are dropped once it is found, so that each is named once."""
    graph = {name: set(targets) for name, targets in graph.items()}
    cycles: list[list[str]] = []
    while True:
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as error:
            cycle: list[str] = list(reversed(error.args[1]))  # importer first
            cycles.append(cycle)
            for importer, target in itertools.pairwise(cycle):
                graph[importer].discard(target)
            continue
        return cycles


def library_sources() -> list[Path]:
    return sorted(LIBRARIES.glob("*/src"))


def test_no_import_cycle_in_or_between_the_libraries() -> None:
    graph = import_graph(library_sources())
    assert {name.split(".")[0] for name in graph} >= {
        "etkit_quant",
        "etkit_partition",
        "etkit_layout",
        "etkit_gridsampler",
        "etkit_pterunner",
    }
    cycles = [c for c in import_cycles(graph) if sorted(set(c)) not in KNOWN_CYCLES]
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
    for known in KNOWN_CYCLES:  # still there: once broken, its entry goes
        assert all(set(graph[a]) & set(known) for a in known), known


def test_the_scan_sees_a_cycle_kept_alive_inside_a_function(tmp_path: Path) -> None:
    """A made-up library whose two modules import each other, one of them inside a function
    and by a relative import, and a second library importing the first's package."""
    package = tmp_path / "lib_a" / "src" / "lib_a"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "graph.py").write_text("def f():\n    from .gather import g\n    return g\n")
    (package / "gather.py").write_text("from lib_a.graph import f\n")
    other = tmp_path / "lib_b" / "src" / "lib_b"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("import lib_a\nfrom lib_a import graph\n")
    graph = import_graph([tmp_path / "lib_a" / "src", tmp_path / "lib_b" / "src"])
    assert graph["lib_b"] == {"lib_a", "lib_a.graph"}
    cycles = import_cycles(graph)
    assert len(cycles) == 1
    assert sorted(cycles[0][:-1]) == ["lib_a.gather", "lib_a.graph"]
    assert cycles[0][0] == cycles[0][-1]


# The QAT modules are being reworked by another change, which declares what of them is public
# (issue 56 leaves them to it).
QAT_MODULES = frozenset({"etkit_quant.qat", "etkit_quant.qat_shapes"})


def declared_public(init: Path) -> set[str]:
    """The names a package's ``__init__`` lists in ``__all__`` (``=``, ``: list[str] =``,
    ``+=``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(init.read_text())):
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "__all__" and value is not None:
            names.update(ast.literal_eval(value))
    return names


def test_what_other_packages_import_from_a_library_is_declared_public() -> None:
    """Each library's ``__all__`` is complete: every name the app or another library imports
    from it (``from etkit_quant.graph import tensor_value``) is in it, or a module in it is
    (``vulkan`` for ``etkit_gridsampler.vulkan.compile_glsl``). What another package needs is
    what a user's project will need; the API check (``scripts/api_check.py``) guards it."""
    public = {
        init.parent.name: declared_public(init) for init in LIBRARIES.glob("*/src/*/__init__.py")
    }
    undeclared: list[str] = []
    sources = [*LIBRARIES.glob("*/src/*/**/*.py"), *(ROOT / "apps").glob("*/src/*/**/*.py")]
    for path in sources:
        importer = next(p for p in path.parts if p.startswith("etkit_"))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            parts = node.module.split(".")
            if parts[0] not in public or parts[0] == importer or node.module in QAT_MODULES:
                continue
            for alias in node.names:
                path_parts = [*parts[1:], alias.name]
                if not set(path_parts) & public[parts[0]]:
                    undeclared.append(f"{path.name}: {node.module}.{alias.name}")
    assert undeclared == [], "not in the library's __all__:\n" + "\n".join(sorted(set(undeclared)))
