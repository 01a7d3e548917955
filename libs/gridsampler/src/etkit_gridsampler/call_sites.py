"""Checks, at export, that every grid-sampler delegate of a lowered program will be called with
the tensors its blob was built for: the runtime refuses anything else at execute (error 0x12),
so a mismatch found here is a program that could never run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.delegate_format import decode, shape_text
from etkit_gridsampler.op import QParams
from etkit_gridsampler.partitioner import UnsupportedGridSamplerError, shape_bounds
from etkit_gridsampler.runtime import BACKEND_ID


class CallSiteError(ValueError):
    """A grid-sampler delegate whose call site passes tensors other than its blob expects."""


@dataclass(frozen=True)
class CallSite:
    """One grid-sampler delegate call: the delegate's name and what it receives (each
    argument's shape, where it is dynamic its upper bounds, and dtype; ``lower_bounds`` each
    argument's lower bounds, equal to its shape where it is fixed)."""

    delegate: str
    arguments: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    lower_bounds: tuple[tuple[int, ...], ...] = ()


def _expected_dtype(qparams: QParams | None) -> torch.dtype:
    return torch.float32 if qparams is None else qparams.dtype


def _argument(
    node: object, delegate: str
) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None:
    """(lower bounds, upper bounds, dtype) of a call's tensor argument; None for another value."""
    value = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    try:
        lower, upper = shape_bounds(value, f"an argument of grid-sampler delegate {delegate}")
    except UnsupportedGridSamplerError as error:
        raise CallSiteError(str(error)) from error
    return lower, upper, value.dtype


def check_call_sites(program: ExportedProgram) -> list[CallSite]:
    """Compares each ``GridSamplerBackend`` delegate call in ``program`` with its blob: the
    number of arguments, and the shape and dtype of the arguments the blob names as image and
    grid (where the program has dynamic dimensions, every size the call can pass must lie
    within the blob's bounds). Returns the call sites checked; raises ``CallSiteError`` naming
    the delegate, the role, what the blob expects and what the call passes."""
    checked: list[CallSite] = []
    module = program.graph_module
    for node in program.graph.nodes:
        if node.op != "call_function" or "executorch_call_delegate" not in str(node.target):
            continue
        lowered_node = node.args[0]
        lowered = getattr(module, str(getattr(lowered_node, "target", "")), None)
        if getattr(lowered, "backend_id", None) != BACKEND_ID:
            continue
        name = str(getattr(lowered_node, "target", "delegate"))
        blob = decode(bytes(lowered.processed_bytes))  # type: ignore[union-attr]
        arguments = [_argument(a, name) for a in node.args[1:]]
        if len(arguments) != blob.roles.inputs or any(a is None for a in arguments):
            raise CallSiteError(
                f"grid-sampler delegate {name} is called with {len(arguments)} tensor arguments "
                f"but was built for {blob.roles.inputs}; the program cannot run"
            )
        for role, index, lower, upper, qparams in (
            ("image", blob.roles.image, blob.image_min_shape, blob.image_shape, blob.op.image),
            ("grid", blob.roles.grid, blob.grid_min_shape, blob.grid_shape, blob.op.grid),
        ):
            got_lower, got_upper, got_dtype = arguments[index]  # type: ignore[misc]
            want_dtype = blob.grid_arrival_dtype if role == "grid" else _expected_dtype(qparams)
            # Every size the call can pass must be one the delegate takes: a fixed size its
            # size, a dynamic dimension's range within the blob's bounds.
            inside = len(got_upper) == 4 and all(
                lo <= got_lo and got_hi <= hi
                for lo, hi, got_lo, got_hi in zip(lower, upper, got_lower, got_upper, strict=True)
            )
            if not inside or got_dtype != want_dtype:
                raise CallSiteError(
                    f"grid-sampler delegate {name}: argument {index} ({role}) is "
                    f"{str(got_dtype).removeprefix('torch.')} {shape_text(got_lower, got_upper)} "
                    f"but the delegate was built for {str(want_dtype).removeprefix('torch.')} "
                    f"{shape_text(tuple(lower), upper)}; the program would fail at execute"
                )
        present = [a for a in arguments if a is not None]
        checked.append(
            CallSite(
                name,
                tuple((upper, dtype) for _, upper, dtype in present),
                tuple(lower for lower, _, _ in present),
            )
        )
    return checked
