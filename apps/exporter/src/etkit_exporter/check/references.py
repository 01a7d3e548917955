"""The reference values an export's program is compared with: every node's value in the
ETRecord's quantized graph and in its float model, run on the record's representative inputs."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch.utils import _pytree as pytree

from etkit_exporter.artifact.etrecord import REFERENCE_GRAPH
from etkit_exporter.core.errors import InspectError

QDQ_OPS: Final = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
               "dequantize_per_channel")  # fmt: skip


class _Capture(torch.fx.Interpreter):
    """Records call_function nodes' values by name: every one, or those named in ``keep``. A
    node named in ``overrides`` passes on the given value (the program's) after recording its
    own, so that each node downstream is computed from the program's values. With ``needed``
    (node names), only those nodes are computed (the rest are ``None``)."""

    def __init__(
        self,
        module: torch.fx.GraphModule,
        overrides: Mapping[str, Any] | None = None,
        keep: Collection[str] | None = None,
        needed: Collection[str] | None = None,
    ) -> None:
        super().__init__(module)
        self.values: dict[str, Any] = {}
        self.overrides = overrides or {}
        self.keep = None if keep is None else set(keep)
        self.needed = None if needed is None else set(needed)

    def run_node(self, n: torch.fx.Node) -> Any:
        if self.needed is not None and n.op == "call_function" and n.name not in self.needed:
            return None
        value = super().run_node(n)
        if n.op == "call_function" and (self.keep is None or n.name in self.keep):
            self.values[n.name] = value
        given = self.overrides.get(n.name)
        if (
            isinstance(given, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and given.numel() == value.numel()
        ):
            return given.reshape(value.shape).to(value.dtype)
        return value


def capture(
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    overrides: Mapping[str, Any] | None = None,
    *,
    keep: Collection[str] | None = None,
    needed: Collection[str] | None = None,
) -> dict[str, Any]:
    """The values (by name) of ``module``'s call_function nodes run on ``inputs``: every one, or
    those in ``keep`` (the rest freed as the run goes, as eager PyTorch frees them); only the
    nodes in ``needed`` computed when given; ``overrides`` passed on (``_Capture``)."""
    recorder = _Capture(module, overrides, keep, needed)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.values


def reference_program(record: Any) -> tuple[Any, list[torch.Tensor]]:
    """The ETRecord's quantized graph (the reference) and its representative inputs."""
    inputs = list(record._representative_inputs or [])
    if not inputs:
        raise InspectError("the ETRecord has no representative inputs; export again")
    graph_map = record.graph_map or {}
    return graph_map.get(REFERENCE_GRAPH, record.edge_dialect_program), inputs


def output_names(module: torch.fx.GraphModule) -> list[str | None]:
    """The name of the node each graph output is (``None`` for an output that is no node's
    value)."""
    output = next(n for n in module.graph.nodes if n.op == "output")
    leaves = pytree.tree_leaves(output.args[0])
    return [leaf.name if isinstance(leaf, torch.fx.Node) else None for leaf in leaves]


def _root(node: torch.fx.Node) -> tuple[str, int] | None:
    """The node of the first graph ``node`` came from (the model as Dynamo traced it)."""
    sources = node.meta.get("from_node")
    if not sources:
        return None
    source = sources[-1]
    while source.from_node:
        source = source.from_node[-1]
    return (source.name, source.graph_id)


def _is_qdq(node: torch.fx.Node) -> bool:
    return any(q in str(node.target) for q in QDQ_OPS)


def _float_counterparts(graph: torch.fx.Graph) -> set[str]:
    """The nodes whose value is that of the float model's node they came from: of the nodes
    with one origin (an operator and what it was decomposed into, with its quantize and
    dequantize), the last that is not a quantize or dequantize, and the quantize and dequantize
    nodes after it (its value quantized); all of a group that is only quantize and dequantize
    (an input's)."""
    groups: dict[tuple[str, int], list[torch.fx.Node]] = {}
    for node in graph.nodes:
        root = _root(node) if node.op == "call_function" else None
        if root is not None:
            groups.setdefault(root, []).append(node)
    eligible: set[str] = set()
    for nodes in groups.values():
        last = max((k for k, n in enumerate(nodes) if not _is_qdq(n)), default=-1)
        eligible.update(n.name for n in nodes[max(last, 0) :])
    return eligible


@dataclass
class References:
    quantized: dict[str, Any]
    nodes: dict[str, torch.fx.Node]
    float_values: dict[str, Any]
    float_by_root: dict[tuple[str, int], list[str]]
    float_counterparts: set[str] = field(default_factory=set)

    def float_candidates(self, name: str) -> list[torch.Tensor]:
        node = self.nodes.get(name)
        root = _root(node) if node is not None else None
        if root is None or name not in self.float_counterparts:
            return []
        values = [self.float_values.get(n) for n in self.float_by_root.get(root, [])]
        return [v for v in values if isinstance(v, torch.Tensor)]


def reference_values(record: Any) -> References:
    """Every node's value in the ETRecord's quantized graph and in its float model, run on the
    record's representative inputs (``etkit inspect``: it shows any node)."""
    reference, inputs = reference_program(record)
    graph_map = record.graph_map or {}
    module = reference.module()
    quantized = capture(module, inputs)
    nodes = {n.name: n for n in module.graph.nodes}
    float_values: dict[str, Any] = {}
    float_by_root: dict[tuple[str, int], list[str]] = {}
    float_program = graph_map.get("float_model/forward")
    if float_program is not None:
        float_module = float_program.module()
        float_values = capture(float_module, inputs)
        for node in float_module.graph.nodes:
            root = _root(node) if node.op == "call_function" else None
            if root is not None:
                float_by_root.setdefault(root, []).append(node.name)
    counterparts = _float_counterparts(module.graph)
    return References(quantized, nodes, float_values, float_by_root, counterparts)


def quantize_qparams(node: torch.fx.Node | None) -> tuple[float, int] | None:
    """Scale and zero point of a per-tensor quantize node."""
    if node is None or "quantize_per_tensor" not in str(node.target):
        return None
    if "dequantize" in str(node.target):
        return None
    scale, zero_point = node.args[1], node.args[2]
    if isinstance(scale, (int, float)) and isinstance(zero_point, int):
        return float(scale), zero_point
    return None
