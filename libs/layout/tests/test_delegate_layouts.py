"""pin_delegate_layouts on real lowered programs (two stand-in backends, no runtime): the layouts
channels_last gives delegate boundaries survive to_executorch's re-trace into the serialized
program; without the pass they do not."""

from __future__ import annotations

from typing import Any, final

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram

from etkit_layout import channels_last, delegate_layout_mismatches, pin_delegate_layouts

NHWC = (0, 2, 3, 1)
NCHW = (0, 1, 2, 3)


@final
class LayoutProbeSampler(BackendDetails):  # type: ignore[misc]
    """Stands in for a backend that reads and writes any dim order (etkit's grid sampler)."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[Any]) -> PreprocessResult:
        return PreprocessResult(processed_bytes=b"sampler")


@final
class LayoutProbeEngine(BackendDetails):  # type: ignore[misc]
    """Stands in for a backend compiled for the layouts of its boundary (the VGF backend)."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[Any]) -> PreprocessResult:
        return PreprocessResult(processed_bytes=b"engine")


class _ByOperator(Partitioner):  # type: ignore[misc]
    """The nodes calling one of ``names`` (edge operator names) become one partition."""

    def __init__(self, backend: type[BackendDetails], names: tuple[str, ...]) -> None:
        super().__init__()
        self.backend_id = backend.__name__
        self.names = names

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        tag = self.backend_id
        for node in exported_program.graph.nodes:
            if node.op == "call_function" and any(n in str(node.target) for n in self.names):
                node.meta["delegation_tag"] = tag
        return PartitionResult(
            tagged_exported_program=exported_program,
            partition_tags={tag: DelegationSpec(self.backend_id, [])},
        )


class Warp(torch.nn.Module):
    """An image made by a reshape (left to the portable kernels), sampled, then scaled and
    sliced by another engine: the sampler's image and output and the program's output are
    channels-last boundaries."""

    def forward(self, flat: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(flat.reshape(1, 4, 8, 8), grid, align_corners=False)
        return torch.mul(warped, 2.0)[:, :3]


def _lowered() -> EdgeProgramManager:
    torch.manual_seed(0)
    inputs = (torch.rand(1, 256), torch.rand(1, 5, 6, 2) * 2 - 1)
    program = torch.export.export(Warp().eval(), inputs, strict=True)
    manager = to_edge_transform_and_lower(
        program,
        partitioner=[_ByOperator(LayoutProbeEngine, ("aten.mul", "aten.slice"))],
        transform_passes=[channels_last],
    )
    return manager.to_backend(_ByOperator(LayoutProbeSampler, ("grid_sampler_2d",)))


def _delegate_io(pte: bytes) -> list[tuple[str, list[tuple[int, ...]]]]:
    """(backend id, dim order of each argument) of every delegate call in the serialized
    forward method."""
    plans = deserialize_pte_binary(pte).program.execution_plan
    plan = next(p for p in plans if p.name == "forward")
    calls = []
    for chain in plan.chains:
        for instruction in chain.instructions:
            args = instruction.instr_args
            if type(args).__name__ != "DelegateCall":
                continue
            backend = plan.delegates[args.delegate_index].id
            orders = [tuple(int(d) for d in plan.values[i].val.dim_order) for i in args.args]
            calls.append((backend, orders))
    return calls


def test_without_the_pass_the_retrace_loses_delegate_layouts() -> None:
    manager = _lowered()
    assert delegate_layout_mismatches(manager.exported_program()) == []  # as lowered
    executorch = manager.to_executorch()
    problems = delegate_layout_mismatches(executorch.exported_program())
    assert any("LayoutProbeSampler" in p and "output 0" in p for p in problems)
    # serialized: the sampler writes NCHW, the engine was compiled to read NHWC
    (_, sampler), (_, engine) = _delegate_io(executorch.buffer)
    assert sampler[-1] == NCHW and engine[0] == NCHW


@pytest.mark.parametrize("any_layout", [(), ("LayoutProbeSampler",)])
def test_serialized_layouts_are_the_compiled_ones(any_layout: tuple[str, ...]) -> None:
    manager = _lowered()
    result = pin_delegate_layouts(manager.exported_program(), any_layout_backends=any_layout)
    pinned = {(f.backend_id, f.kind, f.index, f.dim_order) for f in result.fixes}
    assert ("LayoutProbeSampler", "output", 0, NHWC) in pinned
    # The reshape computes NCHW: a copy to the sampler's NHWC unless the sampler takes any.
    copies = {(f.backend_id, f.index, f.dim_order) for f in result.copies}
    assert copies == (set() if any_layout else {("LayoutProbeSampler", 0, NHWC)})
    again = pin_delegate_layouts(manager.exported_program(), any_layout_backends=any_layout)
    assert not again.modified
    executorch = manager.to_executorch()
    final = executorch.exported_program()
    assert delegate_layout_mismatches(final, any_layout_backends=any_layout) == []
    (sampler_id, sampler), (engine_id, engine) = _delegate_io(executorch.buffer)
    assert (sampler_id, engine_id) == ("LayoutProbeSampler", "LayoutProbeEngine")
    image, grid, sampled = sampler
    assert (image, grid, sampled) == (NCHW if any_layout else NHWC, NCHW, NHWC)
    # reads what the sampler writes, writes the NHWC output
    assert (engine[0], engine[-1]) == (NHWC, NHWC)
    plan = deserialize_pte_binary(executorch.buffer).program.execution_plan[0]
    (output,) = plan.outputs
    assert tuple(plan.values[output].val.dim_order) == NHWC


def test_nothing_to_pin_without_channels_last() -> None:
    inputs = (torch.rand(1, 256), torch.rand(1, 5, 6, 2) * 2 - 1)
    program = torch.export.export(Warp().eval(), inputs, strict=True)
    manager = to_edge_transform_and_lower(
        program, partitioner=[_ByOperator(LayoutProbeEngine, ("aten.mul", "aten.slice"))]
    ).to_backend(_ByOperator(LayoutProbeSampler, ("grid_sampler_2d",)))
    assert not pin_delegate_layouts(manager.exported_program()).modified
    executorch = manager.to_executorch()
    assert all(order == NCHW for _, io in _delegate_io(executorch.buffer) for order in io[::2])


class OneChannelWarp(torch.nn.Module):
    """A 1-channel image sampled, then scaled by another engine into ``channels`` channels of
    ``out`` x ``out`` pixels: at C = 1, and at H = W = 1, NCHW and NHWC are the same bytes."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(image, grid, align_corners=False)
        return torch.mul(warped.expand(-1, self.channels, -1, -1), 2.0)


@pytest.mark.parametrize(("channels", "out"), [(1, 5), (4, 1), (16, 1), (2, 5)])
def test_same_bytes_layouts_need_no_copy_and_agree(channels: int, out: int) -> None:
    """Tensors whose NCHW and NHWC layouts are the same bytes (C = 1, H = W = 1) count as
    agreeing: no layout copy runs for them and no mismatch is reported, before and after
    to_executorch, at batch 2 as at batch 1."""
    inputs = (torch.rand(2, 1, 8, 8), torch.rand(2, out, out, 2) * 2 - 1)
    program = torch.export.export(OneChannelWarp(channels).eval(), inputs, strict=True)
    manager = to_edge_transform_and_lower(
        program,
        partitioner=[_ByOperator(LayoutProbeEngine, ("aten.mul", "aten.expand"))],
        transform_passes=[channels_last],
    ).to_backend(_ByOperator(LayoutProbeSampler, ("grid_sampler_2d",)))
    result = pin_delegate_layouts(manager.exported_program())
    assert result.copies == ()
    assert delegate_layout_mismatches(manager.exported_program()) == []
    executorch = manager.to_executorch()
    assert delegate_layout_mismatches(executorch.exported_program()) == []
    (_, sampler), (_, engine) = _delegate_io(executorch.buffer)
    # the sampler's output (1 channel) is read by the engine as written
    assert sampler[-1] in (NCHW, NHWC) and engine[0] in (NCHW, NHWC)
    plan = deserialize_pte_binary(executorch.buffer).program.execution_plan[0]
    (output,) = plan.outputs
    expected = NHWC if channels > 1 and out > 1 else None
    if expected is not None:
        assert tuple(plan.values[output].val.dim_order) == expected
