"""PolicyPartitioner and its policies on real programs lowered with the Arm VgfPartitioner
(model-converter runs)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from torch.export import ExportedProgram

from etkit_partition import DetagInputQuantize, DetagOps, DetagOutputDequantize, PolicyPartitioner
from etkit_quant import (
    BoundaryQuantizer,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    quantize,
    snorm8,
    target_name,
)

SPEC = "TOSA-1.0+INT+FP+int16"
GRID_SAMPLER = torch.ops.aten.grid_sampler_2d.default


class Warp(torch.nn.Module):
    """conv -> grid sampler (grid computed in float from an input) -> conv."""

    def __init__(self) -> None:
        super().__init__()
        self.before = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.after = torch.nn.Conv2d(4, 4, 1)

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = torch.tanh(flow)
        return self.after(F.grid_sample(self.before(image), grid, align_corners=False))


def _quantized_program() -> ExportedProgram:
    torch.manual_seed(0)
    inputs = (torch.rand(1, 4, 8, 8) * 2 - 1, torch.randn(1, 8, 8, 2))
    base = VgfQuantizer(VgfCompileSpec(SPEC))
    base.set_global(get_symmetric_quantization_config())
    quantizer = BoundaryQuantizer(base, input_qspecs=(snorm8(), None), output_qspecs=(snorm8(),))
    return torch.export.export(quantize(Warp().eval(), inputs, quantizer), inputs, strict=True)


def _lower(policies: list[object]) -> tuple[ExportedProgram, PolicyPartitioner]:
    partitioner = PolicyPartitioner(VgfPartitioner(VgfCompileSpec(SPEC)), policies)  # type: ignore[arg-type]
    lowered = to_edge_transform_and_lower(_quantized_program(), partitioner=[partitioner])
    return lowered.exported_program(), partitioner


def _delegates(program: ExportedProgram) -> list[object]:
    return [
        getattr(program.graph_module, str(n.target))
        for n in program.graph.nodes
        if n.op == "get_attr" and str(n.target).startswith("lowered_module")
    ]


def _delegate_targets(program: ExportedProgram) -> list[str]:
    names = []
    for delegate in _delegates(program):
        graph = delegate.original_module.graph  # type: ignore[attr-defined]
        names += [target_name(n) for n in graph.nodes if n.op == "call_function"]
    return names


def test_grid_sampler_unit_and_io_qdq_stay_outside() -> None:
    program, partitioner = _lower(
        [DetagInputQuantize([0]), DetagOutputDequantize([0]), DetagOps([GRID_SAMPLER])]
    )
    assert not [t for t in _delegate_targets(program) if "grid_sampler" in t]
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    (sampler,) = [n for n in nodes if is_grid_sampler(n)]
    assert is_dequantize(sampler.args[0]) and is_dequantize(sampler.args[1])
    assert all(is_quantize(u) for u in sampler.users)
    image = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == "image")
    assert all(is_quantize(u) for u in image.users)  # the input quantize is outside
    output = next(n for n in program.graph.nodes if n.op == "output").args[0][0]
    assert is_dequantize(output)
    # the VGF partition fell apart around the grid sampler: one delegate per piece (the conv
    # before it, the grid computation, the conv after it), each compiled by model-converter
    assert len(_delegates(program)) == 3
    assert {"DetagInputQuantize", "DetagOutputDequantize", "DetagOps"} <= set(
        partitioner.detagged.values()
    )


def test_without_policies_vgf_claims_the_grid_sampler() -> None:
    """Why DetagOps exists: VgfPartitioner tags every grid sampler (and cannot lower an int16
    grid); PolicyPartitioner with DetagOps hands it back with its Q/DQ."""
    from executorch.exir import to_edge

    program = to_edge(_quantized_program(), compile_config=None).exported_program()
    inner = VgfPartitioner(VgfCompileSpec(SPEC)).partition(program).tagged_exported_program
    (sampler,) = [n for n in inner.graph.nodes if is_grid_sampler(n)]
    assert "delegation_tag" in sampler.meta
    result = PolicyPartitioner(
        VgfPartitioner(VgfCompileSpec(SPEC)), [DetagOps([GRID_SAMPLER])]
    ).partition(to_edge(_quantized_program()).exported_program())
    program = result.tagged_exported_program
    unit = [n for n in program.graph.nodes if is_grid_sampler(n)]
    unit += [a for a in unit[0].all_input_nodes] + list(unit[0].users)
    assert all("delegation_tag" not in n.meta for n in unit)
    assert all(
        n.meta["delegation_tag"] in result.partition_tags
        for n in program.graph.nodes
        if "delegation_tag" in n.meta
    )


def test_index_out_of_range_names_the_count() -> None:
    with pytest.raises(ValueError, match="input index 5 is out of range: the program has 2"):
        _lower([DetagInputQuantize([5])])
    with pytest.raises(ValueError, match="output index 1 is out of range: the program has 1"):
        _lower([DetagOutputDequantize([1])])


def test_policy_without_its_nodes_is_a_logged_no_op(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 3, 1).eval()
    program = torch.export.export(model, (torch.randn(1, 3, 4, 4),), strict=True)
    partitioner = PolicyPartitioner(
        VgfPartitioner(VgfCompileSpec(SPEC)),
        [DetagInputQuantize(), DetagOutputDequantize(), DetagOps([GRID_SAMPLER])],
    )
    with caplog.at_level(logging.DEBUG, logger="etkit_partition"):
        lowered = to_edge_transform_and_lower(program, partitioner=[partitioner])
    assert len(_delegates(lowered.exported_program())) == 1
    assert partitioner.detagged == {}
    assert "no quantize consumes inputs" in caplog.text and "no node with targets" in caplog.text


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="inner must be an ExecuTorch Partitioner"):
        PolicyPartitioner(object(), [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policies must have apply"):
        PolicyPartitioner(VgfPartitioner(VgfCompileSpec(SPEC)), ["DetagOps"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="expected an operator"):
        DetagOps(["grid_sampler"])
    with pytest.raises(ValueError, match="at least one operator"):
        DetagOps([])
    with pytest.raises(TypeError, match="input indices must be ints"):
        DetagInputQuantize(["0"])  # type: ignore[list-item]
