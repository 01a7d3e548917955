"""The quantization parameters of a program's inputs and outputs, as an engine needs them."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from etkit_partition import user_input_nodes, user_output_nodes

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


def io_table(program: ExportedProgram, extracted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per input and output: name, index, shape, dim order, dtype, and for quantized ones scale,
    zero point, range and the texture view. ``extracted`` is what ``extract_io_quant_params``
    returned."""
    table: dict[str, Any] = {"inputs": [], "outputs": []}
    # extract_io_quant_params names input k after the k-th placeholder of the whole graph,
    # lifted constants included: key the entries by index instead.
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    outputs = [n.name for n in user_output_nodes(program)]
    by_index = {
        "inputs": {placeholders.index(k): v for k, v in extracted.get("inputs", {}).items()},
        "outputs": {outputs.index(k): v for k, v in extracted.get("outputs", {}).items()},
    }
    for kind, nodes in (
        ("inputs", user_input_nodes(program)),
        ("outputs", user_output_nodes(program)),
    ):
        for index, node in enumerate(nodes):
            value = node.meta.get("val")
            entry: dict[str, Any] = {"name": node.name, "index": index}
            if isinstance(value, torch.Tensor):
                entry["shape"] = list(value.shape)
                entry["dim_order"] = list(value.dim_order())
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
