"""``check_call_sites``: a lowered program's grid-sampler delegates against their call sites.
A real program passes; the same program with a blob whose roles or shapes do not fit its call
(what a grid-first program had before blobs recorded roles) is refused, naming both."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower

from etkit_gridsampler import GridSamplerPartitioner
from etkit_gridsampler.call_sites import CallSiteError, check_call_sites
from etkit_gridsampler.delegate_format import ArgumentRoles, decode, encode


class GridFirst(torch.nn.Module):
    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image * 2, grid, align_corners=False)


@pytest.fixture
def program() -> torch.export.ExportedProgram:
    inputs = (torch.rand(1, 5, 7, 2) * 2 - 1, torch.rand(1, 4, 8, 8))
    manager = to_edge_transform_and_lower(
        torch.export.export(GridFirst(), inputs, strict=True),
        partitioner=[GridSamplerPartitioner()],
    )
    return manager.exported_program()


def _lowered(program: torch.export.ExportedProgram) -> torch.nn.Module:
    (module,) = [m for m in program.graph_module.modules() if getattr(m, "backend_id", None)]
    return module


def _rewrite(program: torch.export.ExportedProgram, **changes: object) -> None:
    module = _lowered(program)
    blob = decode(bytes(module.processed_bytes))
    blob = dataclasses.replace(blob, **changes)
    module._processed_bytes = encode(  # the lowered module keeps its bytes here
        blob.op, blob.image_shape, blob.grid_shape, roles=blob.roles
    )


def test_a_lowered_program_passes(program: torch.export.ExportedProgram) -> None:
    (site,) = check_call_sites(program)
    roles = decode(bytes(_lowered(program).processed_bytes)).roles
    assert site.arguments[roles.image][0] == (1, 4, 8, 8)
    assert site.arguments[roles.grid][0] == (1, 5, 7, 2)


def test_swapped_roles_are_refused(program: torch.export.ExportedProgram) -> None:
    roles = decode(bytes(_lowered(program).processed_bytes)).roles
    _rewrite(program, roles=ArgumentRoles(roles.inputs, image=roles.grid, grid=roles.image))
    with pytest.raises(CallSiteError, match=r"argument \d \(image\) is float32 \[1, 5, 7, 2\]"):
        check_call_sites(program)


def test_a_shape_the_call_does_not_pass_is_refused(
    program: torch.export.ExportedProgram,
) -> None:
    _rewrite(program, image_shape=(1, 4, 9, 8))
    with pytest.raises(CallSiteError, match=r"built for float32 \[1, 4, 9, 8\]"):
        check_call_sites(program)


def test_dynamic_sizes_within_the_bounds_pass_and_others_are_refused() -> None:
    """A program with dynamic H and W: its call passes every size its Dims allow, which the
    blob's bounds hold; a blob with a narrower bound than the call's is refused."""
    h, w = torch.export.Dim("h", min=4, max=16), torch.export.Dim("w", max=24)
    inputs = (torch.rand(1, 5, 7, 2) * 2 - 1, torch.rand(1, 4, 8, 8))
    manager = to_edge_transform_and_lower(
        torch.export.export(GridFirst(), inputs, dynamic_shapes=({}, {2: h, 3: w}), strict=True),
        partitioner=[GridSamplerPartitioner()],
    )
    program = manager.exported_program()
    (site,) = check_call_sites(program)
    blob = decode(bytes(_lowered(program).processed_bytes))
    assert site.arguments[blob.roles.image][0] == (1, 4, 16, 24)
    assert site.lower_bounds[blob.roles.image] == (1, 4, 4, 1)
    _lowered(program)._processed_bytes = encode(
        blob.op,
        (1, 4, 12, 24),
        blob.grid_shape,
        roles=blob.roles,
        image_min_shape=blob.image_min_shape,
    )
    message = (
        r"argument \d \(image\) is float32 \[1, 4, 4\.\.16, 1\.\.24\] but the delegate was built "
        r"for float32 \[1, 4, 4\.\.12, 1\.\.24\]"
    )
    with pytest.raises(CallSiteError, match=message):
        check_call_sites(program)
