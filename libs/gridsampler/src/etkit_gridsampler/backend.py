"""Ahead-of-time side of the grid-sampler backend: turns a partition (one grid sampler) into a
delegate blob. Its class name is the backend id the runtime registers."""

from __future__ import annotations

from typing import final

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etkit_gridsampler import delegate_format
from etkit_gridsampler.op import GridSampleOp
from etkit_quant.graph import is_grid_sampler

_MODES = {0: "bilinear", 1: "nearest"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def op_of(node: torch.fx.Node) -> GridSampleOp:
    """The ``GridSampleOp`` of an ``aten.grid_sampler_2d`` node (float operands)."""
    mode, padding, align_corners = node.args[2:5]
    if mode not in _MODES or padding not in _PADDINGS:
        raise ValueError(f"{node.name}: unsupported mode {mode} or padding {padding}")
    return GridSampleOp(
        mode=_MODES[mode],  # type: ignore[arg-type,index]
        padding_mode=_PADDINGS[padding],  # type: ignore[arg-type,index]
        align_corners=bool(align_corners),
    )


@final
class GridSamplerBackend(BackendDetails):  # type: ignore[misc]  # executorch is untyped
    """Compiles one grid sampler into the blob of ``delegate_format``."""

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> PreprocessResult:
        samplers = [n for n in edge_program.graph_module.graph.nodes if is_grid_sampler(n)]
        if len(samplers) != 1:
            raise ValueError(
                f"a grid-sampler partition holds exactly one grid sampler, got {len(samplers)}"
            )
        (node,) = samplers
        image, grid = (arg.meta["val"] for arg in node.args[:2])
        blob = delegate_format.encode(op_of(node), tuple(image.shape), tuple(grid.shape))
        return PreprocessResult(processed_bytes=blob)
