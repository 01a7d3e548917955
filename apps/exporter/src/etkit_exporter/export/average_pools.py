"""Average pools in a form the VGF computes right, for quantized VGF exports (before
quantization; each rewrite leaves the float model's values as they were).

``average_pools_as_convs``: an ``avg_pool2d`` without padding (and an ``adaptive_avg_pool2d``
whose output divides its input) becomes the depthwise convolution it is: weights
``1 / (kh * kw)``, stride the pool's; a pool over the whole image (global average pooling)
becomes ``mean`` over height and width (as a convolution with a kernel that large, the Arm
lowering failed on some graphs: "Unsupported dtype torch.int16 for GREATER_EQUAL"). Why: the
int8 TOSA ``AVG_POOL2D`` that ExecuTorch 1.5.1's Arm backend writes comes back wrong from the VGF on
Vulkan here (ML emulation layer on lavapipe) for pools of 9 or more values and some of 8 (3x3,
2x5, 1x8, 3x4, 6x8; 2x2, 2x4, 4x2, 3x2, 1x7 are right): 3-8 dB from the quantized model, 254
steps off, a global average pool ahead of a classifier included. ``mean`` over the same values
is right. A depthwise convolution is what the backends lower everywhere; its result is the
average, requantized once.

``separate_pools_from_tables``: an average pool left as a pool (padding, ``ceil_mode``, an
adaptive pool whose output does not divide its input) that reads a ``sigmoid`` or ``tanh``
output reads it through an ``add`` of 0. Why: the Arm backend computes an int8
``sigmoid``/``tanh`` as a TOSA ``TABLE``, inserted late in its pass pipeline;
``RewriteAvgPool2dPass`` runs earlier and builds the pool's ``AVG_POOL2D`` with int8 zero
points, and when ``FuseConstantOpsPass`` re-traces the graph in between, the pool's input is
still the float ``sigmoid``: "TosaValueError: AVG_POOL2D requires input zero-point dtype
torch.int8 to match input dtype torch.float32" (the stock flow fails the same way). With the
``add`` (quantized like any add), the pool reads an int8 tensor from the start.

The quantized model changes with each rewrite (a convolution's rounding, one more requantize),
and the verdict judges the program against that model.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import operator_name, value_source

logger = logging.getLogger(__name__)

_TABLE_ACTIVATIONS: Final = frozenset(
    {"aten::sigmoid", "aten::tanh", "aten::sigmoid_", "aten::tanh_"}
)
_AVERAGE_POOLS: Final = frozenset(
    {"aten::avg_pool2d", "aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d"}
)


def _name(node: Node) -> str:
    name = operator_name(node.target) if node.op == "call_function" else ""
    return name.removesuffix(".default")


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int):
        return value[0], value[0]
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


def _pool_window(node: Node, shape: torch.Size) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(kernel, stride) of a pool that is a plain depthwise average (no padding, no ceil mode,
    no divisor override; an adaptive pool whose output divides its input), else ``None``."""
    height, width = int(shape[-2]), int(shape[-1])
    if _name(node) == "aten::avg_pool2d":
        args = list(node.args) + [None] * (7 - len(node.args))
        kernel = _pair(args[1] if args[1] is not None else node.kwargs.get("kernel_size"))
        stride_arg = args[2] if args[2] is not None else node.kwargs.get("stride")
        stride = kernel if stride_arg in (None, [], ()) else _pair(stride_arg)
        padding = _pair(args[3] if args[3] is not None else node.kwargs.get("padding", 0))
        ceil_mode = args[4] if args[4] is not None else node.kwargs.get("ceil_mode", False)
        divisor = args[6] if args[6] is not None else node.kwargs.get("divisor_override")
        if kernel is None or stride is None or padding != (0, 0) or ceil_mode or divisor:
            return None
        return kernel, stride
    size = _pair(node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size"))
    if size is None or 0 in size or height % size[0] or width % size[1]:
        return None
    kernel = (height // size[0], width // size[1])
    return kernel, kernel


def _free_name(module: GraphModule, base: str) -> str:
    name, k = base, 0
    while hasattr(module, name):
        k += 1
        name = f"{base}_{k}"
    return name


def _replace(module: GraphModule, node: Node, target: Any, args: tuple[Any, ...]) -> None:
    """``node`` replaced by a call of ``target`` on ``args``, with its value and source line."""
    with module.graph.inserting_before(node):
        new = module.graph.call_function(target, args)
    new.meta.update({k: node.meta[k] for k in ("val", "stack_trace") if k in node.meta})
    node.replace_all_uses_with(new)
    module.graph.erase_node(node)


def average_pools_as_convs(module: GraphModule) -> list[str]:
    """Replaces each plain average pool of a 4-D float tensor by its depthwise convolution
    (see the module's docstring). Returns the names of the pools; the module is recompiled
    when there are any."""
    replaced: list[str] = []
    for node in list(module.graph.nodes):
        if _name(node) not in _AVERAGE_POOLS or not node.args:
            continue
        source = node.args[0]
        value = source.meta.get("val") if isinstance(source, Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 4:
            continue
        if not value.dtype.is_floating_point:
            continue
        window = _pool_window(node, value.shape)
        if window is None:
            continue
        (kh, kw), stride = window
        if (kh, kw) == tuple(int(d) for d in value.shape[-2:]):
            _replace(module, node, torch.ops.aten.mean.dim, (source, [-2, -1], True))  # global
        else:
            channels = int(value.shape[1])
            weight = torch.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=value.dtype)
            name = _free_name(module, f"_etkit_average_{node.name}")
            module.register_buffer(name, weight)
            with module.graph.inserting_before(node):
                weight_node = module.graph.get_attr(name)
            conv_args = (source, weight_node, None, list(stride), [0, 0], [1, 1], channels)
            _replace(module, node, torch.ops.aten.conv2d.default, conv_args)
        replaced.append(node.name)
    if replaced:
        logger.info("average pools as depthwise convolutions: %s", ", ".join(replaced))
        module.graph.lint()
        module.recompile()
    return replaced


def _reads_table_activation(node: Node) -> bool:
    """Whether ``node``'s first input is a sigmoid/tanh output, directly or through ops that
    only move values."""
    source = node.args[0] if node.args else None
    return isinstance(source, Node) and _name(value_source(source)[0]) in _TABLE_ACTIVATIONS


def separate_pools_from_tables(module: GraphModule) -> list[str]:
    """Inserts ``add(x, 0.0)`` in front of each average pool whose input is a ``sigmoid`` or
    ``tanh`` output (see the module's docstring). Returns the names of the pools; the module
    is recompiled when there are any."""
    separated: list[str] = []
    for node in list(module.graph.nodes):
        if _name(node) not in _AVERAGE_POOLS or not _reads_table_activation(node):
            continue
        source = node.args[0]
        assert isinstance(source, Node)
        with module.graph.inserting_before(node):
            add = module.graph.call_function(torch.ops.aten.add.Tensor, (source, 0.0))
        if "val" in source.meta:
            add.meta["val"] = source.meta["val"]
        add.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_input_with(source, add)
        separated.append(node.name)
    if separated:
        logger.info("average pools reading sigmoid/tanh through an add of 0: %s", separated)
        module.graph.lint()
        module.recompile()
    return separated


def vgf_average_pools(module: GraphModule) -> list[str]:
    """Both rewrites, in order: plain pools become convolutions, the rest read a table
    activation through an add. Returns the names of the pools changed."""
    return average_pools_as_convs(module) + separate_pools_from_tables(module)
