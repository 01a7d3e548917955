"""Each etkit package stands on its own, as the design promises packages that other projects
depend on one by one:

- it declares every distribution its code imports (runtime), and every one its tests import (its
  ``test`` extra);
- scripts/build-wheels.sh builds its wheel and sdist, with correct metadata;
- its wheel installs alone, with only the etkit packages it declares, into a clean virtual
  environment that holds nothing but the distributions its declared requirements resolve to
  (with its ``test`` extra), and its own tests, copied away from the checkout, pass there
  against the installed package, with the exporter app not importable (except for the app's).

The clean environments reuse this environment's installed distributions (the exact versions of
the lock) by linking them into each environment's site-packages, so that no test downloads or
unpacks torch; only what the package's requirements resolve to is linked, so an undeclared
import fails there as it would for a user.
"""

from __future__ import annotations

import ast
import email
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))


@dataclass(frozen=True)
class Package:
    name: str  # the distribution, e.g. etkit-quant
    folder: Path  # libs/quant
    module: str  # etkit_quant
    version: str
    requires: tuple[str, ...]  # its runtime requirements, as written
    test_requires: tuple[str, ...]  # its `test` extra

    @property
    def etkit_deps(self) -> set[str]:
        return {
            canonicalize_name(Requirement(r).name)
            for r in self.requires
            if Requirement(r).name.startswith("etkit")
        }


def _read_packages() -> dict[str, Package]:
    """Every package of the workspace, read from its pyproject.toml (libs/* and apps/*)."""
    found = {}
    for pyproject in sorted(
        [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]
    ):
        project = tomllib.loads(pyproject.read_text())["project"]
        (module,) = [
            p.name for p in (pyproject.parent / "src").iterdir() if (p / "__init__.py").is_file()
        ]
        found[project["name"]] = Package(
            name=project["name"],
            folder=pyproject.parent,
            module=module,
            version=project["version"],
            requires=tuple(project.get("dependencies", ())),
            test_requires=tuple(project.get("optional-dependencies", {}).get("test", ())),
        )
    return found


PACKAGES = _read_packages()
APP = "etkit-exporter"


def _run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, (
        f"{' '.join(args)} failed:\n{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
    )
    return done.stdout


# ---- what the code imports, against what the package declares ------------------------------------


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        isinstance(c, ast.Name) and c.id in ("ImportError", "ModuleNotFoundError") for c in caught
    )


def _imported_modules(files: Iterable[Path]) -> set[str]:
    """Top-level names of the modules these files import, leaving out imports guarded by
    ``except ImportError`` (optional ones) and relative imports."""
    names: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        optional: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(map(_catches_import_error, node.handlers)):
                optional.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _distributions_of(modules: set[str], local: set[str]) -> set[str]:
    """The distributions that provide these top-level modules in this environment (standard
    library and ``local`` modules left out); a module nothing provides is returned as is."""
    providers = importlib.metadata.packages_distributions()
    # (this environment installs the workspace's packages editable, through .pth files)
    providers.update({p.module: [p.name] for p in PACKAGES.values()})
    found = set()
    for module in modules - set(sys.stdlib_module_names) - local - {"__future__"}:
        dists = providers.get(module)
        if dists:
            found.update(canonicalize_name(d) for d in dists)
        else:
            found.add(f"?{module}")
    return found


def _declared(requirements: Iterable[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


@pytest.mark.parametrize("distribution", list(PACKAGES))
def test_declares_what_it_imports(distribution: str) -> None:
    package = PACKAGES[distribution]
    local = {package.module} | {p.stem for p in (package.folder / "tests").rglob("*.py")}
    runtime = _distributions_of(_imported_modules((package.folder / "src").rglob("*.py")), local)
    undeclared = runtime - _declared(package.requires) - {canonicalize_name(distribution)}
    assert not undeclared, f"{distribution}'s code imports {sorted(undeclared)}, undeclared"
    tests = _distributions_of(_imported_modules((package.folder / "tests").rglob("*.py")), local)
    # the test extra may name the package itself with extras (etkit-exporter[model-explorer])
    undeclared = tests - _declared(package.requires) - _declared(package.test_requires)
    undeclared -= {canonicalize_name(distribution)}
    assert not undeclared, (
        f"{distribution}'s tests import {sorted(undeclared)}, not in its dependencies or its "
        "`test` extra"
    )


def test_the_import_scan_sees_undeclared_imports(tmp_path: Path) -> None:
    """The scan above finds a plain import and leaves out one guarded by ``except ImportError``."""
    code = tmp_path / "m.py"
    code.write_text(
        "import numpy as np\nfrom torch import nn\nimport json\n"
        "try:\n    import vulkan\nexcept ImportError:\n    vulkan = None\n"
    )
    modules = _imported_modules([code])
    assert modules == {"numpy", "torch", "json"}
    assert _distributions_of(modules, set()) == {"numpy", "torch"}


# ---- building ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package built on its own by scripts/build-wheels.sh, as the READMEs say."""
    out = tmp_path_factory.mktemp("dist")
    _run([str(ROOT / "scripts" / "build-wheels.sh"), str(out)],
         env={**os.environ, "ETKIT_BUILD_PYTHON": sys.executable})  # fmt: skip
    return out


@pytest.mark.slow
@pytest.mark.parametrize("distribution", list(PACKAGES))
def test_builds_wheel_and_sdist_with_metadata(dist: Path, distribution: str) -> None:
    package = PACKAGES[distribution]
    stem = distribution.replace("-", "_")
    (wheel,) = dist.glob(f"{stem}-{package.version}-*.whl")
    (sdist,) = dist.glob(f"{stem}-{package.version}.tar.gz")
    assert sdist.stat().st_size > 0
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert metadata["Name"].replace("_", "-") == distribution
    assert metadata["Version"] == package.version
    assert f"{package.module}/py.typed" in names
    requires = metadata.get_all("Requires-Dist") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert {"torch"} <= _declared(runtime)
    assert {d for d in _declared(runtime) if d.startswith("etkit")} == package.etkit_deps
    for requirement in runtime:
        if requirement.startswith("etkit"):
            assert ">=" in requirement and "<" in requirement, requirement  # a version range
    assert "test" in (metadata.get_all("Provides-Extra") or [])
    with zipfile.ZipFile(wheel) as archive:
        # no path of the machine that built it (the native library's rpath included)
        for name in names:
            data = archive.read(name)
            for path in (str(ROOT), sys.prefix, str(SITE)):
                assert path.encode() not in data, f"{wheel.name}: {name} holds the path {path}"
    if distribution == "etkit-gridsampler":
        assert any(n.startswith("etkit_gridsampler/_native") and n.endswith(".so") for n in names)
        # the C++ sources the NEON tests cross-compile, found through the installed package
        assert "etkit_gridsampler/_sources/CMakeLists.txt" in names
        assert "etkit_gridsampler/_sources/csrc/quantized_neon.cpp" in names


# ---- installing alone, and the package's own tests against the installed wheel -------------------


def _requirements_of(requirement: Requirement) -> list[Requirement]:
    """What ``requirement`` pulls in, with the extras it names: an etkit package's from its
    pyproject.toml, any other distribution's from its installed metadata."""
    name = canonicalize_name(requirement.name)
    if name in PACKAGES:
        project = tomllib.loads((PACKAGES[name].folder / "pyproject.toml").read_text())["project"]
        listed = list(project.get("dependencies", ()))
        for extra in requirement.extras:
            listed += project.get("optional-dependencies", {})[extra]
        return [Requirement(r) for r in listed]
    found = []
    for text in importlib.metadata.distribution(name).requires or []:
        sub = Requirement(text)
        extras = requirement.extras or {""}
        if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
            found.append(sub)
    return found


def _resolve(root: str) -> set[str]:
    """The third-party distributions (canonical names) that ``root`` (a requirement such as
    ``etkit-quant[test]``) resolves to in this environment. Fails when this environment does
    not satisfy one of them."""
    third_party: set[str] = set()
    seen: set[str] = set()
    queue = [Requirement(root)]
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        key = f"{name}{sorted(requirement.extras)}"
        if key in seen:
            continue
        seen.add(key)
        if name not in PACKAGES:
            version = importlib.metadata.version(name)
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{requirement} is not satisfied here ({version})"
            )
            third_party.add(name)
        queue.extend(_requirements_of(requirement))
    return third_party


def _link_distributions(names: set[str], site: Path, bin_dir: Path) -> None:
    """Links each distribution's top-level entries (packages, modules, .dist-info, .libs) from
    this environment's site-packages into ``site``; writes its console scripts into ``bin_dir``
    for the new environment's Python, as pip would, and links its other files in ``bin``."""
    python = bin_dir / "python"
    for name in sorted(names):
        distribution = importlib.metadata.distribution(name)
        scripts = {ep.name: ep for ep in distribution.entry_points if ep.group == "console_scripts"}
        for script in scripts.values():
            module, _, attribute = script.value.partition(":")
            (bin_dir / script.name).write_text(
                f"#!{python}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\n"
                f"sys.exit({attribute}())\n"
            )
            (bin_dir / script.name).chmod(0o755)
        for file in distribution.files or []:
            parts = Path(file).parts
            if parts[0] == "..":  # ../../../bin/NAME
                source = (SITE / file).resolve()
                target = bin_dir / source.name
                if source.parent.name == "bin" and not target.exists() and not target.is_symlink():
                    target.symlink_to(source)
                continue
            if not (site / parts[0]).exists() and (SITE / parts[0]).exists():
                (site / parts[0]).symlink_to(SITE / parts[0])


def _clean_env(root: Path, requirement: str) -> Path:
    """A virtual environment without system site-packages holding only the distributions that
    ``requirement`` resolves to (linked from here) and pip; returns its python."""
    third_party = _resolve(requirement)
    venv.create(root, with_pip=False)
    (site,) = (root / "lib").glob("python3.*/site-packages")
    _link_distributions(third_party | {"pip"}, site, root / "bin")
    return root / "bin" / "python"


# The test files run in a package's own environment where its whole suite is too long to run
# twice (the main run runs every file)
SMOKE: dict[str, tuple[str, ...]] = {
    APP: ("test_version.py", "test_doctor.py"),
    "etkit-gridsampler": (
        "test_version.py",
        "test_runtime.py",
        "test_vulkan_compute.py",
        "test_delegate_format.py",
    ),
    # their lowering tests (Arm's and XNNPACK's partitioners) run in the main run
    "etkit-partition": ("test_version.py", "test_dtypes.py", "test_policies.py"),
    "etkit-layout": ("test_version.py", "test_channels_last.py", "test_rgba.py"),
    # its QAT and calibration tests train and calibrate models (2.5 minutes in one process)
    "etkit-quant": (
        "test_version.py",
        "test_qspecs.py",
        "test_graph.py",
        "test_integer_operands.py",
    ),
}

SUMMARY = re.compile(r"^[= ]*(.*\b\d+ passed\b.*?) in [\d.]+s", re.MULTILINE)


# CI installs the app alone (which installs every library it builds on from their wheels: the
# grid sampler's native library and SPIR-V included, which the app's tests run), about 50 s;
# each library alone with its own tests runs on demand (-m extended; the grid sampler's about
# 70 s). Every package's wheel and its declared imports are checked in CI (the two tests above).
ALONE_IN_CI = ("etkit-exporter",)


def test_the_ci_set_names_packages() -> None:
    assert set(ALONE_IN_CI) <= set(PACKAGES), sorted(set(ALONE_IN_CI) - set(PACKAGES))


@pytest.mark.slow
@pytest.mark.parametrize(
    "distribution",
    [d if d in ALONE_IN_CI else pytest.param(d, marks=pytest.mark.extended) for d in PACKAGES],
)
def test_installs_alone_and_its_tests_pass(dist: Path, tmp_path: Path, distribution: str) -> None:
    package = PACKAGES[distribution]
    python = _clean_env(tmp_path / "env", f"{distribution}[test]")
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist),
          f"{distribution}[test]"])  # fmt: skip
    probe = (
        "import importlib, importlib.util, importlib.metadata as m, json;"
        f"mod = importlib.import_module('{package.module}');"
        "print(json.dumps({'file': mod.__file__,"
        " 'app': importlib.util.find_spec('etkit_exporter') is not None,"
        " 'etkit': sorted(d.metadata['Name'].replace('_', '-') for d in m.distributions()"
        " if d.metadata['Name'].startswith('etkit'))}))"
    )
    seen = json.loads(_run([str(python), "-c", probe], cwd=tmp_path))
    assert seen["etkit"] == sorted({distribution} | package.etkit_deps)
    assert Path(seen["file"]).is_relative_to(tmp_path / "env"), seen["file"]  # the wheel's
    assert seen["app"] == (distribution == APP)

    # Its tests, away from the checkout: its tests/ folder and the pytest settings of its
    # pyproject.toml, nothing else.
    copy = tmp_path / "copy"
    shutil.copytree(package.folder / "tests", copy / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(package.folder / "pyproject.toml", copy)
    pytest_args = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if distribution in SMOKE:
        # The package's whole suite runs in the main run (the app's: many exports; the grid
        # sampler's: 10 minutes in one process, conformance and QAT under DDP); here, every one
        # of its test modules imports from its declared dependencies, and the files that use
        # what the wheel installs (the app: the checks of the tools it declares, Arm's
        # model-converter, scenario_runner, the emulation layers; the grid sampler: its native
        # library in ExecuTorch's runtime, its SPIR-V on Vulkan, its blob format) pass.
        _run([*pytest_args, "--collect-only"], cwd=copy)
        pytest_args += [f"tests/{name}" for name in SMOKE[distribution]]
    else:  # its tests marked slow (exports, lowering) run in the main run only
        _run([*pytest_args, "--collect-only"], cwd=copy)
        pytest_args += ["-m", "not slow"]
    done = subprocess.run(pytest_args, cwd=copy, capture_output=True, text=True, check=False)
    summary = SUMMARY.findall(done.stdout)
    assert done.returncode == 0, (
        f"{distribution}'s tests failed:\n{done.stdout[-20000:]}\n{done.stderr[-3000:]}"
    )
    assert summary, f"no test of {distribution} passed:\n{done.stdout[-3000:]}"
