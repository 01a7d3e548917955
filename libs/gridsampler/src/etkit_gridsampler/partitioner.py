"""Decides which grid samplers of an edge program the grid-sampler backend takes (tags them);
compiling is the backend's job, executing the runtime's."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import executorch.kernels.quantized  # noqa: F401  (out variants of the Q/DQ left around delegates)
import torch
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.delegate_format import ArgumentRoles, DelegateFormatError, encode
from etkit_gridsampler.op import MODE_NAMES, PADDING_NAMES, GridSampleOp, QParams
from etkit_gridsampler.plan import unsupported_reason
from etkit_gridsampler.runtime import BACKEND_ID
from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    """A grid sampler left undelegated, and why."""

    node: str
    reason: str


@dataclass(frozen=True)
class GridSamplerUnit:
    """One grid sampler as the backend sees it: the op, the shapes, and the nodes of its unit
    (dequantize -> grid_sampler_2d -> quantize, or the grid sampler alone when float)."""

    op: GridSampleOp
    image_shape: tuple[int, int, int, int]
    grid_shape: tuple[int, int, int, int]
    nodes: tuple[Node, ...]


class UnsupportedGridSamplerError(ValueError):
    """A grid sampler the backend cannot take; the message says why."""


def _tensor_meta(node: object) -> torch.Tensor:
    value = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(value, torch.Tensor):
        raise UnsupportedGridSamplerError("image or grid has no tensor metadata")
    return value


def _qparams_of(node: Node) -> QParams:
    scale, zero_point, quant_min, quant_max, dtype = node.args[1:6]
    try:
        return QParams(float(scale), int(zero_point), int(quant_min), int(quant_max), dtype)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise UnsupportedGridSamplerError(
            f"unsupported quantization at {node.name}: {error}"
        ) from error


def _sole_user_is(node: Node, user: Node) -> bool:
    return len(node.users) == 1 and next(iter(node.users)) is user


def unit_of(node: Node) -> GridSamplerUnit:
    """The unit of the ``grid_sampler_2d`` ``node``. Raises ``UnsupportedGridSamplerError``
    saying why the backend cannot take it."""
    image, grid = node.args[0], node.args[1]
    mode, padding, align_corners = node.args[2:5]
    if not isinstance(mode, int) or mode not in MODE_NAMES:
        raise UnsupportedGridSamplerError(f"interpolation mode {mode} (bicubic) is not supported")
    if not isinstance(padding, int) or padding not in PADDING_NAMES:
        raise UnsupportedGridSamplerError(f"padding mode {padding} is not supported")
    if not isinstance(image, Node) or not isinstance(grid, Node):
        raise UnsupportedGridSamplerError("image and grid must be tensors")
    nodes = [node]
    image_q = grid_q = output_q = None
    image_is_dq = is_dequantize(image) and _sole_user_is(image, node)
    grid_is_dq = is_dequantize(grid) and _sole_user_is(grid, node)
    if image_is_dq and grid_is_dq:
        image_q, grid_q = _qparams_of(image), _qparams_of(grid)
        nodes += [image, grid]
        (user,) = node.users if len(node.users) == 1 else (None,)
        if user is not None and is_quantize(user):
            output_q = _qparams_of(user)
            nodes.append(user)
        image_value = _tensor_meta(image.args[0])
        grid_value = _tensor_meta(grid.args[0])
    elif image_is_dq or grid_is_dq:
        raise UnsupportedGridSamplerError(
            "image and grid must both be quantized (dequantize -> grid sampler) or both float"
        )
    else:
        image_value, grid_value = _tensor_meta(image), _tensor_meta(grid)
        if image_value.dtype != torch.float32 or grid_value.dtype != torch.float32:
            raise UnsupportedGridSamplerError(
                f"a float grid sampler needs float32 tensors, got {image_value.dtype}, "
                f"{grid_value.dtype}"
            )
    if image_value.dim() != 4 or grid_value.dim() != 4 or grid_value.shape[-1] != 2:
        raise UnsupportedGridSamplerError(
            f"only 2-D sampling (4-D image, N x Ho x Wo x 2 grid); got "
            f"{tuple(image_value.shape)} and {tuple(grid_value.shape)}"
        )
    if any(not isinstance(d, int) for d in (*image_value.shape, *grid_value.shape)):
        raise UnsupportedGridSamplerError("dynamic shapes are not supported")
    op = GridSampleOp(
        mode=MODE_NAMES[mode],
        padding_mode=PADDING_NAMES[padding],
        align_corners=bool(align_corners),
        image=image_q,
        grid=grid_q,
        output=output_q,
    )
    reason = unsupported_reason(op, image_value.shape[2], image_value.shape[3])
    if reason is not None:
        raise UnsupportedGridSamplerError(reason)
    # Refuse now what preprocess could not write. Which argument comes first is known only once
    # the partition exists, but no rule of the blob depends on it; one tensor feeding both
    # inputs is one runtime argument.
    one_tensor = (image.args[0] if image_is_dq else image) is (grid.args[0] if grid_is_dq else grid)
    roles = ArgumentRoles(1, 0, 0) if one_tensor else ArgumentRoles(2, 0, 1)
    try:
        encode(op, tuple(image_value.shape), tuple(grid_value.shape), roles=roles)
    except DelegateFormatError as error:
        raise UnsupportedGridSamplerError(str(error)) from error
    return GridSamplerUnit(
        op,
        tuple(image_value.shape),  # type: ignore[arg-type]
        tuple(grid_value.shape),  # type: ignore[arg-type]
        tuple(nodes),
    )


class GridSamplerPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
    """Tags each grid sampler the backend supports, with the dequantize nodes feeding it and the
    quantize after it, as a partition of its own. The ones it leaves out are in ``rejections``
    (and logged at debug level), for reports."""

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
            if not is_grid_sampler(node) or "delegation_tag" in node.meta:
                continue
            try:
                unit = unit_of(node)
            except UnsupportedGridSamplerError as error:
                logger.debug("grid sampler %s stays undelegated: %s", node.name, error)
                self.rejections.append(Rejection(node.name, str(error)))
                continue
            tag = f"etkit_grid_sampler_{len(tags)}"
            for member in unit.nodes:
                member.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
