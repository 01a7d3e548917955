"""Decides which grid samplers of an edge program the grid-sampler backend takes (tags them);
compiling is the backend's job, executing the runtime's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import executorch.kernels.quantized  # noqa: F401  (out variants of the Q/DQ left around delegates)
import torch
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.delegate_format import (
    ArgumentRoles,
    DelegateFormatError,
    SamplerShapes,
    encode,
)
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
class GridSamplerUnit(SamplerShapes):
    """One grid sampler as the backend sees it: the op, the shapes (where the program has
    dynamic dimensions, ``torch.export`` ``Dim``s: their bounds) and the nodes of its unit
    (dequantize -> grid_sampler_2d -> quantize, or the grid sampler alone when float)."""

    nodes: tuple[Node, ...] = field(kw_only=True)
    # The quantize before the grid's dequantize is in the unit: the delegate receives the
    # float32 grid and quantizes it on entry (the blob's grid arrival code 1).
    quantizes_grid: bool = field(default=False, kw_only=True)


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


def _finite(bound: Any) -> int | None:
    """A value range's bound as an int; None when it is infinite (sympy's ``oo`` or torch's
    ``int_oo``, which calls itself finite)."""
    from torch.utils._sympy.numbers import int_oo

    if bound in (int_oo, -int_oo) or not bound.is_finite:
        return None
    return int(bound)


def dimension_bounds(dimension: object, what: str) -> tuple[int, int]:
    """(lower, upper) of one dimension of a fake tensor: its size twice when it is fixed; for a
    symbolic size (``torch.export`` dynamic shapes), the bounds of its expression over the
    value ranges of the shape environment. The upper bound is the range's. The lower bound is
    taken with every symbol whose range starts at 2 or below starting at 1: tracing assumes a
    symbolic size is not 0 or 1 (a ``Dim`` with ``min=0`` or ``1`` reads as 2 in the program),
    but the program runs at those sizes, and the kernel samples any size from 1. Raises
    ``UnsupportedGridSamplerError`` for a size without a finite upper bound, naming ``what``."""
    if isinstance(dimension, int):
        return dimension, dimension
    if not isinstance(dimension, torch.SymInt):
        raise UnsupportedGridSamplerError(f"{what} has size {dimension!r}, not an int")
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    node = dimension.node
    expr = node.expr
    if expr.is_number:
        return int(expr), int(expr)
    ranges = dict(node.shape_env.var_to_range)
    upper = _finite(bound_sympy(expr, ranges).upper)
    if upper is None:
        raise UnsupportedGridSamplerError(
            f"{what} is dynamic ({expr}) with no upper bound: give its torch.export Dim a max "
            "(the program's memory plan and the delegate need one)"
        )
    relaxed = {
        symbol: ValueRanges(1, bound.upper) if bound.lower <= 2 else bound
        for symbol, bound in ranges.items()
    }
    lower = _finite(bound_sympy(expr, relaxed).lower)
    return max(1, min(1 if lower is None else lower, upper)), upper


def shape_bounds(value: torch.Tensor, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The lower and upper bounds of each dimension of the fake tensor ``value``
    (``dimension_bounds``)."""
    bounds = [dimension_bounds(d, f"{what} dimension {i}") for i, d in enumerate(value.shape)]
    return tuple(b[0] for b in bounds), tuple(b[1] for b in bounds)


def fusable_grid_quantize(
    grid_dequantize: Node, sampler: Node, inside_partition: bool = False
) -> Node | None:
    """The quantize that makes the grid ``grid_dequantize`` reads, where the delegate can take it
    in (quantize the grid on entry): a quantize of a float32 tensor the program computes (not
    one of its inputs: an input's quantize is the caller's, which an exporter takes out of the
    program so that the input arrives quantized), whose one user is that dequantize and that no
    other partition holds. None otherwise. ``inside_partition``: the nodes are a partition's
    own program (``GridSamplerBackend.preprocess``), whose inputs are all placeholders: a
    quantize there is one the partitioner took."""
    quantize = grid_dequantize.args[0]
    if not isinstance(quantize, Node) or not is_quantize(quantize):
        return None
    source = quantize.args[0]
    tag = quantize.meta.get("delegation_tag")
    if (
        not _sole_user_is(quantize, grid_dequantize)
        or tag not in (None, sampler.meta.get("delegation_tag"))
        or not isinstance(source, Node)
        or (source.op == "placeholder" and not inside_partition)
        or not isinstance(source.meta.get("val"), torch.Tensor)
        or source.meta["val"].dtype != torch.float32
    ):
        return None
    return quantize


def unit_of(
    node: Node, fuse_grid_quantize: bool = False, inside_partition: bool = False
) -> GridSamplerUnit:
    """The unit of the ``grid_sampler_2d`` ``node``; with ``fuse_grid_quantize``, the quantize
    that makes its grid too where it can be (``fusable_grid_quantize``, with
    ``inside_partition``). Raises ``UnsupportedGridSamplerError`` saying why the backend cannot
    take it."""
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
    grid_quantize: Node | None = None
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
        grid_quantize = (
            fusable_grid_quantize(grid, node, inside_partition) if fuse_grid_quantize else None
        )
        if grid_quantize is not None and grid_quantize.args[0] is not image.args[0]:
            nodes.append(grid_quantize)
        else:  # one tensor as both image and grid stays one argument
            grid_quantize = None
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
    image_lower, image_shape = shape_bounds(image_value, "the image's")
    grid_lower, grid_shape = shape_bounds(grid_value, "the grid's")
    if grid_shape[3] != 2 or grid_lower[3] != 2:
        raise UnsupportedGridSamplerError(
            f"only 2-D sampling (N x Ho x Wo x 2 grid); got {tuple(grid_value.shape)}"
        )
    op = GridSampleOp(
        mode=MODE_NAMES[mode],
        padding_mode=PADDING_NAMES[padding],
        align_corners=bool(align_corners),
        image=image_q,
        grid=grid_q,
        output=output_q,
    )
    # At the upper bounds: every limit of the contract grows with the image's size, so what
    # holds there holds for every size within the bounds.
    reason = unsupported_reason(op, image_shape[2], image_shape[3])
    if reason is not None:
        raise UnsupportedGridSamplerError(reason)
    # Refuse now what preprocess could not write. Which argument comes first is known only once
    # the partition exists, but no rule of the blob depends on it; one tensor feeding both
    # inputs is one runtime argument.
    one_tensor = grid_quantize is None and (image.args[0] if image_is_dq else image) is (
        grid.args[0] if grid_is_dq else grid
    )
    roles = ArgumentRoles(1, 0, 0) if one_tensor else ArgumentRoles(2, 0, 1)
    try:
        encode(
            op,
            image_shape,
            grid_shape,
            roles=roles,
            image_min_shape=image_lower,
            grid_min_shape=grid_lower,
            quantizes_grid=grid_quantize is not None,
        )
    except DelegateFormatError as error:
        raise UnsupportedGridSamplerError(str(error)) from error
    return GridSamplerUnit(
        op,
        image_shape,  # type: ignore[arg-type]
        grid_shape,  # type: ignore[arg-type]
        image_lower,
        grid_lower,
        nodes=tuple(nodes),
        quantizes_grid=grid_quantize is not None,
    )


class GridSamplerPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
    """Tags each grid sampler the backend supports, with the dequantize nodes feeding it and the
    quantize after it, as a partition of its own. The ones it leaves out are in ``rejections``
    (and logged at debug level), for reports. With ``fuse_grid_quantize``, a quantize that
    makes a sampler's grid from a float32 tensor and that no other delegate took joins the
    partition: the delegate quantizes the grid on entry, on its own threads, where the program
    would otherwise run ExecuTorch's single-threaded portable kernel over the whole grid (XNNPACK
    has no int16 tensors)."""

    def __init__(self, fuse_grid_quantize: bool = False) -> None:
        super().__init__()
        self.fuse_grid_quantize = fuse_grid_quantize
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
                unit = unit_of(node, self.fuse_grid_quantize)
            except UnsupportedGridSamplerError as error:
                logger.debug("grid sampler %s stays undelegated: %s", node.name, error)
                self.rejections.append(Rejection(node.name, str(error)))
                continue
            tag = f"etkit_grid_sampler_{len(tags)}"
            for member in unit.nodes:
                member.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
