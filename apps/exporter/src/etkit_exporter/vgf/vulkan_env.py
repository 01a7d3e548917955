"""The process environment that runs Arm's ML emulation layers on any Vulkan driver.

``scenario_runner`` always asks for ``VK_ARM_tensors`` and ``VK_ARM_data_graph``, which lavapipe
(and most drivers) only get from the emulation layers of the ai-ml-emulation-layer-for-vulkan
wheel. Debian 12's Vulkan loader orders explicit layers by manifest discovery, not by
``VK_INSTANCE_LAYERS``, and the Graph layer must sit above the Tensor layer: so each manifest is
copied into a folder of its own, with its ``library_path`` made absolute, and ``VK_LAYER_PATH``
lists the Graph folder first.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

GRAPH_LAYER: Final = "VK_LAYER_ML_Graph_Emulation"
TENSOR_LAYER: Final = "VK_LAYER_ML_Tensor_Emulation"
# Top of the stack first: the order the loader must see them in.
_LAYER_MANIFESTS: Final = (("graph", "VkLayer_Graph.json"), ("tensor", "VkLayer_Tensor.json"))


class EmulationLayersMissingError(RuntimeError):
    """The ai-ml-emulation-layer-for-vulkan wheel is not installed or is incomplete."""


def emulation_layer_root() -> Path:
    """The ``deploy`` folder of the ai-ml-emulation-layer-for-vulkan wheel."""
    try:
        import emulation_layer
    except ImportError as error:
        raise EmulationLayersMissingError(
            "the ML emulation layers are not installed: "
            "pip install ai-ml-emulation-layer-for-vulkan==0.11.0 (scripts/setup.sh does)"
        ) from error
    root = Path(emulation_layer.__path__[0]) / "deploy"
    if not (root / "share" / "vulkan" / "explicit_layer.d").is_dir():
        raise EmulationLayersMissingError(f"no layer manifests under {root}; reinstall the wheel")
    return root


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "etkit" / "vulkan-layers"


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: concurrent processes never read half a manifest


def layer_manifest_dirs(cache_dir: Path | None = None) -> list[Path]:
    """One folder per emulation layer, each holding its manifest with an absolute
    ``library_path``; Graph first. Created on first use under ``cache_dir``
    (default ``$XDG_CACHE_HOME/etkit/vulkan-layers``), keyed by the wheel's location."""
    root = emulation_layer_root()
    key = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    base = (cache_dir or _default_cache_dir()) / key
    dirs = []
    for folder, manifest_name in _LAYER_MANIFESTS:
        manifest = json.loads((root / "share/vulkan/explicit_layer.d" / manifest_name).read_text())
        library = Path(manifest["layer"]["library_path"])
        if not library.is_absolute():
            library = root / "lib" / library.name
        if not library.is_file():
            raise EmulationLayersMissingError(f"layer library {library} is missing")
        manifest["layer"]["library_path"] = str(library)
        _write_if_changed(base / folder / manifest_name, json.dumps(manifest, indent=1))
        dirs.append(base / folder)
    return dirs


def _prepend(value: str, existing: str | None) -> str:
    parts = [value, *(p for p in (existing or "").split(os.pathsep) if p and p != value)]
    return os.pathsep.join(parts)


def ml_emulation_env(
    base: Mapping[str, str] | None = None, cache_dir: Path | None = None
) -> dict[str, str]:
    """A copy of ``base`` (default: ``os.environ``) that loads the ML emulation layers in the
    right order in any subprocess started with it (``scenario_runner``, ``vulkaninfo``, ...)."""
    env = dict(os.environ if base is None else base)
    graph_dir, tensor_dir = layer_manifest_dirs(cache_dir)
    env["VK_LAYER_PATH"] = _prepend(
        os.pathsep.join([str(graph_dir), str(tensor_dir)]), env.get("VK_LAYER_PATH")
    )
    env["LD_LIBRARY_PATH"] = _prepend(
        str(emulation_layer_root() / "lib"), env.get("LD_LIBRARY_PATH")
    )
    others = [
        layer
        for layer in env.get("VK_INSTANCE_LAYERS", "").split(os.pathsep)
        if layer and layer not in (GRAPH_LAYER, TENSOR_LAYER)
    ]
    env["VK_INSTANCE_LAYERS"] = os.pathsep.join([GRAPH_LAYER, TENSOR_LAYER, *others])
    return env
