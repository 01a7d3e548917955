"""etkit in Model Explorer (etkit_exporter.model_explorer): an export of the resample demo (two
grid samplers, nearest/zeros/align_corners and bilinear/reflection, then a VGF delegate) loads
through the adapter's convert API with each grid-sampler node carrying its blob's parameters
(mode, padding, align_corners, quantization, shapes) and each VGF node its backend and size;
the per-node data files hold, per delegate node, the verification's time and error. That export
keeps the samplers in etkit's own delegate (``sampler_delegate=True``); flow-warp's default
export, its sampler inside the VGF, has one VGF delegate node only.

The adapter tests need Model Explorer (``pip install 'etkit-exporter[model-explorer]'``); the
upstream-builder ones also Arm's ``pte-adapter-model-explorer``. The node-data tests need
neither."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from etkit_exporter import ExportResult, export_model
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.model_explorer import (
    ADAPTER_ID,
    DB_FILE,
    MS_FILE,
    NODE_DATA_FILE,
    STEPS_FILE,
    convert_pte,
    delegate_call_sites,
    upstream_available,
    write_node_data,
)
from etkit_gridsampler.delegate_format import decode
from etkit_gridsampler.op import QParams
from etkit_pterunner import PteProgram


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


HAS_MODEL_EXPLORER = _importable("model_explorer")
needs_model_explorer = pytest.mark.skipif(
    not HAS_MODEL_EXPLORER,
    reason="Model Explorer is not installed (pip install 'etkit-exporter[model-explorer]')",
)
BUILDERS = [
    "etkit",
    pytest.param(
        "upstream",
        marks=pytest.mark.skipif(
            not HAS_MODEL_EXPLORER or not upstream_available(),
            reason="Arm's pte-adapter-model-explorer is not installed",
        ),
    ),
]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """The split path (samplers in etkit's own delegate): the grid-sampler delegate nodes and
    their per-call rows are this module's subject."""
    model, inputs = DEMOS["resample"]()
    root = tmp_path_factory.mktemp("model-explorer") / "resample"
    return export_model(
        model, inputs, artifacts_root=root, target="vgf", verify=True, sampler_delegate=True
    )


@pytest.fixture(scope="module")
def one_vgf(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """The default VGF export of flow-warp: its sampler a compute segment inside the one VGF."""
    model, inputs = DEMOS["flow-warp"]()
    root = tmp_path_factory.mktemp("model-explorer") / "flow-warp-one-vgf"
    return export_model(model, inputs, artifacts_root=root, target="vgf", verify=True)


@pytest.fixture(scope="module")
def float_export(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    model, inputs = DEMOS["resample"]()
    root = tmp_path_factory.mktemp("model-explorer") / "resample-float"
    return export_model(
        model, inputs, artifacts_root=root, target="vgf", enable_pt2e_quantization=False
    )


def _nodes(graphs: dict[str, Any], graph_id: str = "forward") -> dict[str, Any]:
    """Node id -> node of the graph ``graph_id`` of the first collection (dataclasses or the
    JSON form the server sends)."""
    collection = graphs["graphCollections"][0]
    graph_list = collection["graphs"] if isinstance(collection, dict) else collection.graphs
    for graph in graph_list:
        gid = graph["id"] if isinstance(graph, dict) else graph.id
        if gid == graph_id:
            nodes = graph["nodes"] if isinstance(graph, dict) else graph.nodes
            return {(n["id"] if isinstance(n, dict) else n.id): n for n in nodes}
    raise AssertionError(f"no graph {graph_id}")


def _attrs(node: Any) -> dict[str, str]:
    if isinstance(node, dict):
        return {a["key"]: a["value"] for a in node["attrs"]}
    return {a.key: a.value for a in node.attrs}


def _check_qparams(attrs: dict[str, str], role: str, qparams: QParams | None) -> None:
    if qparams is None:
        assert attrs[f"{role}.dtype"] == "float32"
        assert f"{role}.scale" not in attrs
        return
    assert attrs[f"{role}.dtype"] == str(qparams.dtype).removeprefix("torch.")
    assert float(attrs[f"{role}.scale"].split()[0]) == qparams.scale
    assert int(attrs[f"{role}.zero_point"]) == qparams.zero_point
    assert attrs[f"{role}.range"] == f"[{qparams.quant_min}, {qparams.quant_max}]"


def _check_delegate_nodes(pte: Path, graphs: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """Every delegate node's etkit attributes against the program: the grid samplers' against
    their decoded blobs. Returns (mode, align_corners, padding) of each grid sampler."""
    method = PteProgram.load(pte).method("forward")
    nodes = _nodes(graphs)
    samplers = []
    for site in delegate_call_sites(method):
        attrs = _attrs(nodes[site.node_id])
        assert attrs["backend"] == site.delegate.backend_id
        assert attrs["delegate.size"] == f"{site.delegate.size} bytes"
        if site.delegate.backend_id != "GridSamplerBackend":
            assert "mode" not in attrs
            continue
        blob = decode(site.delegate.processed)
        op = blob.op
        assert attrs["mode"] == op.mode
        assert attrs["padding_mode"] == op.padding_mode
        assert attrs["align_corners"] == str(op.align_corners)
        _check_qparams(attrs, "image", op.image)
        _check_qparams(attrs, "grid", op.grid)
        _check_qparams(attrs, "output", op.output)
        n, c, _, _ = blob.image_shape
        _, ho, wo, _ = blob.grid_shape
        assert attrs["image.shape"] == str(list(blob.image_shape))
        assert attrs["grid.shape"] == str(list(blob.grid_shape))
        assert attrs["output.shape"] == str([n, c, ho, wo])
        samplers.append((op.mode, op.align_corners, op.padding_mode))
    return samplers


def _label(node: Any) -> str:
    return str(node["label"] if isinstance(node, dict) else node.label)


@needs_model_explorer
@pytest.mark.parametrize("builder", BUILDERS)
def test_grid_sampler_nodes_carry_their_blob(export: ExportResult, builder: str) -> None:
    graphs = convert_pte(export.pte_path, builder=builder)  # type: ignore[arg-type]
    samplers = _check_delegate_nodes(export.pte_path, graphs)
    # The demo's two samplers, as the model wrote them.
    assert sorted(samplers) == [("bilinear", False, "reflection"), ("nearest", True, "zeros")]
    nodes = _nodes(graphs)
    method = PteProgram.load(export.pte_path).method("forward")
    for site in delegate_call_sites(method):
        node = nodes[site.node_id]
        assert _label(node) == site.delegate.backend_id
        if site.delegate.backend_id == "GridSamplerBackend":
            attrs = _attrs(node)
            # VGF exports alias images as channels-last textures; grids stay [N, H, W, 2].
            assert attrs["image.dim_order"] == "[0, 2, 3, 1]"
            assert attrs["grid.dim_order"] == "[0, 1, 2, 3]"
            assert attrs["image.scale"].endswith("(1/127)")


@needs_model_explorer
@pytest.mark.parametrize("builder", BUILDERS)
def test_vgf_delegates_have_their_vgf_graph(export: ExportResult, builder: str) -> None:
    if builder == "etkit" and not _importable("vgf_adapter_model_explorer"):
        pytest.skip("vgf-adapter-model-explorer is not installed")
    graphs = convert_pte(export.pte_path, builder=builder)  # type: ignore[arg-type]
    nodes = _nodes(graphs)
    collections = graphs["graphCollections"]
    assert [c.label for c in collections] == ["model.pte", "delegates"]
    delegate_graph_ids = {g.id for g in collections[1].graphs}
    vgf = [n for n in nodes.values() if _label(n) == "VgfBackend"]
    assert vgf
    for node in vgf:
        assert node.subgraphIds == [f"model.pte::{node.id}"]
        assert node.subgraphIds[0] in delegate_graph_ids


@needs_model_explorer
def test_etkit_builder_draws_what_upstream_draws(export: ExportResult) -> None:
    if not upstream_available():
        pytest.skip("Arm's pte-adapter-model-explorer is not installed")
    ours = convert_pte(export.pte_path, builder="etkit")
    theirs = convert_pte(export.pte_path, builder="upstream")
    assert [g.id for g in ours["graphCollections"][0].graphs] == [
        g.id for g in theirs["graphCollections"][0].graphs
    ]

    def edges(graphs: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
        return {
            node_id: sorted((e.sourceNodeId, e.sourceNodeOutputId) for e in node.incomingEdges)
            for node_id, node in _nodes(graphs).items()
        }

    assert edges(ours) == edges(theirs)
    assert {k: _label(n) for k, n in _nodes(ours).items()} == {
        k: _label(n) for k, n in _nodes(theirs).items()
    }


@needs_model_explorer
def test_adapter_registers_and_converts_as_the_server_does(export: ExportResult) -> None:
    """What ``model-explorer --extensions=etkit_exporter.model_explorer`` does: import
    ``<extension>.main``, find the registered adapter for ``.pte``, call ``convert`` and turn the
    result into the JSON the web app reads."""
    main = importlib.import_module("etkit_exporter.model_explorer.main")
    processor = importlib.import_module("model_explorer.extension_class_processor")
    utils = importlib.import_module("model_explorer.utils")
    registry = processor.ExtensionClassProcessor.get_registry()
    entry = registry["etkit_exporter.model_explorer.main.EtkitPteAdapter"]
    assert entry["type"] == "adapter"
    assert entry["metadata"].id == ADAPTER_ID
    assert entry["metadata"].fileExts == ["pte"]
    result = main.EtkitPteAdapter().convert(str(export.pte_path), {})
    sent = json.loads(json.dumps(utils.convert_adapter_response(result)))
    _check_delegate_nodes(export.pte_path, sent)


@needs_model_explorer
def test_float_grid_sampler_node(float_export: ExportResult) -> None:
    graphs = convert_pte(float_export.pte_path, builder="etkit")
    samplers = _check_delegate_nodes(float_export.pte_path, graphs)
    assert len(samplers) == 2
    method = PteProgram.load(float_export.pte_path).method("forward")
    for site in delegate_call_sites(method):
        if site.delegate.backend_id == "GridSamplerBackend":
            attrs = _attrs(_nodes(graphs)[site.node_id])
            assert [attrs[f"{r}.dtype"] for r in ("image", "grid", "output")] == ["float32"] * 3


def _verification(export: ExportResult) -> dict[str, Any]:
    report = json.loads((export.pte_path.parent / "report.json").read_text())
    return dict(report["verification"])


def test_node_data_has_each_delegate_time_and_error(export: ExportResult) -> None:
    folder = export.pte_path.parent
    path = write_node_data(folder)
    assert path == folder / NODE_DATA_FILE
    verification = _verification(export)
    rows = {(r.get("chain", 0), r["instruction"]): r for r in verification["delegates"]}
    method = PteProgram.load(export.pte_path).method("forward")
    sites = list(delegate_call_sites(method))
    assert len(rows) == len(sites) == 3
    quantized = {
        c["output"]: c
        for c in verification["comparisons"]
        if c["reference"] == "quantized PT2E model"
    }
    writes = {
        site.node_id: [k for k, v in enumerate(method.outputs) if v in site.instruction.args]
        for site in sites
    }

    def results(name: str) -> dict[str, Any]:
        data = json.loads((folder / name).read_text())
        assert list(data) == ["forward"]
        return dict(data["forward"]["results"])

    summary, ms, steps = results(NODE_DATA_FILE), results(MS_FILE), results(STEPS_FILE)
    db = results(DB_FILE)
    assert set(summary) == set(ms) == set(steps) == {s.node_id for s in sites}
    for site in sites:
        row = rows[(site.chain, site.instruction.position)]
        text = summary[site.node_id]["value"]
        assert text.startswith(f"{row['seconds'] * 1000:.3f} ms")
        assert ms[site.node_id]["value"] == round(row["seconds"] * 1000, 6)
        outputs = writes[site.node_id]
        for k in outputs:
            assert f"output {k}: " in text
        if site.delegate.backend_id == "GridSamplerBackend":
            assert steps[site.node_id]["value"] == row["max_steps_vs_ideal"]
            assert f"{row['max_steps_vs_ideal']} step" in text
        else:
            assert outputs, "the resample demo's VGF delegate writes output 0"
            assert steps[site.node_id]["value"] == max(quantized[k]["max_steps"] for k in outputs)
        measured = [quantized[k]["psnr_db"] for k in outputs if quantized[k]["psnr_db"]]
        if measured:
            assert db[site.node_id]["value"] == round(min(measured), 4)
        else:
            assert site.node_id not in db
        worst = max(
            [row.get("max_steps_vs_ideal", 0)] + [quantized[k]["max_steps"] for k in outputs]
        )
        assert summary[site.node_id]["bgColor"] == ("#c8e6c9" if worst == 0 else "#fff59d")


def test_node_data_of_vgf_delegates_holding_the_samplers(one_vgf: ExportResult) -> None:
    """With the sampler inside the VGF the one delegate node is the VGF's, carrying its call's
    time and the worst error of the program output it writes; no per-sampler row."""
    folder = one_vgf.pte_path.parent
    write_node_data(folder)
    verification = _verification(one_vgf)
    method = PteProgram.load(one_vgf.pte_path).method("forward")
    sites = list(delegate_call_sites(method))
    assert [s.delegate.backend_id for s in sites] == ["VgfBackend"]
    rows = {(r.get("chain", 0), r["instruction"]): r for r in verification["delegates"]}
    assert len(rows) == len(sites)
    assert all("max_steps_vs_ideal" not in r for r in rows.values()), rows
    quantized = {
        c["output"]: c
        for c in verification["comparisons"]
        if c["reference"] == "quantized PT2E model"
    }
    steps = json.loads((folder / STEPS_FILE).read_text())["forward"]["results"]
    text = json.loads((folder / NODE_DATA_FILE).read_text())["forward"]["results"]
    written = []
    for site in sites:
        row = rows[(site.chain, site.instruction.position)]
        outputs = [k for k, v in enumerate(method.outputs) if v in site.instruction.args]
        written += outputs
        assert steps[site.node_id]["value"] == max(quantized[k]["max_steps"] for k in outputs)
        assert text[site.node_id]["value"].startswith(f"{row['seconds'] * 1000:.3f} ms")
    assert written == [0]  # the demo's one output


@needs_model_explorer
def test_node_data_is_model_explorers_format(export: ExportResult) -> None:
    builder = importlib.import_module("model_explorer.node_data_builder")
    folder = export.pte_path.parent
    write_node_data(folder)
    for name in (NODE_DATA_FILE, MS_FILE, STEPS_FILE, DB_FILE):
        for graph_id, data in json.loads((folder / name).read_text()).items():
            assert graph_id == "forward"
            graph = builder.GraphNodeData(
                results={k: builder.NodeDataResult(**v) for k, v in data.pop("results").items()},
                thresholds=[builder.ThresholdItem(**t) for t in data.pop("thresholds", [])],
                gradient=[builder.GradientItem(**g) for g in data.pop("gradient", [])],
            )
            assert not data, f"{name}: fields Model Explorer does not know: {list(data)}"
            model = builder.ModelNodeData(graphsData={graph_id: graph})
            assert json.loads(model.to_json_string())[graph_id]["results"]


def test_node_data_needs_a_verification(export: ExportResult, tmp_path: Path) -> None:
    shutil.copy(export.pte_path, tmp_path / "model.pte")
    (tmp_path / "report.json").write_text(json.dumps({"target": "vgf"}))
    with pytest.raises(ValueError, match="holds no verification"):
        write_node_data(tmp_path)
    path = write_node_data(tmp_path, verification={"comparisons": [], "delegates": []})
    assert json.loads(path.read_text()) == {"forward": {"results": {}}}
    assert not (tmp_path / MS_FILE).exists()
