"""Each etkit package builds on its own (wheel and sdist with correct metadata) and installs on
its own: into an environment that has torch, executorch and torchao but no etkit package, with
only the etkit packages it declares."""

from __future__ import annotations

import email
import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    # distribution: (folder, import name, etkit dependencies)
    "etkit-quant": ("libs/quant", "etkit_quant", set()),
    "etkit-partition": ("libs/partition", "etkit_partition", {"etkit-quant"}),
    "etkit-layout": ("libs/layout", "etkit_layout", {"etkit-quant"}),
    "etkit-gridsampler": ("libs/gridsampler", "etkit_gridsampler", {"etkit-quant"}),
    "etkit-exporter": (
        "apps/exporter",
        "etkit_exporter",
        {"etkit-quant", "etkit-partition", "etkit-layout", "etkit-gridsampler"},
    ),
}
BIN = Path(sys.executable).parent


def _run(args: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package built in its own folder, the way its README says."""
    out = tmp_path_factory.mktemp("dist")
    for folder, _, _ in PACKAGES.values():
        if (
            folder == "libs/gridsampler"
        ):  # scikit-build-core: build against the installed executorch
            _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."],
                 cwd=ROOT / folder)  # fmt: skip
        else:
            _run([str(BIN / "poetry"), "build", "--output", str(out)], cwd=ROOT / folder)
    return out


@pytest.fixture(scope="module")
def base_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A view of this environment's site-packages without any etkit package."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    view = tmp_path_factory.mktemp("base-site")
    for entry in site.iterdir():
        lowered = entry.name.lower()
        if (
            lowered.startswith(("etkit", "__editable__", "_editable", "_etkit"))
            or entry.suffix == ".pth"
        ):
            continue
        (view / entry.name).symlink_to(entry)
    return view


@pytest.mark.parametrize("distribution", list(PACKAGES))
def test_builds_wheel_and_sdist_with_metadata(dist: Path, distribution: str) -> None:
    _folder, module, etkit_deps = PACKAGES[distribution]
    stem = distribution.replace("-", "_")
    (wheel,) = dist.glob(f"{stem}-0.1.0-*.whl")
    (sdist,) = dist.glob(f"{stem}-0.1.0.tar.gz")
    assert sdist.stat().st_size > 0
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert metadata["Name"].replace("_", "-") == distribution
    assert metadata["Version"] == "0.1.0"
    assert f"{module}/py.typed" in names
    requires = metadata.get_all("Requires-Dist") or []
    declared = {r.split(" ")[0].split(">")[0].split("<")[0] for r in requires}
    assert {"torch"} <= declared
    assert {d for d in declared if d.startswith("etkit")} == etkit_deps
    for requirement in requires:
        if requirement.startswith("etkit"):
            assert ">=" in requirement and "<" in requirement, requirement  # a version range
    if distribution == "etkit-gridsampler":
        assert any(n.startswith("etkit_gridsampler/_native") and n.endswith(".so") for n in names)


@pytest.mark.parametrize("distribution", list(PACKAGES))
def test_installs_alone(dist: Path, base_site: Path, tmp_path: Path, distribution: str) -> None:
    _folder, module, etkit_deps = PACKAGES[distribution]
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    (target,) = (env_dir / "lib").glob("python3.*/site-packages")
    (target / "_base.pth").write_text(f"{base_site}\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist),
          distribution])  # fmt: skip
    probe = (
        "import importlib, importlib.metadata as m, json;"
        f"importlib.import_module('{module}');"
        "print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()"
        " if d.metadata['Name'].startswith('etkit')})))"
    )
    installed = json.loads(_run([str(python), "-c", probe]))
    assert sorted(n.replace("_", "-") for n in installed) == sorted({distribution} | etkit_deps)
