"""run_vgf refuses inputs that do not fit the VGF before running anything, and runs VGFs with
compute segments (the SPIR-V embedded in the VGF, not vgf_dump's placeholder file)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower

from etkit_exporter.vgf.scenario import ScenarioError, embedded_shaders, run_vgf, vgf_delegates
from etkit_exporter.vgf.tools import configure_model_converter


@pytest.fixture(scope="module")
def add_vgf() -> bytes:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1.5

    exported = torch.export.export(Add(), (torch.zeros(1, 2, 3, 3),), strict=True)
    lowered = to_edge_transform_and_lower(exported, partitioner=[VgfPartitioner(VgfCompileSpec())])
    (blob,) = vgf_delegates(lowered.exported_program())
    return blob


def test_runs_and_returns_outputs(add_vgf: bytes) -> None:
    x = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    (out,) = run_vgf(add_vgf, [x])
    np.testing.assert_array_equal(out, x + 1.5)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "takes 1 inputs, got 0"),
        ([np.zeros((1, 2, 3, 4), np.float32)], r"wants VK_FORMAT_R32_SFLOAT \[1, 2, 3, 3\]"),
        ([np.zeros((1, 2, 3, 3), np.int8)], "got int8"),
    ],
)
def test_mismatched_inputs_raise(add_vgf: bytes, inputs: list[np.ndarray], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        run_vgf(add_vgf, inputs)


def test_upstream_compute_segment_runs_with_its_embedded_shader() -> None:
    """ExecuTorch's own grid sampler (float, TOSA FP) is a COMPUTE segment of the VGF; without
    dropping vgf_dump's shader_substitutions placeholder scenario_runner cannot open it."""

    class Warp(torch.nn.Module):
        def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return F.grid_sample(image, grid, padding_mode="border", align_corners=False)

    configure_model_converter()
    torch.manual_seed(0)
    image, grid = torch.rand(1, 4, 8, 12) * 2 - 1, torch.rand(1, 6, 10, 2) * 1.8 - 0.9
    exported = torch.export.export(Warp(), (image, grid), strict=True)
    spec = VgfCompileSpec("TOSA-1.0+FP")
    lowered = to_edge_transform_and_lower(exported, partitioner=[VgfPartitioner(spec)])
    (blob,) = vgf_delegates(lowered.exported_program())
    (out,) = run_vgf(blob, [image.numpy(), grid.numpy()])
    expected = F.grid_sample(image, grid, padding_mode="border", align_corners=False)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)


def test_embedded_shaders_drops_only_placeholders() -> None:
    template: dict[str, Any] = {
        "commands": [
            {
                "dispatch_graph": {
                    "graph_ref": "g",
                    "shader_substitutions": [
                        {"shader_ref": "placeholder", "target": "graph_partition_1"},
                        {"shader_ref": "real", "target": "graph_partition_3"},
                    ],
                }
            }
        ],
        "resources": [
            {"graph": {"src": "m.vgf", "uid": "g"}},
            {"shader": {"src": "TEMPLATE_PATH_SHADER_SPIRV_1", "uid": "placeholder"}},
            {"shader": {"src": "mine.spv", "uid": "real"}},
        ],
    }
    result = embedded_shaders(copy.deepcopy(template))
    (command,) = result["commands"]
    assert command["dispatch_graph"]["shader_substitutions"] == [
        {"shader_ref": "real", "target": "graph_partition_3"}
    ]
    assert [r.get("shader", {}).get("uid") for r in result["resources"]] == [None, "real"]
    only_placeholder = copy.deepcopy(template)
    del only_placeholder["resources"][2]
    only_placeholder["commands"][0]["dispatch_graph"]["shader_substitutions"].pop()
    (command,) = embedded_shaders(only_placeholder)["commands"]
    assert "shader_substitutions" not in command["dispatch_graph"]
