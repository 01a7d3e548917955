"""``requantize_shared_inputs``: ops that backends compute on the integers themselves (a
``cat``, a reshape, a max-pool) read every input in their output's quantization parameters.

A quantized graph can hold such an op between dequantizes and a quantize with different
parameters: a ``cat`` of a frame's features (scale 1/127) and a flow (scale 0.00293), when the
quantizer ties the ``cat``'s inputs together but one input's parameters are fixed elsewhere (a
boundary, a coordinate input). PyTorch computes it in float, so the quantized model is right.
ExecuTorch 1.5.1's Arm backend folds the dequantizes into the op and concatenates the int8
values as they are (TOSA ``CONCAT``, no ``RESCALE``): the flow's integers are read at 1/127,
2.7 times too large, and RAFT's second flow update came out 27 dB from the quantized model.

The rewrite inserts, on each such input, a quantize to the output's parameters and its
dequantize. The ops in ``SHARED_PARAMETER_OPS`` move, select or order values and nothing else
(``relu``, ``max_pool2d``, the clamps and the max and min reductions included: quantization is
monotonic, so it commutes with a maximum and with a clamp whose bounds are quantized too, and
maps 0 to the zero point; a reflect, replicate or circular pad, a nearest resize and a
``where`` too; for an op returning several tensors, ``split`` or
``max(dim)``, each float result is quantized and the indices are not),
so quantizing before them gives exactly what quantizing after gives: the quantized model's
values do not change (tested for equality), and the backend sees a plain requantize
(``dq -> q``, a TOSA ``RESCALE``) in front of an op whose inputs and output agree.

``INTERPOLATING_OPS`` (a bilinear resize) are not exact so: the op mixes values, and quantizing
its input in the output's parameters adds one rounding before it. ExecuTorch 1.5.1's Arm
backend (``backends/arm/_passes/rewrite_upsample.py``) lowers an int8 bilinear upsample to a
TOSA ``RESIZE`` of the int8 input and a ``RESCALE`` by ``1 / (scale_y * scale_x)`` with both
zero points 0: it reads the input's integers in the output's parameters. With an input of
another scale or zero point (a conv's output and a calibrated model output, as fuzz seed 6302
had) the VGF was biased +7 steps; with the requantize in front (``interpolations=True``, what
etkit-quant does on an Arm base) the quantized model rounds once more, as the program does,
and they agree within rounding.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import is_dequantize, is_quantize, operator_name

logger = logging.getLogger(__name__)

# ATen ops whose integer result is the integer input moved, selected or ordered (in the
# output's parameters): what a backend lowers without a rescale.
SHARED_PARAMETER_OPS: Final = frozenset(
    {
        "aten::cat",
        "aten::concat",
        "aten::concatenate",
        "aten::stack",
        "aten::view",
        "aten::reshape",
        "aten::_unsafe_view",
        "aten::flatten",
        "aten::permute",
        "aten::transpose",
        "aten::t",
        "aten::squeeze",
        "aten::unsqueeze",
        "aten::expand",
        "aten::repeat",
        "aten::slice",
        "aten::select",
        "aten::narrow",
        "aten::clone",
        "aten::contiguous",
        "aten::pixel_shuffle",
        "aten::pixel_unshuffle",
        "aten::max_pool2d",
        "aten::relu",
        "aten::pad",  # F.pad's reflect, replicate and circular modes (constant: constant_pad_nd)
        "aten::reflection_pad1d",
        "aten::reflection_pad2d",
        "aten::replication_pad1d",
        "aten::replication_pad2d",
        "aten::circular_pad2d",
        "aten::upsample_nearest2d",
        "aten::flip",
        "aten::roll",
        "aten::clamp",
        "aten::clamp_min",
        "aten::clamp_max",
        "aten::hardtanh",
        "aten::amax",
        "aten::amin",
        "aten::max",
        "aten::min",
        "aten::where",
        "aten::index_select",
        "aten::gather",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::unbind",
        "aten::neg",  # in the negated parameters (see _negated)
    }
)
# ATen ops that a backend computes on the integers of their input in their output's parameters,
# mixing values (so a requantize in front changes the result by a rounding): Arm's int8 RESIZE.
INTERPOLATING_OPS: Final = frozenset({"aten::upsample_bilinear2d"})
_PER_TENSOR_ARGS: Final = 5  # scale, zero_point, quant_min, quant_max, dtype


def per_tensor_parameters(node: Node) -> tuple[Any, ...] | None:
    """The (scale, zero point, min, max, dtype) of a per-tensor quantize or dequantize node."""
    if "per_tensor" not in operator_name(node.target):
        return None
    params = tuple(node.args[1 : 1 + _PER_TENSOR_ARGS])
    if len(params) != _PER_TENSOR_ARGS or not all(
        isinstance(p, (int, float, torch.dtype)) for p in params
    ):
        return None  # parameters held in tensors: not compared here
    return params


def same_parameters(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two ``per_tensor_parameters`` tuples are the same (scales compared as floats)."""
    return a[1:] == b[1:] and float(a[0]) == float(b[0])


def base_op_name(node: Node) -> str:
    """``"aten::view"`` for ``aten.view.default`` and the edge dialect's ``aten.view_copy``."""
    return operator_name(node.target).split(".")[0].removesuffix("_copy")


def _tensor_inputs(node: Node) -> list[Node]:
    inputs: list[Node] = []
    for arg in node.args:
        candidates = arg if isinstance(arg, (list, tuple)) else [arg]
        inputs.extend(a for a in candidates if isinstance(a, Node) and a not in inputs)
    return inputs


def _output_quantizes(node: Node) -> list[Node] | None:
    """The quantize nodes reading ``node``'s float results: its users, or for an op returning
    several tensors (``split``, ``max(dim)``) the users of each ``getitem`` of a float result (an
    integer result, the indices, is not quantized); ``None`` when some float result is read by
    anything else."""
    users = list(node.users)
    if users and all(u.op == "call_function" and u.target is operator.getitem for u in users):
        quantizes: list[Node] = []
        for item in users:
            value = item.meta.get("val")
            if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
                continue
            if not item.users or not all(is_quantize(u) for u in item.users):
                return None
            quantizes.extend(item.users)
        return quantizes or None
    return users if users and all(is_quantize(u) for u in users) else None


def _pad_mode(node: Node) -> object:
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")


def _negated(out: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The parameters in which a ``neg`` reads its input so that a backend's integer negation,
    ``-(q - zero_in) + zero_out`` with no scale (TOSA ``NEGATE``, as ExecuTorch 1.5.1's Arm
    backend lowers an int8 ``neg``), gives exactly the quantize of ``-x`` in ``out``: the
    output's scale, and a range the negation maps into ``out``'s (zero point
    ``type_max - zero_out + min_out``, range ``[type_max - (max_out - min_out), type_max]``).
    Quantizing ``x`` so and negating is exact (round half to even is odd-symmetric). ``None``
    when that does not fit the integer type."""
    scale, zero, low, high, dtype = out
    if not isinstance(dtype, torch.dtype) or dtype.is_floating_point:
        return None
    info = torch.iinfo(dtype)
    negated_zero, negated_low = info.max - zero + low, info.max - (high - low)
    if not info.min <= negated_zero <= info.max or negated_low < info.min:
        return None
    return (scale, negated_zero, negated_low, info.max, dtype)


def requantize_shared_inputs(model: GraphModule, *, interpolations: bool = False) -> list[str]:
    """Inserts ``quantize``/``dequantize`` in the output's parameters before each input of an op
    of ``SHARED_PARAMETER_OPS`` (and, with ``interpolations``, of ``INTERPOLATING_OPS``: for a
    backend that computes them on the integers, Arm's) that is dequantized with other
    parameters, where every user of the op quantizes its output with one set of parameters.
    Returns the names of the ops whose inputs were requantized; the graph is recompiled when
    there are any. The values of the model do not change, except by one rounding in front of
    each interpolating op requantized."""
    ops = SHARED_PARAMETER_OPS | INTERPOLATING_OPS if interpolations else SHARED_PARAMETER_OPS
    rewritten: list[str] = []
    for node in list(model.graph.nodes):
        name = base_op_name(node) if node.op == "call_function" else ""
        if name not in ops:
            continue
        if name == "aten::pad" and _pad_mode(node) == "constant":
            continue  # XNNPACK's partitions then formed a cycle around DetagQuantizedPads
        users = _output_quantizes(node)
        if users is None:
            continue
        outputs = [per_tensor_parameters(u) for u in users]
        out = outputs[0]
        if out is None or not all(o is not None and same_parameters(o, out) for o in outputs):
            continue
        wanted = _negated(out) if name == "aten::neg" else out
        if wanted is None:
            continue
        changed = False
        for source in _tensor_inputs(node):
            params = per_tensor_parameters(source) if is_dequantize(source) else None
            if params is None or same_parameters(params, wanted):
                continue
            quantize, dequantize = users[0].target, source.target
            assert callable(quantize) and callable(dequantize)  # call_function nodes
            with model.graph.inserting_before(node):
                q = model.graph.call_function(quantize, (source, *wanted))
                dq = model.graph.call_function(dequantize, (q, *wanted))
            if "val" in source.meta:
                dq.meta["val"] = source.meta["val"]
            q.meta["stack_trace"] = dq.meta["stack_trace"] = node.meta.get("stack_trace")
            node.replace_input_with(source, dq)
            changed = True
        if changed:
            rewritten.append(node.name)
    if rewritten:
        logger.info("requantized inputs to their output's parameters: %s", ", ".join(rewritten))
        model.graph.lint()
        model.recompile()
    return rewritten
