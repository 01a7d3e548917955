"""Model Explorer graphs of an etkit ``.pte``: Arm's ``.pte`` adapter's graph when it is installed,
else etkit's own drawing of the same instructions, with each delegate node enriched by
``attributes.delegate_attributes`` (the grid sampler's mode, padding, align_corners,
quantization and shapes; every delegate's backend id and size).

Model Explorer and its adapters have no type information; they are imported here with
``importlib`` on first use, so that this package type-checks and imports without them."""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from etkit_exporter.core.backend_ids import VGF_BACKEND
from etkit_exporter.model_explorer.attributes import (
    delegate_call_sites,
    method_delegate_attributes,
    node_id,
)
from etkit_pterunner import ListInfo, MethodInfo, PteProgram, ScalarInfo, TensorInfo, dtype_name

Builder = Literal["auto", "upstream", "etkit"]
BUILDERS: tuple[Builder, ...] = ("auto", "upstream", "etkit")

GRAPH_INPUTS = "GraphInputs"
GRAPH_OUTPUTS = "GraphOutputs"


def _module(name: str) -> Any:
    return importlib.import_module(name)


def _graph_builder() -> Any:
    try:
        return _module("model_explorer.graph_builder")
    except ImportError as error:
        raise ImportError(
            "Model Explorer is not installed: pip install 'etkit-exporter[model-explorer]' "
            "(ai-edge-model-explorer)"
        ) from error


def upstream_available() -> bool:
    """Whether Arm's ``.pte`` adapter (``pte-adapter-model-explorer``) imports."""
    try:
        _module("pte_adapter_model_explorer.builder.builder")
    except Exception:  # it may fail on any import-time error of its own dependencies
        return False
    return True


def convert_pte(
    model_path: str | Path, settings: Mapping[str, Any] | None = None, *, builder: Builder = "auto"
) -> dict[str, Any]:
    """The ``ModelExplorerGraphs`` (``{"graphCollections": [...]}``) of the ``.pte`` at
    ``model_path``. ``builder``: ``"upstream"`` draws the graph with Arm's ``.pte`` adapter
    (``pte-adapter-model-explorer``: VGF delegates with their VGF subgraphs), ``"etkit"`` with
    etkit's own builder (same node ids and layout; VGF subgraphs when
    ``vgf-adapter-model-explorer`` is installed), ``"auto"`` the first when it imports. Either
    way each delegate node gets etkit's attributes. Raises ``PteFormatError`` (a
    ``ValueError``) for a file that is not an etkit-readable ``.pte``."""
    if builder not in BUILDERS:
        raise ValueError(f"builder must be one of {', '.join(BUILDERS)}, got {builder!r}")
    path = Path(model_path)
    program = PteProgram.load(path)
    use_upstream = builder == "upstream" or (builder == "auto" and upstream_available())
    if use_upstream:
        collections = _upstream_collections(path, dict(settings or {}))
    else:
        collections = _EtkitGraphBuilder(path, program, dict(settings or {})).collections()
    _enrich(collections, program)
    return {"graphCollections": collections}


def _upstream_collections(path: Path, settings: dict[str, Any]) -> list[Any]:
    builder = _module("pte_adapter_model_explorer.builder.builder")
    return list(builder.PteGraphBuilder(path, settings).graph_collections)


def _enrich(collections: list[Any], program: PteProgram) -> None:
    """Adds etkit's attributes to every delegate node of every method's graph."""
    gb = _graph_builder()
    by_method = {
        name: method_delegate_attributes(program.method(name)) for name in program.method_names
    }
    for collection in collections:
        for graph in collection.graphs:
            attributes = by_method.get(graph.id)
            if not attributes:
                continue
            for node in graph.nodes:
                extra = attributes.get(node.id)
                if extra is None:
                    continue
                # etkit's first: the side panel lists attributes in this order.
                node.attrs = [gb.KeyValue(key=k, value=v) for k, v in extra] + list(node.attrs)


def _tensor_attrs(info: TensorInfo) -> list[tuple[str, str]]:
    dtype = dtype_name(info.dtype) if info.dtype is not None else info.scalar_type
    return [
        ("dtype", dtype),
        ("shape", "[" + ", ".join(str(s) for s in info.sizes) + "]"),
        ("dim_order", "[" + ", ".join(str(d) for d in info.dim_order) + "]"),
        ("storage", info.storage),
    ]


class _EtkitGraphBuilder:
    """Draws a program as the upstream ``.pte`` adapter does: per method a graph with a
    ``GraphInputs`` node, a node per instruction (``{method}_{chain}_{position}``, labelled by
    operator name or backend id, in the method's namespace), a ``GraphOutputs`` node; edges from
    the instruction that first writes a value to those that read it; VGF delegates with their VGF
    graph as a subgraph (in a ``delegates`` collection) when ``vgf-adapter-model-explorer``
    imports."""

    def __init__(self, path: Path, program: PteProgram, settings: dict[str, Any]) -> None:
        self.gb = _graph_builder()
        self.path = path
        self.program = program
        self.settings = settings
        self.delegate_graphs: list[Any] = []

    def collections(self) -> list[Any]:
        gb = self.gb
        graphs = [self._graph(self.program.method(name)) for name in self.program.method_names]
        collections = [gb.GraphCollection(label=self.path.name, graphs=graphs)]
        if self.delegate_graphs:
            collections.append(gb.GraphCollection(label="delegates", graphs=self.delegate_graphs))
        return collections

    def _metadata(self, method: MethodInfo, index: int) -> Any:
        gb = self.gb
        value = method.values[index]
        attrs = [("EValue Index", str(index))]
        if isinstance(value, TensorInfo):
            attrs += _tensor_attrs(value)
        elif isinstance(value, ScalarInfo | ListInfo):
            attrs.append(("value", value.describe()))
        return gb.MetadataItem(id=str(index), attrs=[gb.KeyValue(key=k, value=v) for k, v in attrs])

    def _graph(self, method: MethodInfo) -> Any:
        gb = self.gb
        producers: dict[int, str] = dict.fromkeys(method.inputs, GRAPH_INPUTS)
        nodes = [
            gb.GraphNode(
                id=GRAPH_INPUTS,
                label="Graph Inputs",
                namespace="GraphInputs",
                outputsMetadata=[self._metadata(method, i) for i in method.inputs],
            )
        ]
        vgf_calls = {site.node_id: site for site in delegate_call_sites(method)}
        for chain_index, chain in enumerate(method.chains):
            for instruction in chain:
                nid = node_id(method.name, chain_index, instruction.position)
                if instruction.kind == "kernel":
                    label = method.operators[instruction.operator]
                    kind, indices = "KernelCall", instruction.args
                elif instruction.kind == "delegate":
                    label = method.delegates[instruction.delegate].backend_id
                    kind, indices = "DelegateCall", instruction.args
                elif instruction.kind == "move":
                    label = kind = "MoveCall"
                    indices = (instruction.move_from, instruction.move_to)
                elif instruction.kind == "jump_false":
                    label = kind = "JumpFalseCall"
                    indices = (instruction.condition,)
                else:
                    label = kind = "FreeCall"
                    indices = (instruction.value,)
                edges, inputs, outputs = [], [], []
                for index in dict.fromkeys(indices):
                    value = method.values[index]
                    writable = isinstance(value, TensorInfo) and value.storage in (
                        "planned",
                        "unplanned",
                    )
                    if index in producers:
                        edges.append(
                            gb.IncomingEdge(
                                sourceNodeId=producers[index],
                                sourceNodeOutputId=str(index),
                                targetNodeInputId=str(index),
                            )
                        )
                        inputs.append(self._metadata(method, index))
                    elif writable and instruction.kind in ("kernel", "delegate", "move"):
                        producers[index] = nid
                        outputs.append(self._metadata(method, index))
                    else:
                        inputs.append(self._metadata(method, index))
                attrs = [("Instruction Type", kind), ("args", str(list(indices)))]
                node = gb.GraphNode(
                    id=nid,
                    label=label,
                    namespace=method.name,
                    attrs=[gb.KeyValue(key=k, value=v) for k, v in attrs],
                    incomingEdges=edges,
                    inputsMetadata=inputs,
                    outputsMetadata=outputs,
                )
                site = vgf_calls.get(nid)
                if site is not None and site.delegate.backend_id == VGF_BACKEND:
                    subgraph = self._vgf_graph(site.delegate.processed)
                    if subgraph is not None:
                        subgraph.id = f"{self.path.name}::{nid}"
                        node.subgraphIds.append(subgraph.id)
                        self.delegate_graphs.append(subgraph)
                nodes.append(node)
        nodes.append(
            gb.GraphNode(
                id=GRAPH_OUTPUTS,
                label="Graph Outputs",
                namespace="GraphOutputs",
                incomingEdges=[
                    gb.IncomingEdge(
                        sourceNodeId=producers[i],
                        sourceNodeOutputId=str(i),
                        targetNodeInputId=str(i),
                    )
                    for i in method.outputs
                    if i in producers
                ],
                inputsMetadata=[self._metadata(method, i) for i in method.outputs],
            )
        )
        return gb.Graph(id=method.name, nodes=nodes)

    def _vgf_graph(self, blob: bytes) -> Any | None:
        """The VGF adapter's graph of a VGF delegate blob, or None without the adapter."""
        try:
            vgf_main = _module("vgf_adapter_model_explorer.main")
        except Exception:
            return None
        with tempfile.TemporaryDirectory(prefix="etkit-me-") as folder:
            file = Path(folder) / "delegate.vgf"
            file.write_bytes(blob)
            result = vgf_main.VGFAdapter().convert(str(file), dict(self.settings))
        graphs = result.get("graphs")
        if graphs is None:
            collections = result.get("graphCollections") or []
            graphs = [g for c in collections for g in c.graphs]
        return graphs[0] if len(graphs) == 1 else None
