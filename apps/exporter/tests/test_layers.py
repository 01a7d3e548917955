"""The app's layering, from its imports: its folders are layers (``LAYERS``, top first); a
module imports its own folder's modules and the folders below its own, never a folder above (a
back arrow); no chain of imports comes back to where it began (a circle); no module is over
``MAX_LINES`` lines. Every import counts: at the top of a module, inside a function, under
``TYPE_CHECKING``. ``scripts/import_layers.py`` prints the figures."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import etkit_exporter

PACKAGE = "etkit_exporter"
# The installed package's folder (in a checkout, apps/exporter/src/etkit_exporter).
SOURCE = Path(etkit_exporter.__file__).resolve().parent
MAX_LINES = 800

# The app's folders, top layer first. The package's own ``__init__`` (its public names) is
# above them all; a module directly in the package folder is not allowed.
LAYERS: tuple[str, ...] = (
    "cli",  # the commands
    "export",  # the pipeline
    "check",  # verify, the verdict, bundles, inspect
    "model_explorer",  # the optional Model Explorer extension (node data verification writes)
    "artifact",  # the export folder
    "programs",  # running programs: etkit_pterunner with the app's delegates, executorch.runtime
    "vgf",  # Arm's VGF tools, scenarios, the VGF delegate
    "core",  # errors, backend ids, the IO table, diagnostics, calibration files, the version
)


def module_name(path: Path, source: Path = SOURCE) -> str:
    parts = list(path.relative_to(source.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every ``etkit_exporter`` module ``tree`` imports, with the line, relative imports
    resolved; ``from package import name`` yields the submodule when it is one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                yield f"{target}.{alias.name}", node.lineno
            yield target, node.lineno


def local_imports(tree: ast.Module) -> int:
    """Imports inside functions (each counted once, however deeply nested)."""

    def count(node: ast.AST, in_function: bool) -> int:
        total = 0
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                total += in_function
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            total += count(child, inner)
        return total

    return count(tree, False)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


@dataclass
class Figures:
    """What ``scan`` measures of the app's modules."""

    lines: dict[str, int]
    local_imports: int
    cycles: list[list[str]]
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        longest = max(self.lines, key=lambda n: self.lines[n])
        return (
            f"{PACKAGE}: {len(self.lines)} modules, {sum(self.lines.values())} lines, longest "
            f"{longest} ({self.lines[longest]} lines), {self.local_imports} function-local "
            f"imports, {len(self.cycles)} import circle(s)"
        )


def scan(source: Path = SOURCE) -> Figures:
    """Every module of the package in ``source``: its lines, its imports of the package's
    modules, and each back arrow, circle, module outside a layer folder and module over
    ``MAX_LINES`` lines (``problems``, one line each)."""
    files = sorted(source.rglob("*.py"))
    modules = {module_name(path, source): path for path in files}
    graph: dict[str, set[str]] = {}
    problems: list[str] = []
    lines: dict[str, int] = {}
    local = 0
    for name, path in modules.items():
        text = path.read_text()
        tree = ast.parse(text, str(path))
        lines[name] = len(text.splitlines())
        local += local_imports(tree)
        targets: set[str] = set()
        for target, line in imported_modules(tree, name, path.name == "__init__.py"):
            if target not in modules or target == name:
                continue
            targets.add(target)
            here, there = layer_of(name), layer_of(target)
            if here in LAYERS and there in LAYERS and LAYERS.index(there) < LAYERS.index(here):
                problems.append(
                    f"{path.name}:{line}: back arrow: {name} ({here}/) imports {target} "
                    f"({there}/, a layer above)"
                )
        graph[name] = targets
    for name, path in modules.items():
        if name != PACKAGE and (len(name.split(".")) < 3 and path.name != "__init__.py"):
            problems.append(f"{name}: not in a layer folder")
        elif name != PACKAGE and layer_of(name) not in LAYERS:
            problems.append(f"{name}: {layer_of(name)}/ is not a layer (LAYERS)")
    cycles = find_cycles(graph)
    problems += ["import circle: " + " <-> ".join(cycle) for cycle in cycles]
    problems += [f"{n}: {c} lines (over {MAX_LINES})" for n, c in lines.items() if c > MAX_LINES]
    return Figures(lines, local, cycles, problems)


def test_layers_point_down_without_circles() -> None:
    """Every import of the app's modules runs from a layer folder to its own or one below, no
    chain of imports comes back to where it began, and no module is over the line limit."""
    figures = scan()
    assert figures.problems == [], "\n".join([figures.summary(), *figures.problems])


def test_the_scan_sees_back_arrows_and_circles(tmp_path: Path) -> None:
    """``scan`` on a made-up package: a circle, a back arrow and a module outside the layers."""
    package = tmp_path / PACKAGE
    for folder in ("core", "vgf"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "core" / "a.py").write_text("from etkit_exporter.vgf import b\n")
    (package / "vgf" / "b.py").write_text(
        "def f() -> None:\n    from etkit_exporter.core.a import x\n"
    )
    (package / "loose.py").write_text("x = 1\n" * (MAX_LINES + 1))
    figures = scan(package)
    assert figures.local_imports == 1
    assert any("back arrow: etkit_exporter.core.a (core/)" in p for p in figures.problems)
    assert any(p.startswith("import circle: ") and "core.a" in p for p in figures.problems)
    assert "etkit_exporter.loose: not in a layer folder" in figures.problems
    assert any("loose" in p and "over" in p for p in figures.problems)
