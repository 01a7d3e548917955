"""``keep_activation_bounds``: a ReLU (or a ReLU6-like ``hardtanh`` from 0) whose quantized
output can hold values below 0 is kept as a ``clamp``, so that the Arm backend computes it.

Why: the Arm backend's ``FuseQuantizedActivationPass`` (ExecuTorch 1.5.1) removes a ReLU that
follows a conv or linear and is quantized right after, assuming the quantization range itself
clips at 0 (an observer on a ReLU's output puts the zero point at the integer minimum, so the
int8 rescale saturates there). A fixed qspec that etkit places on that tensor (SNORM8 at a
program output or at a grid sampler's image: zero point 0, range [-127, 127]) does not clip at
0: the ReLU is dropped and every negative value goes through (measured: a conv + ReLU output of
a spatial-transformer front end 77 steps off). The pass rewrites such activations into
``clamp`` (which that pass leaves alone and the backend lowers as a TOSA CLAMP), before
partitioning; activations whose quantized output clips at their lower bound anyway are left as
they are (the backend's fusion is exact for them).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from etkit_quant.graph import is_quantize, operator_name

logger = logging.getLogger(__name__)


def _lower_bound(node: Node) -> tuple[float, float | None] | None:
    """The (min, max) of a ReLU-like activation that the backend may fold into a quantize:
    ``relu`` (0, None) and ``hardtanh`` from 0 (0, max); ``None`` for anything else."""
    name = operator_name(node.target)
    if name in ("aten::relu", "aten::relu.default", "aten::relu_", "aten::relu_.default"):
        return 0.0, None
    if name in ("aten::hardtanh", "aten::hardtanh.default"):
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
        if isinstance(low, int | float) and low == 0 and isinstance(high, int | float):
            return 0.0, float(high)
    return None


def _clips_at_zero(quantize: Node) -> bool:
    """Whether the integer type's saturation of ``quantize``'s output is exactly its zero
    point (the value 0): then dropping a ReLU before it changes nothing."""
    zero_point, dtype = quantize.args[2], quantize.args[5]
    if not isinstance(zero_point, int) or not isinstance(dtype, torch.dtype):
        return True  # per-tensor qparams as tensors: not what the backend folds
    return zero_point == torch.iinfo(dtype).min


def _clamp_op() -> Any:
    return exir_ops.edge.aten.clamp.default


def activations_at_risk(graph_module: GraphModule) -> list[Node]:
    """The ReLU-like nodes whose only user is a quantize whose range holds negative values."""
    found = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or _lower_bound(node) is None or len(node.users) != 1:
            continue
        (user,) = node.users
        if is_quantize(user) and len(user.args) >= 6 and not _clips_at_zero(user):
            found.append(node)
    return found


def keep_activation_bounds(graph_module: GraphModule) -> PassResult:
    """An edge-dialect transform pass (a ``transform_passes`` entry of
    ``to_edge_transform_and_lower``): each activation of ``activations_at_risk`` becomes
    ``clamp(x, min, max)`` with the same meta (quantization annotations included). Running it
    again changes nothing."""
    changed = activations_at_risk(graph_module)
    for node in changed:
        bounds = _lower_bound(node)
        assert bounds is not None
        with graph_module.graph.inserting_before(node):
            clamp = graph_module.graph.call_function(_clamp_op(), (node.args[0], *bounds))
        clamp.meta.update(node.meta)
        node.replace_all_uses_with(clamp)
        graph_module.graph.erase_node(node)
        logger.debug("activation %s kept as a clamp (its quantized output holds negatives)", node)
    if changed:
        graph_module.graph.lint()
        graph_module.recompile()
    return PassResult(graph_module, bool(changed))
