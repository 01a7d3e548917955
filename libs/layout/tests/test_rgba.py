"""pad_rgb_to_rgba on real torch.export graphs: outputs bit-identical, one pad per image."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx import GraphModule

from etkit_layout import pad_rgb_to_rgba
from etkit_quant import is_grid_sampler


class TwoSamplers(torch.nn.Module):
    """One RGB image sampled twice, a 4-channel image sampled once."""

    def forward(
        self, rgb: torch.Tensor, rgba: torch.Tensor, grid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = F.grid_sample(rgb, grid, align_corners=False)
        b = F.grid_sample(
            rgb, grid * 0.5, mode="nearest", padding_mode="border", align_corners=True
        )
        c = F.grid_sample(rgba, grid, padding_mode="reflection", align_corners=False)
        return a * 2, b, c


def _graph(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> GraphModule:
    module: GraphModule = torch.export.export(model, inputs, strict=True).module(check_guards=False)
    return module


def _count(gm: GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == target)


@pytest.mark.parametrize("batch", [1, 3])
def test_pads_rgb_once_and_keeps_outputs_bit_identical(batch: int) -> None:
    torch.manual_seed(0)
    inputs = (
        torch.randn(batch, 3, 9, 11),
        torch.randn(batch, 4, 9, 11),
        torch.rand(batch, 5, 6, 2) * 2.2 - 1.1,
    )
    gm = _graph(TwoSamplers(), inputs)
    before = gm(*inputs)
    result = pad_rgb_to_rgba(gm)
    assert result.modified
    after = result.graph_module(*inputs)
    for x, y in zip(before, after, strict=True):
        assert torch.equal(x, y)
    assert _count(gm, torch.ops.aten.constant_pad_nd.default) == 1  # one pad for both samplers
    assert _count(gm, torch.ops.aten.slice.Tensor) == 2
    channels = [n.args[0].meta["val"].shape[1] for n in gm.graph.nodes if is_grid_sampler(n)]
    assert channels == [4, 4, 4]
    assert not pad_rgb_to_rgba(gm).modified  # a second run changes nothing


def test_four_channel_images_are_untouched() -> None:
    class Only4(torch.nn.Module):
        def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return F.grid_sample(image, grid, align_corners=False)

    gm = _graph(Only4(), (torch.randn(1, 4, 5, 5), torch.zeros(1, 2, 2, 2)))
    code = gm.code
    assert not pad_rgb_to_rgba(gm).modified
    assert gm.code == code


def test_graph_without_metadata_is_refused() -> None:
    traced = torch.fx.symbolic_trace(
        lambda image, grid: torch.ops.aten.grid_sampler_2d.default(image, grid, 0, 0, False)
    )
    with pytest.raises(ValueError, match="no tensor metadata"):
        pad_rgb_to_rgba(traced)
