"""``affine_grids``: a fixed-size ``affine_grid`` as elementwise ops on small tensors, the
decomposition's values bit for bit; anything else left as it is."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._decomp.decompositions import affine_grid_generator as decomposed

from etkit_quant.graph import target_name
from etkit_quant.normalize import normalize_program


class _Warp(torch.nn.Module):
    """A spatial transformer's tail: theta -> affine_grid -> grid_sample."""

    def __init__(self, size: tuple[int, int, int, int], align_corners: bool) -> None:
        super().__init__()
        self.size, self.align_corners = size, align_corners

    def forward(self, theta: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        grid = F.affine_grid(theta, list(self.size), align_corners=self.align_corners)
        return F.grid_sample(image, grid, align_corners=self.align_corners)


class _Grids(torch.fx.Interpreter):
    """Runs a module, keeping what each grid sampler read as its grid."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.grids: list[torch.Tensor] = []

    def run_node(self, n: torch.fx.Node) -> object:
        if "grid_sampler" in target_name(n):
            self.grids.append(self.env[n.args[1]])  # type: ignore[index]
        return super().run_node(n)


def _ops(program: torch.export.ExportedProgram) -> list[str]:
    return [target_name(n) for n in program.graph.nodes if n.op == "call_function"]


# odd sizes, one row, one column, one and 16 channels, a batch of 5
SIZES = [(1, 3, 5, 7), (5, 1, 28, 28), (2, 16, 1, 9), (3, 4, 13, 1)]


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_the_grid_is_the_decompositions_bit_for_bit(
    size: tuple[int, int, int, int], align_corners: bool
) -> None:
    generator = torch.Generator().manual_seed(sum(size))
    theta = torch.randn(size[0], 2, 3, generator=generator)
    image = torch.randn(*size, generator=generator)
    model = _Warp(size, align_corners)
    program = torch.export.export(model, (theta, image), strict=True)
    assert "aten::affine_grid_generator" in _ops(program)
    rewritten, report = normalize_program(program, (theta, image), affine_grids=True)
    assert report.steps["affine_grids"] == 1
    ops = _ops(rewritten)
    assert "aten::affine_grid_generator" not in ops and "aten::sum.dim_IntList" not in ops, ops
    run = _Grids(rewritten.module())
    for scale in (1e-3, 1.0, 37.0):  # small, typical and far-out transforms
        theta = torch.randn(size[0], 2, 3, generator=generator) * scale
        sampled = run.run(theta, image)
        grid = run.grids[-1]
        expected = decomposed(theta, list(size), align_corners)
        assert torch.equal(grid, expected)
        # PyTorch's own affine_grid is a bmm: the same grid but for the last bits
        torch.testing.assert_close(grid, F.affine_grid(theta, list(size), align_corners))
        assert torch.equal(sampled, F.grid_sample(image, expected, align_corners=align_corners))


def test_left_alone_without_the_flag_and_for_other_thetas() -> None:
    size = (2, 3, 6, 10)
    image = torch.rand(*size)
    theta = torch.randn(2, 2, 3)
    program = torch.export.export(_Warp(size, False), (theta, image), strict=True)
    _, report = normalize_program(program, (theta, image))
    assert report.steps.get("affine_grids") is None  # not asked for
    # a double theta: its product is not float32 arithmetic
    double = torch.export.export(
        _Warp(size, False).double(), (theta.double(), image.double()), strict=True
    )
    kept, report = normalize_program(double, (theta.double(), image.double()), affine_grids=True)
    assert report.steps["affine_grids"] == 0 and "aten::affine_grid_generator" in _ops(kept)


class _Volume(torch.nn.Module):
    def forward(self, theta: torch.Tensor, volume: torch.Tensor) -> torch.Tensor:
        grid = F.affine_grid(theta, list(volume.shape), align_corners=False)
        return F.grid_sample(volume, grid, align_corners=False)


def test_a_volumetric_grid_is_left_as_it_is() -> None:
    theta, volume = torch.randn(1, 3, 4), torch.rand(1, 2, 4, 6, 8)
    program = torch.export.export(_Volume(), (theta, volume), strict=True)
    kept, report = normalize_program(program, (theta, volume), affine_grids=True)
    assert report.steps["affine_grids"] == 0
    assert "aten::affine_grid_generator" in _ops(kept)


class _ReturnsItsGrid(torch.nn.Module):
    def forward(self, theta: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        grid = F.affine_grid(theta, list(image.shape), align_corners=False)
        return grid, F.grid_sample(image, grid, align_corners=False)


def test_a_grid_the_program_returns_is_left_as_it_is() -> None:
    """Returned too, the ``affine_grid`` stays one op: a quantizer keeps a returned
    ``affine_grid`` float by its name (tests/test_grid_outputs.py), not the ops it would
    become."""
    theta, image = torch.randn(1, 2, 3), torch.rand(1, 3, 6, 10)
    program = torch.export.export(_ReturnsItsGrid(), (theta, image), strict=True)
    kept, report = normalize_program(program, (theta, image), affine_grids=True)
    assert report.steps["affine_grids"] == 0
    assert "aten::affine_grid_generator" in _ops(kept)
