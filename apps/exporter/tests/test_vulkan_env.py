"""The ML emulation layers environment, checked through real subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from etkit_exporter.vgf.tools import find_tool
from etkit_exporter.vgf.vulkan_env import (
    GRAPH_LAYER,
    TENSOR_LAYER,
    layer_manifest_dirs,
    ml_emulation_env,
)


def test_manifests_have_absolute_existing_libraries(tmp_path: Path) -> None:
    dirs = layer_manifest_dirs(tmp_path)
    assert [d.name for d in dirs] == ["graph", "tensor"]
    for folder in dirs:
        (manifest,) = folder.glob("*.json")
        library = Path(json.loads(manifest.read_text())["layer"]["library_path"])
        assert library.is_absolute() and library.is_file()
    # a second call reuses the same files
    assert layer_manifest_dirs(tmp_path) == dirs


def test_env_keeps_unrelated_settings_and_orders_layers(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "VK_INSTANCE_LAYERS": f"VK_LAYER_other:{TENSOR_LAYER}"}
    env = ml_emulation_env(base, cache_dir=tmp_path)
    assert env["PATH"] == "/usr/bin"
    assert env["VK_INSTANCE_LAYERS"] == f"{GRAPH_LAYER}:{TENSOR_LAYER}:VK_LAYER_other"
    graph_dir, tensor_dir = env["VK_LAYER_PATH"].split(":")[:2]
    assert graph_dir.endswith("graph") and tensor_dir.endswith("tensor")
    assert base == {"PATH": "/usr/bin", "VK_INSTANCE_LAYERS": f"VK_LAYER_other:{TENSOR_LAYER}"}


def test_subprocess_sees_graph_layer_above_tensor_layer(tmp_path: Path) -> None:
    done = subprocess.run(
        [find_tool("vulkaninfo")],
        env=ml_emulation_env(cache_dir=tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    layers = re.findall(r"^(VK_LAYER_\S+) \(", done.stdout, flags=re.MULTILINE)
    assert layers.index(GRAPH_LAYER) < layers.index(TENSOR_LAYER)
    assert "VK_ARM_tensors" in done.stdout and "VK_ARM_data_graph" in done.stdout


def test_without_the_env_the_layers_are_absent() -> None:
    done = subprocess.run(
        [find_tool("vulkaninfo")], capture_output=True, text=True, check=True, env={"PATH": ""}
    )
    assert GRAPH_LAYER not in done.stdout
