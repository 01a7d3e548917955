"""``separable.separate`` and ``fold_constants``' use of it: a pixel grid over the size limit is
held as a row and a column, bit for bit, and a grid added to a flow becomes two broadcasting
adds with the same values."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from etkit_quant.graph import target_name
from etkit_quant.normalize import normalize_program
from etkit_quant.separable import column_on_rows, separate


def _grid(height: int, width: int, centres: bool) -> torch.Tensor:
    if centres:
        ys = (torch.arange(height, dtype=torch.float32) * 2 + 1) / height - 1
        xs = (torch.arange(width, dtype=torch.float32) * 2 + 1) / width - 1
    else:
        ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


def test_pixel_grids_separate_exactly_into_a_row_and_a_column() -> None:
    for height, width, centres in ((7, 9, False), (16, 5, True), (540, 960, False)):
        grid = _grid(height, width, centres)
        terms = separate(grid)
        assert terms is not None
        row, column = terms
        assert row.shape == (1, 1, width, 2) and column.shape == (1, height, 1, 2)
        assert torch.equal(row + column, grid)
        flow = torch.randn(1, height, width, 2)
        assert torch.equal((flow + row) + column, grid + flow)
    nchw = _grid(6, 10, True).permute(0, 3, 1, 2).contiguous()  # RIFE keeps its grid NCHW
    terms = separate(nchw)
    assert terms is not None and torch.equal(terms[0] + terms[1], nchw)
    assert terms[0].numel() + terms[1].numel() == 2 * (6 + 10)


def test_what_is_not_a_row_plus_a_column_is_refused() -> None:
    g = torch.Generator().manual_seed(0)
    assert separate(torch.rand(1, 6, 7, 2, generator=g)) is None
    grid = _grid(6, 7, False)
    grid[0, 3, 4, 0] += 0.5  # one value off
    assert separate(grid) is None
    assert separate(torch.arange(12).view(3, 4)) is None  # integers: not a coordinate grid
    rotated = F.affine_grid(
        torch.tensor([[[0.8, -0.6, 0.0], [0.6, 0.8, 0.0]]]), [1, 1, 5, 6], align_corners=False
    )
    assert separate(rotated) is None  # each channel varies along both axes


class FlowWarp(torch.nn.Module):
    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        _, _, height, width = image.shape
        grid = _grid(height, width, False) + flow.permute(0, 2, 3, 1)
        return F.grid_sample(image, grid, align_corners=True)


def test_a_grid_over_the_limit_folds_as_a_row_and_a_column() -> None:
    g = torch.Generator().manual_seed(1)
    inputs = (torch.rand(1, 3, 12, 20, generator=g), torch.rand(1, 2, 12, 20, generator=g) * 0.1)
    exported = torch.export.export(FlowWarp().eval(), inputs, strict=True)
    whole, _ = normalize_program(exported, inputs)
    split, report = normalize_program(exported, inputs, max_folded_elements=12 * 20 - 1)
    assert report.steps["fold_constants"]
    constants = [t for _, t in split.named_buffers()] + list(split.constants.values())
    assert constants and max(t.numel() for t in constants) <= 2 * 20  # no plane
    assert not any(
        "expand" in target_name(n) or "stack" in target_name(n) or "cat" in target_name(n)
        for n in split.graph.nodes
        if n.op == "call_function"
    )
    # the grid's y (a column, broadcast across the width) is added on the rows flattened:
    # y * mask, an add of the same shape; no add reads a column of the grid's shape
    for n in split.graph.nodes:
        if target_name(n) == "aten::add.Tensor":
            shapes = [tuple(a.meta["val"].shape) for a in n.args if isinstance(a, torch.fx.Node)]
            assert (1, 12, 1, 2) not in shapes, shapes
    assert any(target_name(n) == "aten::mul.Tensor" for n in split.graph.nodes)
    g = torch.Generator().manual_seed(2)
    samples = [inputs, (inputs[0], -inputs[1]), (inputs[0], torch.zeros_like(inputs[1]))]
    samples += [(inputs[0], torch.randn(1, 2, 12, 20, generator=g)) for _ in range(5)]
    for sample in samples:
        assert torch.equal(split.module()(*sample), whole.module()(*sample))
        assert torch.equal(split.module()(*sample), FlowWarp()(*sample))


def test_a_grids_column_on_rows_is_the_column_as_numbers() -> None:
    for height, width, centres in ((7, 9, False), (16, 5, True), (3, 4, True)):
        grid = _grid(height, width, centres)
        terms = separate(grid)
        assert terms is not None
        row, column = terms
        flat = column_on_rows(column, width)
        assert flat is not None
        y, mask = flat
        assert y.shape == (1, height, 1) and mask.shape == (1, 1, width * 2)
        assert torch.equal((y * mask).reshape(1, height, width, 2), column.expand_as(grid))
        flow = torch.randn(1, height, width, 2)
        on_rows = ((flow + row).reshape(1, height, width * 2) + y * mask).reshape(grid.shape)
        assert torch.equal(on_rows, (flow + row) + column)
    assert column_on_rows(torch.ones(1, 4, 1, 2), 3) is None  # both channels hold values
    assert column_on_rows(torch.ones(1, 2, 4, 1), 3) is None  # an NCHW column: no inner block


class AnySizeWarp(torch.nn.Module):
    """The grid computed from the input's size (``arange``), broadcast and stacked."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        _, _, height, width = image.shape
        ys = torch.arange(height, dtype=torch.float32) * 2 / (height - 1) - 1
        xs = torch.arange(width, dtype=torch.float32) * 2 / (width - 1) - 1
        grid = torch.stack(
            (
                xs.view(1, 1, -1).expand(1, height, width),
                ys.view(1, -1, 1).expand(1, height, width),
            ),
            -1,
        )
        return F.grid_sample(image, grid + flow.permute(0, 2, 3, 1), align_corners=True)


def test_a_dynamic_grid_is_stacked_unexpanded_and_added_to_the_flow_exactly() -> None:
    g = torch.Generator().manual_seed(2)
    inputs = (torch.rand(1, 3, 16, 24, generator=g), torch.rand(1, 2, 16, 24, generator=g) * 0.1)
    h, w = torch.export.Dim("h", min=1, max=8), torch.export.Dim("w", min=1, max=8)
    dynamic = ({2: 8 * h, 3: 8 * w}, {2: 8 * h, 3: 8 * w})
    exported = torch.export.export(
        AnySizeWarp().eval(), inputs, dynamic_shapes=dynamic, strict=True
    )
    normalized, report = normalize_program(exported, inputs, dynamic_shapes=dynamic)
    assert report.steps["broadcast_stacks"] == 1
    ops = [target_name(n) for n in normalized.graph.nodes if n.op == "call_function"]
    assert not any("expand" in op for op in ops), ops
    for size in ((16, 24), (8, 64), (40, 8)):
        sample = (torch.rand(1, 3, *size, generator=g), torch.rand(1, 2, *size, generator=g))
        assert torch.equal(normalized.module()(*sample), AnySizeWarp()(*sample))
    _, report = normalize_program(
        torch.export.export(AnySizeWarp().eval(), inputs, strict=True), inputs
    )
    assert not report.steps.get("broadcast_stacks")  # a one-size grid is folded instead
