"""Checks, at export, that every grid-sampler delegate of a lowered program will be called with
the tensors its blob was built for: the runtime refuses anything else at execute (error 0x12),
so a mismatch found here is a program that could never run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.delegate_format import decode
from etkit_gridsampler.op import QParams
from etkit_gridsampler.runtime import BACKEND_ID


class CallSiteError(ValueError):
    """A grid-sampler delegate whose call site passes tensors other than its blob expects."""


@dataclass(frozen=True)
class CallSite:
    """One grid-sampler delegate call: the delegate's name and what it receives."""

    delegate: str
    arguments: tuple[tuple[tuple[int, ...], torch.dtype], ...]


def _expected_dtype(qparams: QParams | None) -> torch.dtype:
    return torch.float32 if qparams is None else qparams.dtype


def _argument(node: object) -> tuple[tuple[int, ...], torch.dtype] | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(int(d) for d in value.shape), value.dtype


def check_call_sites(program: ExportedProgram) -> list[CallSite]:
    """Compares each ``GridSamplerBackend`` delegate call in ``program`` with its blob: the
    number of arguments, and the shape and dtype of the arguments the blob names as image and
    grid. Returns the call sites checked; raises ``CallSiteError`` naming the delegate, the role,
    what the blob expects and what the call passes."""
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
        arguments = [_argument(a) for a in node.args[1:]]
        if len(arguments) != blob.roles.inputs or any(a is None for a in arguments):
            raise CallSiteError(
                f"grid-sampler delegate {name} is called with {len(arguments)} tensor arguments "
                f"but was built for {blob.roles.inputs}; the program cannot run"
            )
        for role, index, shape, qparams in (
            ("image", blob.roles.image, blob.image_shape, blob.op.image),
            ("grid", blob.roles.grid, blob.grid_shape, blob.op.grid),
        ):
            got_shape, got_dtype = arguments[index]  # type: ignore[misc]
            want_dtype = _expected_dtype(qparams)
            if got_shape != tuple(shape) or got_dtype != want_dtype:
                raise CallSiteError(
                    f"grid-sampler delegate {name}: argument {index} ({role}) is "
                    f"{str(got_dtype).removeprefix('torch.')} {list(got_shape)} but the delegate "
                    f"was built for {str(want_dtype).removeprefix('torch.')} {list(shape)}; "
                    "the program would fail at execute"
                )
        checked.append(CallSite(name, tuple(a for a in arguments if a is not None)))
    return checked
