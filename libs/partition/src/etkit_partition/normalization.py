"""Normalizations written in ops a backend lowers.

``instance_norms_as_moments`` (XNNPACK): ExecuTorch lowers ``aten.instance_norm`` to
``_native_batch_norm_legit.no_stats``, which no XNNPACK config takes, so each instance norm ran
as ExecuTorch's portable float kernel, single-threaded, outside every delegate (RAFT-small's
feature and context encoders: 21 of them, 21 % of its program's time at 256x448). Written as its
moments, ``(x - mean) * rsqrt(mean((x - mean)^2) + eps)`` with the affine weight and bias, the
same norm is ``mean.dim`` over H and W (XNNPACK's global average pooling), ``sub``, ``mul``,
``add`` and ``rsqrt``, every one an op XNNPACK lowers in float32 on its threads. The values are
those of PyTorch's own decomposition up to float32 rounding (the variance is the biased one, as
instance norm's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram


def _instance_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    use_input_stats: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> torch.Tensor:
    """``aten.instance_norm`` as its moments (the running statistics in place of the input's
    where ``use_input_stats`` is false, as in an exported model; they are never updated)."""
    dims = list(range(2, input.dim()))
    per_channel = [1, -1] + [1] * len(dims)
    if use_input_stats or running_mean is None or running_var is None:
        mean = input.mean(dim=dims, keepdim=True)
        centered = input - mean
        variance = (centered * centered).mean(dim=dims, keepdim=True)
    else:
        centered = input - running_mean.view(per_channel)
        variance = running_var.view(per_channel)
    out = centered * torch.rsqrt(variance + eps)
    if weight is not None:
        out = out * weight.view(per_channel)
    if bias is not None:
        out = out + bias.view(per_channel)
    return out


def has_instance_norms(program: ExportedProgram) -> bool:
    """True when ``program`` holds an ``aten.instance_norm``."""
    target = torch.ops.aten.instance_norm.default
    return any(n.op == "call_function" and n.target is target for n in program.graph.nodes)


def instance_norms_as_moments(program: ExportedProgram) -> ExportedProgram:
    """``program`` with every ``aten.instance_norm`` written as its moments (the module's
    docstring); ``program`` itself where it has none. The other ops are left as they are."""
    if not has_instance_norms(program):
        return program
    table: dict[Any, Any] = {torch.ops.aten.instance_norm.default: _instance_norm}
    rewritten: ExportedProgram = program.run_decompositions(table)
    return rewritten
