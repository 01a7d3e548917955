"""Ahead-of-time side of the grid-sampler backend: turns a partition (one grid-sampler unit) into
a delegate blob. Its class name is the backend id the runtime registers."""

from __future__ import annotations

from typing import final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etkit_gridsampler import delegate_format
from etkit_gridsampler.partitioner import unit_of
from etkit_quant.graph import is_grid_sampler


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
        unit = unit_of(samplers[0])
        blob = delegate_format.encode(unit.op, unit.image_shape, unit.grid_shape)
        return PreprocessResult(processed_bytes=blob)
