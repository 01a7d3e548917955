"""The quantization parameters of a program's inputs and outputs, as an engine needs them."""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from executorch.exir._serialize._program import deserialize_pte_binary
from torch.export import ExportedProgram

from etkit_partition import user_input_nodes, user_output_nodes

logger = logging.getLogger(__name__)

# Normalized-texture formats an engine can alias a quantized tensor as: (dtype, scale, zero
# point, min, max) -> (format, how a texel reads).
_TEXTURES = {
    ("int8", 1 / 127, 0, -127, 127): ("R8_SNORM", "value = q / 127"),
    ("uint8", 1 / 255, 0, 0, 255): ("R8_UNORM", "value = q / 255"),
    ("int16", 1 / 32767, 0, -32767, 32767): ("R16_SNORM", "value = q / 32767"),
    ("uint16", 1 / 65535, 0, 0, 65535): ("R16_UNORM", "value = q / 65535"),
}


_SCALAR_TYPE_CODES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 6: "float32"}


def _dtype_name(dtype: object) -> str:
    if isinstance(dtype, int):  # an ExecuTorch ScalarType code
        return _SCALAR_TYPE_CODES.get(dtype, str(dtype))
    text = str(dtype).split(":")[0].rsplit(".", 1)[-1].lower()
    return {"char": "int8", "byte": "uint8", "short": "int16", "float": "float32"}.get(text, text)


def texture_view(entry: dict[str, Any]) -> dict[str, str] | None:
    """The normalized-texture format a quantized tensor can be aliased as, or ``None``."""
    if entry.get("scale") is None:
        return None
    for (dtype, scale, zero, low, high), (fmt, reads) in _TEXTURES.items():
        if (
            entry["dtype"] == dtype
            and abs(entry["scale"] - scale) <= scale * 1e-6
            and (entry["zero_point"], entry["quant_min"], entry["quant_max"]) == (zero, low, high)
        ):
            return {"format": fmt, "reads": reads}
    return None


def _dim_order(node: torch.fx.Node, value: torch.Tensor) -> list[int]:
    """The dim order a node's tensor is serialized with: its tensor spec's (made by
    ``to_executorch``, what the emitter writes) where it has one, else its fake tensor's (which
    ``etkit_layout.pin_delegate_layouts`` makes the one ``to_executorch`` will compute)."""
    spec = node.meta.get("spec")
    order = getattr(spec, "dim_order", None)
    if order is not None and len(order) == value.dim():
        return [int(d) for d in order]
    return [int(d) for d in value.dim_order()]


def output_names(program: ExportedProgram) -> list[str]:
    """A name per user output: the keys of the dict (or the fields of the named tuple) the
    model returns, where it returns one of tensors; else ``output_0``, ``output_1``, ... (the
    graph's node names, ``getitem_2``, mean nothing to a caller)."""
    count = len(user_output_nodes(program))
    spec = program.call_spec.out_spec
    names: list[Any] = []
    if spec is not None and spec.num_leaves == count == spec.num_children:
        if spec.type is dict:
            names = list(spec.context)
        elif isinstance(spec.type, type) and issubclass(spec.type, tuple):
            names = list(getattr(spec.type, "_fields", ()))
    if len(names) == count and all(isinstance(n, str) and n for n in names):
        return [str(n) for n in names]
    return [f"output_{k}" for k in range(count)]


def io_table(program: ExportedProgram, extracted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per input and output: name (inputs: the forward's parameter; outputs: ``output_names``),
    index, shape, dim order, dtype, and for quantized ones scale,
    zero point, range and the texture view. ``extracted`` is what ``extract_io_quant_params``
    returned. The dim orders are the program's (see ``_dim_order``); ``with_pte_layouts`` puts
    in the ones a serialized program really has."""
    table: dict[str, Any] = {"inputs": [], "outputs": []}
    # extract_io_quant_params names input k after the k-th placeholder of the whole graph,
    # lifted constants included: key the entries by index instead.
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    outputs = [n.name for n in user_output_nodes(program)]
    by_index = {
        "inputs": {placeholders.index(k): v for k, v in extracted.get("inputs", {}).items()},
        # an output returned twice (a state's new value that is also the image) is each
        "outputs": {
            i: v
            for k, v in extracted.get("outputs", {}).items()
            for i, name in enumerate(outputs)
            if name == k
        },
    }
    names = {"outputs": output_names(program)}
    for kind, nodes in (
        ("inputs", user_input_nodes(program)),
        ("outputs", user_output_nodes(program)),
    ):
        for index, node in enumerate(nodes):
            value = node.meta.get("val")
            name = names[kind][index] if kind in names else node.name
            entry: dict[str, Any] = {"name": name, "index": index}
            if isinstance(value, torch.Tensor):
                lower, upper = _shape_bounds(value)
                entry["shape"] = upper  # a dynamic dimension: its upper bound, as planned
                if lower != upper:
                    entry["min_shape"] = lower
                entry["dim_order"] = _dim_order(node, value)
                entry["dtype"] = _dtype_name(value.dtype)
            params = by_index[kind].get(index)
            if params is None:
                entry.update(scale=None, zero_point=None, quant_min=None, quant_max=None)
            else:
                entry.update(
                    dtype=_dtype_name(params["dtype"]),
                    scale=float(params["scale"]),
                    zero_point=int(params["zero_point"]),
                    quant_min=int(params["quant_min"]),
                    quant_max=int(params["quant_max"]),
                )
            entry["texture"] = texture_view(entry)
            table[kind].append(entry)
    return table


def _shape_bounds(value: torch.Tensor) -> tuple[list[int], list[int]]:
    """The lower and upper bound of each dimension of ``value`` (a fake tensor whose sizes may be
    symbolic: ``torch.export`` dynamic dimensions; equal for a fixed size)."""
    from torch.utils._sympy.value_ranges import bound_sympy

    lower, upper = [], []
    for size in value.shape:
        if isinstance(size, int) or size.node.expr.is_number:
            lower.append(int(size))
            upper.append(int(size))
            continue
        bounds = bound_sympy(size.node.expr, dict(size.node.shape_env.var_to_range))
        lower.append(int(bounds.lower))
        upper.append(int(bounds.upper))
    return lower, upper


def pte_io_layouts(pte: bytes, method: str = "forward") -> dict[str, list[dict[str, Any] | None]]:
    """The shape and dim order of each input and output of ``method`` in a serialized program
    (``.pte`` bytes), as the runtime lays them out: ``{"inputs": [{"shape", "dim_order"} or
    None for a value that is not a tensor], "outputs": [...]}``."""

    plans = deserialize_pte_binary(pte).program.execution_plan
    plan = next((p for p in plans if p.name == method), None)
    if plan is None:
        names = ", ".join(p.name for p in plans)
        raise ValueError(f"the program has no method {method!r}; its methods: {names}")

    def layout(index: int) -> dict[str, Any] | None:
        tensor = plan.values[index].val
        if not hasattr(tensor, "dim_order") or not hasattr(tensor, "sizes"):
            return None
        return {
            "shape": [int(s) for s in tensor.sizes],
            "dim_order": [int(d) for d in tensor.dim_order],
        }

    return {
        "inputs": [layout(i) for i in plan.inputs],
        "outputs": [layout(i) for i in plan.outputs],
    }


def with_pte_layouts(table: dict[str, Any], pte: bytes, method: str = "forward") -> dict[str, Any]:
    """``table`` (from ``io_table``) with each input's and output's dim order read from the
    serialized program ``pte``, the layout a caller must give and will receive. A dim order that
    differs from the table's is logged as a warning (the program's metadata and its
    serialization disagree: a layout was lost on the way). Raises ``ValueError`` when the
    serialized ``method`` has other inputs or outputs (number or shapes) than the table."""
    layouts = pte_io_layouts(pte, method)
    result = copy.deepcopy(table)
    for kind in ("inputs", "outputs"):
        entries, found = result[kind], layouts[kind]
        if len(entries) != len(found):
            raise ValueError(
                f"the serialized program has {len(found)} {kind}, the IO table {len(entries)}"
            )
        for entry, layout in zip(entries, found, strict=True):
            if layout is None or "shape" not in entry:
                continue
            if layout["shape"] != entry["shape"]:
                raise ValueError(
                    f"{kind[:-1]} {entry['index']} ({entry['name']}) is {layout['shape']} in the "
                    f"serialized program, {entry['shape']} in the IO table"
                )
            if layout["dim_order"] != entry["dim_order"]:
                logger.warning(
                    "%s %d (%s): the program's metadata says dim order %s, the serialized "
                    "program has %s; reporting the serialized one",
                    kind[:-1],
                    entry["index"],
                    entry["name"],
                    entry["dim_order"],
                    layout["dim_order"],
                )
                entry["dim_order"] = layout["dim_order"]
    return result


_INTEGER_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16}


def program_input(value: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    """``value`` as the program takes the input ``entry`` describes (an io_quant_params.json
    entry): a float value of a quantized input quantized with its parameters (in float32, as
    the PT2E model's quantize computes), laid out in its dim order."""
    if entry.get("scale") is not None and value.dtype.is_floating_point:
        quantized = torch.round(value.float() / entry["scale"]) + entry["zero_point"]
        value = quantized.clamp(entry["quant_min"], entry["quant_max"]).to(
            _INTEGER_DTYPES[entry["dtype"]]
        )
    elif value.dtype == torch.float64:
        value = value.float()
    if entry.get("dim_order") == [0, 2, 3, 1] and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value.contiguous()


def float_output(value: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    """A program output as float: dequantized with ``entry``'s parameters when quantized."""
    if entry.get("scale") is None:
        return value.float()
    result: torch.Tensor = (value.float() - entry["zero_point"]) * float(entry["scale"])
    return result
