"""Ahead-of-time side of the grid-sampler backend: turns a partition (one grid-sampler unit) into
a delegate blob. Its class name is the backend id the runtime registers."""

from __future__ import annotations

from typing import Final, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler import delegate_format
from etkit_gridsampler.delegate_format import ArgumentRoles
from etkit_gridsampler.partitioner import unit_of
from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize

# The delegate debug identifier of the event the C++ backend logs for each call (csrc/backend.cpp's
# kDebugEventName): the key of the debug-handle map ``preprocess`` returns.
DEBUG_EVENT_NAME: Final = "grid_sampler_2d"


class PartitionSignatureError(ValueError):
    """A grid-sampler partition whose signature the backend cannot map onto its image and grid."""


def _source(value: object) -> object:
    """The node a grid-sampler input comes from, through its dequantize and, for a grid the
    delegate quantizes on entry, the quantize before it."""
    if isinstance(value, Node) and is_dequantize(value):
        value = value.args[0]
        if isinstance(value, Node) and is_quantize(value):
            return value.args[0]
    return value


def argument_roles(edge_program: ExportedProgram, sampler: Node) -> ArgumentRoles:
    """Which runtime argument of the delegate made from ``edge_program`` (one partition) is the
    image of ``sampler`` and which its grid. The delegate receives the partition's user-input
    placeholders in their order, whatever order the grid sampler takes them in, so the roles
    come from that signature. Raises ``PartitionSignatureError`` saying what does not fit."""
    user_input_names = set(edge_program.graph_signature.user_inputs)
    inputs = [
        node
        for node in edge_program.graph_module.graph.nodes
        if node.op == "placeholder" and node.name in user_input_names
    ]
    roles: dict[str, int] = {}
    for role, value in (("image", sampler.args[0]), ("grid", sampler.args[1])):
        source = _source(value)
        if source not in inputs:
            name = source.name if isinstance(source, Node) else repr(source)
            raise PartitionSignatureError(
                f"the {role} of grid sampler {sampler.name} comes from {name}, which is not a "
                f"runtime input of its partition (inputs: {[n.name for n in inputs]}); a "
                "grid-sampler partition holds only dequantize -> grid sampler -> quantize and "
                "takes its image and grid at run time: tag it with GridSamplerPartitioner"
            )
        roles[role] = inputs.index(source)
    unused = [n.name for i, n in enumerate(inputs) if i not in roles.values()]
    if unused:
        raise PartitionSignatureError(
            f"the partition of grid sampler {sampler.name} has inputs {unused} that are neither "
            "its image nor its grid; tag it with GridSamplerPartitioner"
        )
    return ArgumentRoles(inputs=len(inputs), image=roles["image"], grid=roles["grid"])


@final
class GridSamplerBackend(BackendDetails):  # type: ignore[misc]  # executorch is untyped
    """Compiles one grid-sampler unit into the blob of ``delegate_format``."""

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> PreprocessResult:
        samplers = [n for n in edge_program.graph_module.graph.nodes if is_grid_sampler(n)]
        if len(samplers) != 1:
            raise ValueError(
                f"a grid-sampler partition holds exactly one grid sampler, got {len(samplers)}"
            )
        (output,) = [n for n in edge_program.graph_module.graph.nodes if n.op == "output"]
        if len(output.args[0]) != 1:
            raise PartitionSignatureError(
                f"a grid-sampler partition has exactly one output, got {len(output.args[0])}; "
                "tag it with GridSamplerPartitioner"
            )
        # A quantize the partitioner put in the partition is fused (the grid arrives float32).
        unit = unit_of(samplers[0], fuse_grid_quantize=True, inside_partition=True)
        roles = argument_roles(edge_program, samplers[0])
        blob = delegate_format.encode(
            unit.op,
            unit.image_shape,
            unit.grid_shape,
            roles=roles,
            image_min_shape=unit.image_min_shape,
            grid_min_shape=unit.grid_min_shape,
            quantizes_grid=unit.quantizes_grid,
        )
        return PreprocessResult(
            processed_bytes=blob, debug_handle_map=debug_handle_map(samplers[0])
        )


def debug_handle_map(sampler: Node) -> dict[str, tuple[int, ...]]:
    """The delegate's debug-handle map: the event the runtime backend logs for each call
    (``DEBUG_EVENT_NAME``: its time and output) stands for ``sampler``, the source grid_sample
    node, through that node's debug handle. Empty when the node has none (a program lowered
    outside ``to_edge``)."""
    handle = sampler.meta.get("debug_handle")
    if isinstance(handle, int):
        return {DEBUG_EVENT_NAME: (handle,)}
    if isinstance(handle, (tuple, list)) and handle:
        return {DEBUG_EVENT_NAME: tuple(int(h) for h in handle)}
    return {}
