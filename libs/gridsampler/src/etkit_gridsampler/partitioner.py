"""Decides which grid samplers of an edge program the grid-sampler backend takes (tags them);
compiling is the backend's job, executing the runtime's."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.runtime import BACKEND_ID
from etkit_quant.graph import is_grid_sampler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    """A grid sampler left undelegated, and why."""

    node: str
    reason: str


def _tensor_meta(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def unsupported_reason(node: Node) -> str | None:
    """Why the backend cannot take this grid sampler node, or ``None`` when it can."""
    image, grid = (_tensor_meta(arg) for arg in node.args[:2])
    if image is None or grid is None:
        return "image or grid has no tensor metadata"
    if image.dim() != 4 or grid.dim() != 4 or grid.shape[-1] != 2:
        return f"only 2-D sampling (4-D image, N x Ho x Wo x 2 grid); got {tuple(image.shape)}"
    if image.dtype != torch.float32 or grid.dtype != torch.float32:
        return f"this build delegates float32 grid samplers only; got {image.dtype}, {grid.dtype}"
    mode = node.args[2] if len(node.args) > 2 else 0
    if mode not in (0, 1):
        return f"interpolation mode {mode} (bicubic) is not supported"
    if any(not isinstance(d, int) for d in (*image.shape, *grid.shape)):
        return "dynamic shapes are not supported"
    return None


class GridSamplerPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
    """Tags each grid sampler the backend supports as a partition of its own. The ones it leaves
    out are in ``rejections`` (and logged), for reports."""

    def __init__(self) -> None:
        super().__init__()
        self.delegation_spec = DelegationSpec(BACKEND_ID, [])
        self.rejections: list[Rejection] = []

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], None]:
        return [torch.ops.aten.grid_sampler_2d.default], None

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self.rejections = []
        tags: dict[str, DelegationSpec] = {}
        for node in exported_program.graph_module.graph.nodes:
            if not is_grid_sampler(node):
                continue
            reason = unsupported_reason(node)
            if reason is not None:
                logger.debug("grid sampler %s stays undelegated: %s", node.name, reason)
                self.rejections.append(Rejection(node.name, reason))
                continue
            tag = f"etkit_grid_sampler_{len(tags)}"
            node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
