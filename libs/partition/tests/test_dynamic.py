"""``DetagDynamicReshapes``: a sampling grid built for a dynamic height and width (two 1 x H x W
coordinate planes stacked: an ``unsqueeze`` with two dynamic dimensions) stays outside XNNPACK's
delegates, and the program runs at every size within its bounds; without it ExecuTorch 1.5.1's
XNNPACK lowering stops the export."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.export import Dim

from etkit_partition import DetagDynamicReshapes, PolicyPartitioner


class BaseGrid(torch.nn.Module):
    """The identity sampling grid of the input's size, plus the input's first two channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, height, width = x.shape
        ys = torch.arange(height, dtype=torch.float32) * 2 / (height - 1) - 1
        xs = torch.arange(width, dtype=torch.float32) * 2 / (width - 1) - 1
        grid = torch.stack(
            (
                xs.view(1, 1, -1).expand(1, height, width),
                ys.view(1, -1, 1).expand(1, height, width),
            ),
            -1,
        )
        return grid + x[:, :2].permute(0, 2, 3, 1)


def _lower(policies: list[Any]) -> tuple[Any, PolicyPartitioner]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    dims = ({2: Dim("h", min=4, max=32), 3: Dim("w", min=4, max=48)},)
    exported = torch.export.export(BaseGrid(), (torch.rand(1, 3, 8, 12),), dynamic_shapes=dims)
    partitioner = PolicyPartitioner(XnnpackPartitioner(), policies)
    return to_edge_transform_and_lower(exported, partitioner=[partitioner]), partitioner


@pytest.mark.slow
def test_reshapes_of_two_dynamic_sizes_stay_outside_and_the_program_runs() -> None:
    from executorch.runtime import Runtime

    manager, partitioner = _lower([DetagDynamicReshapes()])
    assert any("unsqueeze" in name for name in partitioner.detagged), partitioner.detagged
    program = bytes(manager.to_executorch().buffer)  # kept: the runtime reads it in place
    method = Runtime.get().load_program(program).load_method("forward")
    for height, width in ((8, 12), (4, 4), (32, 48), (17, 29)):
        x = torch.rand(1, 3, height, width)
        (output,) = method.execute([x])
        assert torch.allclose(output, BaseGrid()(x), atol=1e-6)


@pytest.mark.slow
def test_upstream_xnnpack_cannot_lower_a_reshape_of_two_dynamic_sizes() -> None:
    """A pin: when this fails, ExecuTorch's XNNPACK lowers (or no longer claims) such a reshape,
    and the policy may go."""
    with pytest.raises(RuntimeError, match="only supports 1 dynamic dimension"):
        _lower([])
