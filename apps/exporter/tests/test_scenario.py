"""run_vgf refuses inputs that do not fit the VGF before running anything."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower

from etkit_exporter.scenario import ScenarioError, run_vgf, vgf_delegates


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
