"""Every operator a lowered program runs in float, where it runs and why.

Found in the edge program as lowered (before ``to_executorch``), in the graph each delegate was
given (``LoweredBackendModule.original_module``: the partition with its quantize and dequantize
nodes, as the backend received it) and outside the delegates. An operator computes in integers
when each of its floating-point inputs is the output of a dequantize and each of its uses is a
quantize (the pattern every integer backend fuses), allowing for an activation fused after it
(``conv -> relu -> quantize``) or before it; anything else that reads or writes a
floating-point tensor computes in float. For VGF the count is cross-checked against the TOSA
intermediates (``tosa_float_ops``: operators reading FP32 tensors).

Why each is float:

- "coordinate arithmetic": the boundary quantizer kept it in float (``grid_math="float"``: the
  elementwise and shape ops between the last compute-heavy op and a grid sampler's grid input);
- "user choice": a float boundary or grid sampler, ``grid_math`` or quantization off;
- "unsupported by the backend": the base quantizer or the backend left it float.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_exporter.vgf.tosa import tosa_float_ops
from etkit_quant.boundary import COORDINATE_ARITHMETIC, USER_CHOICE, float_reason
from etkit_quant.gather_positions import is_index_gather
from etkit_quant.graph import compute_kind, target_name

UNSUPPORTED: Final = "unsupported by the backend"
HEAVY_KINDS: Final = frozenset({"conv", "linear", "matmul"})
"""The kinds of operator that earn a warning when they run in float."""

_QDQ: Final = re.compile(r"quantized_decomposed::(de)?quantize_per_(tensor|channel)|choose_qparams")
# Activations that backends fuse into the op before them (its output quantized after them).
_FUSED_ACTIVATIONS: Final = frozenset(
    {"aten::relu", "aten::relu_", "aten::hardtanh", "aten::clamp", "aten::relu6"}
)
# Nodes that compute nothing: tuple access, memory planning, delegate calls.
_NOT_OPS: Final = ("executorch_call_delegate", "alloc", "getitem")


@dataclass(frozen=True)
class FloatOp:
    """One operator that runs in float: ``op`` (``aten::convolution``), ``node`` (its name in
    the lowered program), ``where`` (the delegate's backend, or ``"portable"`` for ExecuTorch's
    CPU kernels outside the delegates), ``kind`` (``graph.compute_kind``: conv, linear, ...;
    ``None`` for elementwise and shape ops), ``reason`` and ``source`` (``file:line: code`` of
    the model line it comes from, when known)."""

    op: str
    node: str
    where: str
    kind: str | None
    reason: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _name(node: Node) -> str:
    return target_name(node).removesuffix(".default")


def _is_qdq(node: Node) -> bool:
    return bool(_QDQ.search(target_name(node)))


def _is_dequantize(node: Node) -> bool:
    return "dequantize_per_" in target_name(node)


def _is_quantize(node: Node) -> bool:
    name = target_name(node)
    return "quantize_per_" in name and "dequantize" not in name


def _is_float(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _tensor_values(node: Node) -> list[object]:
    value = node.meta.get("val")
    return list(value) if isinstance(value, list | tuple) else [value]


def _is_op(node: Node) -> bool:
    if node.op != "call_function" or _is_qdq(node):
        return False
    text = str(node.target)
    return bool(target_name(node)) and not any(word in text for word in _NOT_OPS)


def _computes_in_float(node: Node, constants: set[Node]) -> bool:
    """Whether ``node`` (an operator of a graph with quantize/dequantize nodes) computes in
    float: see the module docstring. ``constants``: the graph's parameters, buffers and
    constants (a float bias that the backend quantizes itself, as XNNPACK does)."""
    float_inputs = _float_inputs(node)
    float_output = any(_is_float(v) for v in _tensor_values(node))
    if not float_inputs and not float_output:
        return False  # integer (or boolean) in and out: index arithmetic, not data
    return not (_inputs_integer(node, float_inputs, constants) and _output_integer(node))


def _inputs_integer(node: Node, float_inputs: list[Node], constants: set[Node]) -> bool:
    for source in float_inputs:
        if _is_dequantize(source) or source in constants or source.op == "get_attr":
            continue
        # the op before a fused activation: conv -> relu, relu reads the conv's accumulator
        fused = _name(node) in _FUSED_ACTIVATIONS and len(source.users) == 1
        if fused and _is_op(source) and _inputs_integer(source, _float_inputs(source), constants):
            continue
        return False
    return True


def _float_inputs(node: Node) -> list[Node]:
    return [a for a in node.all_input_nodes if _is_float(a.meta.get("val"))]


def _output_integer(node: Node) -> bool:
    if not node.users:
        return not any(_is_float(v) for v in _tensor_values(node))
    for user in node.users:
        if _is_quantize(user):
            continue
        if _name(user) in _FUSED_ACTIVATIONS and len(node.users) == 1 and _output_integer(user):
            continue
        return False
    return True


_FRAME: Final = re.compile(r'File "([^"]+)", line (\d+)')


def source_line(node: Node) -> str:
    """``file:line: code`` of the innermost frame of ``node``'s stack trace outside torch and
    ExecuTorch (the model's own line), or ``""``."""
    trace = node.meta.get("stack_trace")
    if not isinstance(trace, str):
        return ""
    lines = trace.strip().splitlines()
    found = ""
    for k, line in enumerate(lines):
        match = _FRAME.search(line)
        if not match:
            continue
        path = match.group(1)
        if any(part in path for part in ("/torch/", "/executorch/", "/torchao/", "<eval_with")):
            continue
        code = lines[k + 1].strip() if k + 1 < len(lines) else ""
        found = f"{Path(path).name}:{match.group(2)}: {code}"
    return found


def _reason(node: Node, quantized: bool, grid_math: str) -> str:
    recorded = float_reason(node)
    if not quantized:
        return USER_CHOICE
    if recorded == COORDINATE_ARITHMETIC:
        return COORDINATE_ARITHMETIC if grid_math == "float" else UNSUPPORTED
    if recorded is not None:
        return recorded
    return UNSUPPORTED


def _constants(program: ExportedProgram) -> set[Node]:
    signature = program.graph_signature
    names = {
        *signature.inputs_to_parameters,
        *signature.inputs_to_buffers,
        *signature.inputs_to_lifted_tensor_constants,
    }
    return {n for n in program.graph.nodes if n.op == "placeholder" and n.name in names}


def _scan(program: ExportedProgram, where: str, quantized: bool, grid_math: str) -> list[FloatOp]:
    found = []
    constants = _constants(program)
    for node in program.graph.nodes:
        if not _is_op(node) or not _computes_in_float(node, constants):
            continue
        found.append(
            FloatOp(
                op=_name(node),
                node=node.name,
                where=where,
                kind=compute_kind(node),
                reason=_reason(node, quantized, grid_math),
                source=source_line(node),
            )
        )
    return found


def float_ops(
    program: ExportedProgram, *, quantized: bool = True, grid_math: str = "float"
) -> list[FloatOp]:
    """Every operator ``program`` (an edge program after ``to_backend``, before
    ``to_executorch``) runs in float: inside each delegate (in the graph the backend was
    given), then outside them. ``quantized``: whether the export quantized at all (if not,
    every op is float by the user's choice)."""
    found: list[FloatOp] = []
    for graph_program, where in _graphs(program):
        found += _scan(graph_program, where, quantized, grid_math)
    return found


def _graphs(program: ExportedProgram) -> list[tuple[ExportedProgram, str]]:
    """Each delegate's graph as its backend received it, with where it runs (``"XnnpackBackend
    (lowered_module_0)"``), then ``program`` itself (``"portable"``: the ops outside)."""
    graph_module = program.graph_module
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("lowered_module"):
            delegate = getattr(graph_module, str(node.target))
            found.append((delegate.original_module, f"{delegate.backend_id} ({node.target})"))
    return [*found, (program, "portable")]


INDEX_GATHER_NOTE: Final = (
    "a warp written as index gathers stays gathers with integer indices; its positions and "
    "weights are coordinate arithmetic (float); it is not rewritten into grid_sample"
)


def index_gathers(program: ExportedProgram) -> list[dict[str, Any]]:
    """Every index gather (``aten.index.Tensor``, ``gather``, ``index_select``: a warp written
    as gathers, the Model Gym's nearest and Catmull-Rom ``DenseWarp``) ``program`` runs:
    ``op``, ``node``, ``where`` (as ``float_ops``), ``values`` (the dtype of the values it
    gathers, through a dequantize: ``int8`` when it moves quantized pixels), ``in_float``
    (whether it computes in float: outside the delegates ExecuTorch's portable kernel moves the
    dequantized values; inside one, between a dequantize and a quantize, the backend moves the
    integers) and ``source``."""
    found: list[dict[str, Any]] = []
    for graph_program, where in _graphs(program):
        constants = _constants(graph_program)
        for node in graph_program.graph.nodes:
            if not is_index_gather(node) or not isinstance(node.args[0], Node):
                continue
            read = node.args[0]
            if _is_dequantize(read) and isinstance(read.args[0], Node):
                read = read.args[0]
            value = read.meta.get("val")
            found.append(
                {
                    "op": _name(node),
                    "node": node.name,
                    "where": where,
                    "values": str(getattr(value, "dtype", "?")).removeprefix("torch."),
                    "in_float": where == "portable" or _computes_in_float(node, constants),
                    "source": source_line(node),
                }
            )
    return found


def summary(ops: list[FloatOp]) -> str:
    """The one-line console summary: ``"3 ops run in float: add x1, mul x2 (coordinate
    arithmetic)"``, or ``"no op runs in float"``."""
    if not ops:
        return "no op runs in float"
    by_reason: dict[str, Counter[str]] = {}
    for op in ops:
        by_reason.setdefault(op.reason, Counter())[op.op.removeprefix("aten::")] += 1
    parts = [
        ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) + f" ({reason})"
        for reason, counts in by_reason.items()
    ]
    noun = "op runs" if len(ops) == 1 else "ops run"
    return f"{len(ops)} {noun} in float: " + "; ".join(parts)


def heavy_warnings(ops: list[FloatOp]) -> list[str]:
    """One warning line per conv, linear or matmul that runs in float."""
    return [
        f"a {op.kind} runs in float ({op.op}, node {op.node} in {op.where}; {op.reason})"
        + (f" at {op.source}" if op.source else "")
        for op in ops
        if op.kind in HEAVY_KINDS
    ]


def report_section(
    program: ExportedProgram,
    *,
    quantized: bool,
    grid_math: str,
    intermediates: Path | None = None,
) -> dict[str, Any]:
    """report.json's ``float_ops``: ``ops`` (one record per float op), ``summary``,
    ``warnings``, ``index_gathers`` (where the program has any: ``index_gathers`` and what
    became of them, ``note``), and for VGF ``tosa`` (per TOSA intermediate, the float-reading
    operators by kind)."""
    ops = float_ops(program, quantized=quantized, grid_math=grid_math)
    section: dict[str, Any] = {
        "grid_math": grid_math,
        "ops": [op.as_dict() for op in ops],
        "summary": summary(ops),
        "warnings": heavy_warnings(ops),
    }
    gathers = index_gathers(program)
    if gathers:
        section["index_gathers"] = {"gathers": gathers, "note": INDEX_GATHER_NOTE}
    if intermediates is not None:
        tosa = {
            path.name: dict(sorted(tosa_float_ops(path).items()))
            for path in sorted(intermediates.glob("*.tosa"))
        }
        if tosa:
            section["tosa"] = tosa
    return section


def markdown(section: dict[str, Any] | None) -> list[str]:
    """report.md's "Float ops" section."""
    if not section:
        return []
    lines = ["", "## Float ops", "", section["summary"] + ".", ""]
    if section["ops"]:
        lines += ["| op | node | where | source line | why float |", "|---|---|---|---|---|"]
        for op in section["ops"]:
            source = op["source"].replace("|", "\\|")
            lines.append(
                f"| {op['op']} | {op['node']} | {op['where']} | {source} | {op['reason']} |"
            )
    entering = section.get("coordinate_inputs")
    if entering and entering.get("inputs"):
        lines += [
            "",
            f"Tensors entering the coordinate arithmetic ({', '.join(entering['inputs'])}): "
            f"{entering['qspec']} ({entering['why']}).",
        ]
    gathers = section.get("index_gathers")
    if gathers:
        places = Counter(
            f"{g['op']} of {g['values']} values in {g['where']}"
            + (" (dequantized: in float)" if g["in_float"] else "")
            for g in gathers["gathers"]
        )
        text = "; ".join(f"{place} x{n}" for place, n in places.items())
        lines += ["", f"Index gathers: {text}: {gathers['note']}."]
    for warning in section.get("warnings", []):
        lines += ["", f"**Warning**: {warning}."]
    for name, counts in section.get("tosa", {}).items():
        text = ", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"
        lines += ["", f"TOSA `{name}`: operators reading float tensors: {text}."]
    return lines
