"""Inspect and profile: every export's ETRecord, the grid-sampler delegate's
debug-handle map, ``etkit run --etdump`` (an ETDump for ExecuTorch's Inspector, or a Chrome
trace of etkit's runner) and ``etkit inspect``, on real exports of the demos (one XNNPACK; one
VGF with the samplers inside, one with them in etkit's own delegate; shared by every test of
this module)."""

from __future__ import annotations

import itertools
import json
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etkit_exporter import export_model
from etkit_exporter.artifact.etrecord import build_paths_in, portable_stack_trace
from etkit_exporter.artifact.staging import foreign_content
from etkit_exporter.cli.main import main
from etkit_exporter.export.demos import DEMOS
from etkit_gridsampler.backend import DEBUG_EVENT_NAME

BUILD_ROOTS = (b"/work/", b"/tmp/", b"/home/", b"/root/")


def _export(root: Path, demo: str, target: str, **options: Any) -> Any:
    model, inputs = DEMOS[demo]()
    return export_model(
        model, inputs, artifacts_root=root / demo, target=target, verify=True, **options
    )


@pytest.fixture(scope="module")
def flow_xnnpack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """With the full ETRecord (the ATen program and the float model): etkit inspect's "vs float"."""
    return _export(
        tmp_path_factory.mktemp("inspect-xnnpack"), "flow-warp", "xnnpack", etrecord="full"
    )


@pytest.fixture(scope="module")
def flow_vgf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default VGF export: flow-warp's sampler a compute segment inside the one VGF."""
    return _export(tmp_path_factory.mktemp("inspect-vgf"), "flow-warp", "vgf")


@pytest.fixture(scope="module")
def resample_vgf_split(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The split path: the samplers in etkit's own delegate, then a VGF delegate."""
    return _export(
        tmp_path_factory.mktemp("inspect-vgf-split"), "resample", "vgf", sampler_delegate=True
    )


# the backends of each export's delegates
CALLS = {
    "flow_xnnpack": {"XnnpackBackend", "GridSamplerBackend"},
    "flow_vgf": {"VgfBackend"},
    "resample_vgf_split": {"GridSamplerBackend", "VgfBackend"},
}


def _record(result: Any) -> Any:
    from executorch.devtools.etrecord import parse_etrecord

    return parse_etrecord(str(result.artifacts_root / "etrecord.bin"))


def _save_inputs(result: Any, folder: Path) -> list[str]:
    args = []
    for k, value in enumerate(result.example_inputs):
        np.save(folder / f"in{k}.npy", value.numpy())
        args += ["--input", str(folder / f"in{k}.npy")]
    return args


@pytest.mark.parametrize("which", ["flow_xnnpack", "flow_vgf", "resample_vgf_split"])
def test_every_export_writes_an_etrecord_the_inspector_reads(
    which: str, request: pytest.FixtureRequest
) -> None:
    result = request.getfixturevalue(which)
    folder = result.artifacts_root
    manifest = json.loads((folder / "etkit-manifest.json").read_text())
    assert {"etrecord.bin", "etrecord.json"} <= set(manifest["files"])
    data = (folder / "etrecord.bin").read_bytes()
    assert len(data) > 10_000
    assert [root for root in BUILD_ROOTS if root in data] == []
    assert str(folder).encode() not in data and build_paths_in(data) == []

    record = _record(result)
    inputs = record._representative_inputs
    assert len(inputs) == len(result.example_inputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, result.example_inputs, strict=True))
    assert record.edge_dialect_program is not None
    # no state the graph does not read (the float weights PT2E folded into int8 constants)
    signature = record.edge_dialect_program.graph_signature
    read = {*signature.inputs_to_parameters.values(), *signature.inputs_to_buffers.values()}
    assert set(record.edge_dialect_program.state_dict) <= read
    # the ATen program and the float model only in a full record (flow_xnnpack's)
    full = which == "flow_xnnpack"
    assert (record.exported_program is not None) is full
    assert ("float_model/forward" in (record.graph_map or {})) is full
    # nothing twice: the example inputs once (representative_inputs), the reference graph once
    with zipfile.ZipFile(folder / "etrecord.bin") as members:
        copies = [i.filename for i in members.infolist() if i.filename.endswith("_example_inputs")]
        assert copies and all(members.getinfo(n).file_size == 0 for n in copies), copies
        # deflated: each program's graph (JSON) to under a fifth
        graph = members.getinfo("edge_dialect_exported_program/forward")
        assert graph.compress_type == zipfile.ZIP_DEFLATED
        assert graph.compress_size < graph.file_size / 5
    reference = json.loads((folder / "etrecord.json").read_text())["reference_graph"]
    if "edge_after_transform/forward" in record.graph_map:  # then not the edge program's twin
        assert reference == "edge_after_transform/forward"
    else:
        assert reference == "edge_dialect_exported_program"
    assert record._debug_handle_map["forward"] and record._delegate_map["forward"]
    # stack traces kept, their files named below the import root
    traces = [
        n.meta["stack_trace"]
        for n in record.edge_dialect_program.graph.nodes
        if n.meta.get("stack_trace")
    ]
    assert any('File "etkit_exporter/export/demos.py"' in t for t in traces)

    mapping = json.loads((folder / "etrecord.json").read_text())["instructions"]
    delegates = [v for v in mapping.values() if v["kind"] == "delegate"]
    assert {d["backend"] for d in delegates} == CALLS[which]
    assert all(None not in d["outputs"] for d in delegates)


def test_the_grid_sampler_delegate_maps_its_event_to_the_grid_sample_node(
    flow_xnnpack: Any,
) -> None:
    record = _record(flow_xnnpack)
    sampler_entries = [
        entry
        for entry in record._delegate_map["forward"].values()
        if entry["name"] == "GridSamplerBackend"
    ]
    assert len(sampler_entries) == 1
    (entry,) = sampler_entries
    assert list(entry["delegate_map"]) == [DEBUG_EVENT_NAME]
    (handle,) = entry["delegate_map"][DEBUG_EVENT_NAME]
    # the handle is the grid_sample node's (its quantize and dequantize share it: one origin)
    named = [
        n for n in record.edge_dialect_program.graph.nodes if n.meta.get("debug_handle") == handle
    ]
    samplers = [n.name for n in named if "grid_sampler_2d" in str(n.target)]
    assert samplers == ["aten_grid_sampler_2d_default"]
    assert all(n.name in samplers or "quantize_per_tensor" in str(n.target) for n in named)


def test_run_etdump_writes_an_etdump_the_inspector_reads(
    flow_xnnpack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from executorch.devtools import Inspector

    etdump = tmp_path / "run.etdp"
    args = _save_inputs(flow_xnnpack, tmp_path)
    status = main(["run", str(flow_xnnpack.pte_path), *args, "--out", str(tmp_path / "out"),
                   "--etdump", str(etdump)])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "ran in executorch.runtime" in printed and "ETDump (" in printed
    assert etdump.stat().st_size > 1000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inspector = Inspector(
            etdump_path=str(etdump),
            etrecord=str(flow_xnnpack.artifacts_root / "etrecord.bin"),
            debug_buffer_path=str(tmp_path / "run.etdp.debug"),
        )
    events = [e for block in inspector.event_blocks for e in block.events]
    # (33 since the flow net's convs run int8 inside the XNNPACK delegate, no longer as float
    # operators of their own; 50+ before)
    assert len(events) > 20
    sampler = [e for e in events if e.name == DEBUG_EVENT_NAME]
    assert len(sampler) == 1
    (event,) = sampler
    assert event.is_delegated_op and event.delegate_backend_name == "GridSamplerBackend"
    assert "aten.grid_sampler_2d.default" in event.op_types
    # its stack trace is the model's grid_sample line (the file named below the import root)
    traces = "".join(t or "" for t in event.stack_traces.values())
    assert 'File "etkit_exporter/export/demos.py"' in traces and "F.grid_sample(" in traces
    assert event.perf_data is not None and event.perf_data.avg > 0
    # the event logs the delegate's int8 output, the program's own (identical to the call's)
    (logged,) = event.debug_data
    assert logged.dtype == torch.int8 and list(logged.shape) == [1, 3, 32, 48]  # RGB on a CPU
    mapping = json.loads((flow_xnnpack.artifacts_root / "etrecord.json").read_text())
    delegates = [v for v in mapping["instructions"].values() if v["kind"] == "delegate"]
    assert sum(e.name == "DELEGATE_CALL" for e in events) == len(delegates)
    output = np.load(tmp_path / "out" / "output_0.npy")
    assert output.dtype == np.int8 and output.shape == (1, 3, 32, 48)


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("flow_vgf", ["VgfBackend"]),  # the sampler inside the one VGF
        ("resample_vgf_split", ["GridSamplerBackend", "GridSamplerBackend", "VgfBackend"]),
    ],
)
def test_run_etdump_of_a_vgf_export_writes_a_chrome_trace(
    which: str,
    expected: list[str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    export = request.getfixturevalue(which)
    args = _save_inputs(export, tmp_path)
    status = main(["run", str(export.pte_path), *args, "--out", str(tmp_path / "out"),
                   "--etdump", str(tmp_path / "profile.etdp")])  # fmt: skip
    assert status == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    assert not (tmp_path / "profile.etdp").exists()
    trace = json.loads((tmp_path / "profile.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    (method,) = [e for e in slices if e["cat"] == "method"]
    calls = [e for e in slices if e["cat"] == "delegate"]
    assert [e["args"]["backend"] for e in calls] == expected
    assert [e["name"] for e in calls][-1] == f"VgfBackend (delegate {len(expected) - 1})"
    assert [e["args"]["instruction"] for e in calls] == list(range(len(expected)))
    for before, after in itertools.pairwise(calls):
        assert before["ts"] + before["dur"] <= after["ts"]
    assert all(e["dur"] > 0 for e in calls)
    assert calls[-1]["ts"] + calls[-1]["dur"] <= method["ts"] + method["dur"]
    assert {"pid", "tid", "name", "ts", "dur", "args"} <= set(calls[0])


def test_inspect_prints_the_table_and_writes_it_into_the_report(
    flow_xnnpack: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = flow_xnnpack.artifacts_root
    assert main(["inspect", str(folder)]) == 0
    printed = capsys.readouterr().out
    sampler_lines = [line for line in printed.splitlines() if DEBUG_EVENT_NAME in line]
    assert any(
        "GridSamplerBackend" in line and "aten_grid_sampler_2d_default" in line and " dB" in line
        for line in sampler_lines
    ), printed
    report = json.loads((folder / "report.json").read_text())
    inspection = report["inspect"]
    # the share of the instructions' time spent in kernels outside every delegate
    outside = inspection["outside_delegates"]
    top = [r for r in inspection["rows"] if r["depth"] == 0]
    kernels = [r for r in top if r["backend"] == "kernel"]
    assert outside["ms"] == pytest.approx(sum(r["ms"] for r in top), abs=1e-2)
    # every full-size op of the demo runs in a delegate (the grid's quantize in the sampler's):
    # what is left outside is a layout copy or nothing (the share's arithmetic on rows with
    # kernels: test_the_share_outside_delegates_counts_the_kernels)
    assert outside["outside_ms"] == pytest.approx(sum(r["ms"] for r in kernels), abs=1e-2)
    assert 0 <= outside["share"] < 0.05, outside
    assert "quantize" not in " ".join(r["event"] for r in kernels)
    assert "time outside delegates: " in printed
    (row,) = [r for r in inspection["rows"] if r["event"] == DEBUG_EVENT_NAME]
    assert row["backend"] == "GridSamplerBackend" and row["ms"] > 0
    assert row["node"] == "aten_grid_sampler_2d_default"
    assert row["vs_quantized"]["max_steps"] <= 1 and row["vs_quantized"]["psnr_db"] > 60
    assert 40 < row["vs_float"]["psnr_db"] < 80
    # the program's output: the same figures as the end-to-end verification
    comparisons = {c["reference"]: c for c in report["verification"]["comparisons"]}
    (output,) = inspection["outputs"]
    assert output["vs_quantized_psnr_db"] == pytest.approx(
        comparisons["quantized PT2E model"]["psnr_db"], abs=0.01
    )
    assert output["vs_float_psnr_db"] == pytest.approx(
        comparisons["float model"]["psnr_db"], abs=0.01
    )
    # so is the last delegate's row, whose output is the program's
    last = [r for r in inspection["rows"] if r["event"] == "DELEGATE_CALL"][-1]
    assert last["vs_quantized"]["psnr_db"] == pytest.approx(
        output["vs_quantized_psnr_db"], abs=0.01
    )
    # upstream's numeric gap compares the program's int8 with float: etkit's rows do not
    assert any(
        g.get("runtime_dtype") == "int8" and g.get("aot_dtype") == "float32"
        for g in inspection["upstream_numeric_gap"]
    )
    assert "## Inspection" in (folder / "report.md").read_text()
    assert foreign_content(folder) == []  # the manifest lists the rewritten report


def test_the_share_outside_delegates_counts_the_kernels() -> None:
    """Instructions' rows (depth 0) count, events inside a delegate call (depth 1) do not; the
    kernels' time over all instructions', the slowest kernels first; nothing timed: None."""
    from etkit_exporter.check.inspection import Row, outside_delegates

    rows = [
        Row(0, "DELEGATE_CALL", "XnnpackBackend", "", 6.0),
        Row(0, "Convolution (NHWC, QS8)", "", "", 5.5, depth=1),
        Row(1, "native_call_quantize_per_tensor.out", "kernel", "", 1.5),
        Row(2, "DELEGATE_CALL", "GridSamplerBackend", "", 2.0),
        Row(3, "native_call__to_dim_order_copy.out", "kernel", "", 0.5),
        Row(4, "native_call_full.out", "kernel", "", None),
    ]
    figures = outside_delegates(rows, slowest=1)
    assert figures == {
        "ms": 10.0,
        "outside_ms": 2.0,
        "share": 0.2,
        "slowest": [["native_call_quantize_per_tensor.out", 1.5]],
    }
    assert outside_delegates(rows[:2])["outside_ms"] == 0.0  # type: ignore[index]
    assert outside_delegates([rows[1], rows[5]]) is None


def test_inspect_of_a_vgf_export_uses_the_runner_and_the_verification(
    flow_vgf: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sampler inside the one VGF: one row, the VGF call's, none per sampler."""
    folder = flow_vgf.artifacts_root
    assert main(["inspect", str(folder), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "executorch.runtime cannot run" in printed and "etkit's Python runner" in printed
    # the default slim record has no float model: said, and no float figure made up
    assert "no float model" in printed and "--etrecord full" in printed
    assert "vs the float model" not in printed
    assert "inspect" not in json.loads((folder / "report.json").read_text())
    assert main(["inspect", str(folder), "--no-report", "--json"]) == 0
    inspection = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in inspection["rows"]] == ["VgfBackend"]
    assert all(r["ms"] > 0 and r["vs_ideal"] is None for r in inspection["rows"])
    assert all(r["vs_quantized"]["max_steps"] <= 1 for r in inspection["rows"])
    assert len(inspection["outputs"]) == 1


def test_inspect_of_a_split_vgf_export_holds_each_sampler_call_to_its_ideal(
    resample_vgf_split: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Split path: a row per grid-sampler call, compared with the contract's ideal."""
    folder = resample_vgf_split.artifacts_root
    assert main(["inspect", str(folder), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "executorch.runtime cannot run" in printed and "etkit's Python runner" in printed
    assert "inspect" not in json.loads((folder / "report.json").read_text())
    assert main(["inspect", str(folder), "--no-report", "--json"]) == 0
    inspection = json.loads(capsys.readouterr().out)
    samplers = [r for r in inspection["rows"] if r["backend"] == "GridSamplerBackend"]
    assert len(samplers) == 2
    assert sorted(r["vs_ideal"]["mode"] for r in samplers) == ["bilinear", "nearest"]
    for row in samplers:
        assert row["vs_ideal"]["max_steps_vs_ideal"] <= 1 and row["ms"] > 0
        assert row["vs_quantized"]["max_steps"] <= 1
    assert [r["backend"] for r in inspection["rows"]][-1] == "VgfBackend"
    assert len(inspection["outputs"]) == 2


def test_inspect_refuses_a_folder_that_is_not_an_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no model.pte" in err and len(err.strip().splitlines()) == 1


def test_stack_trace_paths_are_cut_below_the_import_root() -> None:
    trace = (
        'File "/work/x/src/pkg/model.py", line 3, in forward\n'
        'File "/opt/elsewhere/thing.py", line 9, in f\n'
        'File "<string>", line 1'
    )
    portable = portable_stack_trace(trace, roots=["/work/x/src"])
    assert portable == (
        'File "pkg/model.py", line 3, in forward\nFile "thing.py", line 9, in f\n'
        'File "<string>", line 1'
    )
    assert build_paths_in(b"... /work/x ...") and not build_paths_in(portable.encode())
    # a short folder counts where a name in it follows; binary data holds it by chance
    assert build_paths_in(b"\x00/tmp/etkit-new-1\x00") == ["/tmp", "/tmp/"]
    assert build_paths_in(b"\x07/tmp\x91\x00/root\xff/work/\x00") == []
    assert build_paths_in(b"\x07/some/folder/long\x91", ["/some/folder/long"])
