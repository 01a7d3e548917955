"""``channel_ops_of_slices`` (``normalize_program(..., channel_ops=True)``): per-channel ops of
slices joined by a ``cat`` in the coordinate arithmetic become one op with a per-channel
constant, bit for bit; anything else is left as it is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from etkit_quant.graph import target_name
from etkit_quant.normalize import normalize_program


def _base(n: int, height: int, width: int) -> torch.Tensor:
    xs = torch.linspace(-1.0, 1.0, width).view(1, 1, 1, width).expand(n, -1, height, -1)
    ys = torch.linspace(-1.0, 1.0, height).view(1, 1, height, 1).expand(n, -1, -1, width)
    return torch.cat([xs, ys], 1)


class RifeWarp(torch.nn.Module):
    """RIFE's warplayer after a conv predicting a 4-channel flow (two warps, one per half)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.flow = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        flow = self.flow(image) * 3.0
        n, _, height, width = flow.shape
        warped = []
        for half in (flow[:, :2], flow[:, 2:4]):
            normalized = torch.cat(
                [half[:, 0:1] / ((width - 1.0) / 2.0), half[:, 1:2] / ((height - 1.0) / 2.0)], 1
            )
            grid = (_base(n, height, width) + normalized).permute(0, 2, 3, 1)
            warped.append(F.grid_sample(image, grid, padding_mode="border", align_corners=True))
        return warped[0] + warped[1]


def _counts(program: torch.export.ExportedProgram) -> dict[str, int]:
    names = [target_name(n) for n in program.graph.nodes if n.op == "call_function"]
    return {k: names.count(k) for k in ("aten::slice.Tensor", "aten::cat", "aten::div.Tensor")}


def _both(
    model: torch.nn.Module, *inputs: torch.Tensor
) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram, int]:
    """The program normalized without and with the rewrite (outputs checked equal bit for bit
    on the inputs and on others), and how many ``cat`` s it rewrote."""
    exported = torch.export.export(model.eval(), inputs, strict=True)
    plain, _ = normalize_program(exported, inputs)
    merged, report = normalize_program(exported, inputs, channel_ops=True)
    for sample in (inputs, tuple(torch.randn_like(x) * 4 for x in inputs)):
        with torch.no_grad():
            expected, actual = model(*sample), merged.module()(*sample)
        assert torch.equal(actual, expected), (actual - expected).abs().max()
    return plain, merged, report.steps.get("channel_ops_of_slices", 0)


def test_rifes_warp_is_one_divide_per_flow() -> None:
    plain, merged, rewritten = _both(RifeWarp(), torch.rand(1, 3, 17, 23) * 2 - 1)
    assert rewritten == 2
    before, after = _counts(plain), _counts(merged)
    # per warp: two one-channel slices, two divides and a cat -> one divide of the half
    assert before["aten::slice.Tensor"] - after["aten::slice.Tensor"] == 4, (before, after)
    assert before["aten::cat"] - after["aten::cat"] == 2
    assert before["aten::div.Tensor"] - after["aten::div.Tensor"] == 2


@pytest.mark.parametrize(
    "op", [torch.div, torch.mul, torch.add, torch.sub], ids=lambda f: f.__name__
)
def test_each_op_and_a_partial_cover_keeps_every_bit(op: Callable[..., torch.Tensor]) -> None:
    """Three of four channels (1:4), awkward numbers: one slice of the three remains."""

    class Partial(torch.nn.Module):
        def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
            parts = [op(flow[:, 1:2], 1 / 3), op(flow[:, 2:3], 479.5), op(flow[:, 3:4], -0.1)]
            grid = torch.cat(parts, 1)[:, 1:3].permute(0, 2, 3, 1)
            return F.grid_sample(image, grid, align_corners=False)

    inputs = (torch.rand(1, 2, 9, 11), torch.rand(1, 4, 5, 7) * 2 - 1)
    plain, merged, rewritten = _both(Partial(), *inputs)
    assert rewritten == 1
    assert _counts(merged)["aten::cat"] == _counts(plain)["aten::cat"] - 1


class NotCoordinates(torch.nn.Module):
    """ImageNet-style per-channel normalization of the image (not coordinate arithmetic: its
    constant would be quantized as an operand), then a warp."""

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        normalized = torch.cat(
            [image[:, 0:1] / 0.229, image[:, 1:2] / 0.224, image[:, 2:3] / 0.225], 1
        )
        return F.grid_sample(normalized, grid, align_corners=False)


class Gap(torch.nn.Module):
    """Channels 0 and 2 (not consecutive)."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = torch.cat([flow[:, 0:1] / 2.0, flow[:, 2:3] / 3.0], 1).permute(0, 2, 3, 1)
        return F.grid_sample(image, grid, align_corners=False)


class Mixed(torch.nn.Module):
    """A divide and a multiply."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = torch.cat([flow[:, 0:1] / 2.0, flow[:, 1:2] * 3.0], 1).permute(0, 2, 3, 1)
        return F.grid_sample(image, grid, align_corners=False)


class SliceReadTwice(torch.nn.Module):
    """A slice that something else reads too."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        x = flow[:, 0:1]
        grid = torch.cat([x / 2.0, flow[:, 1:2] / 3.0], 1).permute(0, 2, 3, 1)
        return F.grid_sample(image, grid, align_corners=False) + x.mean()


@pytest.mark.parametrize("model", [NotCoordinates(), Gap(), Mixed(), SliceReadTwice()],
                         ids=lambda m: type(m).__name__)  # fmt: skip
def test_what_is_not_the_pattern_is_left_alone(model: torch.nn.Module) -> None:
    image = torch.rand(1, 3, 9, 11) * 2 - 1
    grid_or_flow = torch.rand(1, 6, 10, 2) * 2 - 1
    if not isinstance(model, NotCoordinates):
        grid_or_flow = torch.rand(1, 4, 6, 10) * 2 - 1
    plain, merged, rewritten = _both(model, image, grid_or_flow)
    assert rewritten == 0
    assert _counts(merged) == _counts(plain)


def test_off_by_default() -> None:
    inputs = (torch.rand(1, 3, 17, 23) * 2 - 1,)
    exported = torch.export.export(RifeWarp().eval(), inputs, strict=True)
    _, report = normalize_program(exported, inputs)
    assert "channel_ops_of_slices" not in report.steps
