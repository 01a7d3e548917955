"""Failures name their cause: the innermost error and failing pass of a real pass-manager chain,
the runtime's own log line when a real program fails to load, reproducible programs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge
from torch.fx.passes.infra.pass_base import PassBase, PassResult
from torch.fx.passes.infra.pass_manager import PassManager

from etkit_exporter import ExportError, export_model
from etkit_exporter.artifact.staging import MEASURED
from etkit_exporter.check.verify import verify_run
from etkit_exporter.core.diagnostics import advice, capture_native_log, root_cause
from etkit_exporter.export.demos import DEMOS


class FirstPass(PassBase):
    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        return PassResult(graph_module, False)


class InsertSomethingPass(PassBase):
    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        raise ValueError("Expected two input qparams, got: {1: QuantArgs(scale=0.1)}")


def test_root_cause_names_the_innermost_error_and_pass() -> None:
    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    manager = PassManager(passes=[FirstPass(), InsertSomethingPass()])
    with pytest.raises(Exception) as caught:
        try:
            manager(graph)
        except Exception as error:
            raise RuntimeError("error 0x1") from error
    line = root_cause(caught.value)
    assert line.startswith("ValueError in pass InsertSomethingPass: Expected two input qparams")
    assert "\n" not in line


def test_capture_native_log_sees_what_cpp_writes() -> None:
    script = (
        "import ctypes, sys\n"
        "from etkit_exporter.core.diagnostics import capture_native_log\n"
        "libc = ctypes.CDLL(None)\n"
        "with capture_native_log() as log:\n"
        "    libc.dprintf(2, b'[method.cpp:1] Failed to init\\n')\n"
        "print(log.errors)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "['Failed to init']" and "Failed to init" not in done.stderr


@pytest.fixture(scope="module")
def resample_export(tmp_path_factory: pytest.TempPathFactory) -> object:
    model, inputs = DEMOS["resample"]()
    root = tmp_path_factory.mktemp("diag") / "out"
    return export_model(model, inputs, artifacts_root=root, target="xnnpack")


def test_runtime_failure_carries_the_runtime_log_line(
    resample_export: object, tmp_path: Path
) -> None:
    result = resample_export
    blob_at = result.pte_path.read_bytes().index(b"ETGS")  # type: ignore[attr-defined]
    corrupt = bytearray(result.pte_path.read_bytes())  # type: ignore[attr-defined]
    corrupt[blob_at + 8] ^= 0x01  # the mode byte: the blob's checksum no longer holds
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(corrupt))
    model, inputs = DEMOS["resample"]()
    with pytest.raises(RuntimeError, match=r"the runtime said: .*grid-sampler delegate"):
        verify_run(
            bad,
            model,
            result.converted_model,  # type: ignore[attr-defined]
            inputs,
            result.io_quant_params,  # type: ignore[attr-defined]
        )
    with capture_native_log() as log:
        pass
    assert log.errors == []


def _one_vgf_report(result: Any, inputs: tuple[torch.Tensor, ...]) -> None:
    """By default the grid sampler is a compute segment inside the one VGF: one VgfBackend
    delegate holds it, no etkit grid-sampler delegate, and the report says where it went."""
    (partition,) = result.report["partitions"]
    assert partition["backend"] == "VgfBackend"
    assert partition["ops"].get("aten::grid_sampler_2d") == 1
    (path,) = result.report["grid_sampler_paths"]
    assert path["path"] == "vgf-compute-segment" and path["segment"]["grid_dtype"] == "int16"
    assert result.report["grid_samplers"] == []  # no sampler left to etkit's own delegate
    for entry in (*result.io_quant_params["inputs"], *result.io_quant_params["outputs"]):
        assert entry["dim_order"] == [0, 2, 3, 1]  # NHWC at every image boundary, for the GPU
        assert entry["texture"]["format"] == "R8_SNORM"
    files = {p.suffix for p in (result.artifacts_root / "intermediates").iterdir()}
    assert {".vgf", ".tosa"} <= files
    # its seams: the sampler's compute segment between two graph segments; the RGBA image
    # (int8) and the grid (2 x int16) go in, the RGBA output comes out
    (height, width) = inputs[0].shape[-2:]
    vgf = partition["vgf"]
    assert (vgf["graph_segments"], vgf["compute_segments"], vgf["graph_to_graph"]) == (2, 1, 0)
    assert sorted(s["bytes"] for s in vgf["seams"]) == [height * width * 4] * 3
    assert [s["into_kind"] for s in vgf["seams"]] == ["compute", "compute", "graph"]
    assert result.report["delegate_seams"] == {"delegate_calls": 1, "values_between_delegates": 0}
    markdown = (result.artifacts_root / "report.md").read_text()
    assert "2 graph and 1 compute segments; 3 values between segments" in markdown


TARGETS = ("vgf", "xnnpack")


def test_exports_are_byte_identical_and_hold_no_build_path(tmp_path: Path) -> None:
    """The flow-warp demo exported for each target in two processes (the second with another
    ``PYTHONHASHSEED``), into different folders: every file the same bytes (``timings.json``,
    measured times, aside), and no artifact names the folder or the staging folder it was built
    in; the first VGF export is the one VGF its report describes (``_one_vgf_report``), and
    the first XNNPACK export leaves the model in training mode, as the caller had it. The second
    process exports without etkit's shared provenance (``export.provenance``: node provenance
    shared, not deep-copied, through the lowering) and without deferred code generation
    (``lowering.codegen_deferred``), which must change no byte either. What varies by process
    and etkit's ETRecord renumbers: graph ids (addresses, each graph kept alive through the
    export so that no two share one: CI once saw two exports in one process differ, a graph's
    address reused for another) and the module ids keying ``nn_module_stack`` (bare, and after
    "L__self__" in the quantized model's capture: VGF and XNNPACK records of this demo differed
    by them)."""
    for target in TARGETS:
        model, inputs = DEMOS["flow-warp"]()
        model.train()
        result = export_model(
            model, inputs, artifacts_root=tmp_path / "first" / target, target=target
        )
        assert model.training  # the caller's mode, as it was
        if target == "vgf":
            _one_vgf_report(result, inputs)
            # the Arm partitioner's report handler (it logs INFO here) closed with the export:
            # no later export appends to this one's partition_report.txt
            partitioner_log = logging.getLogger("executorch.backends.arm.tosa.partitioner")
            assert not [h for h in partitioner_log.handlers if isinstance(h, logging.FileHandler)]
    # the Arm partitioner writes intermediates/partition_report.txt where its logger logs INFO
    # (pytest's log_level): the second process logs at this one's level
    level = logging.getLogger("executorch.backends.arm").getEffectiveLevel()
    code = (
        "import contextlib, logging, sys\n"
        "from etkit_exporter import export_model\n"
        "from etkit_exporter.export import lowering, pipeline\n"
        "from etkit_exporter.export.demos import DEMOS\n"
        "logging.getLogger().setLevel(int(sys.argv[2]))\n"
        "pipeline.shared_provenance = lowering.codegen_deferred = contextlib.nullcontext\n"
        f"for target in {TARGETS!r}:\n"
        "    model, inputs = DEMOS['flow-warp']()\n"
        "    export_model(model, inputs, artifacts_root=f'{sys.argv[1]}/{target}', target=target)\n"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "second"), str(level)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    folders = [tmp_path / "first", tmp_path / "second"]
    names, second = (sorted(p.relative_to(f) for p in f.rglob("*") if p.is_file()) for f in folders)
    assert names == second
    for target in TARGETS:
        assert {Path(target, "model.pte"), Path(target, "etrecord.bin")} <= set(names)
    differ = []
    for name in names:
        if name.name in MEASURED:
            continue
        (data, other) = ((folder / name).read_bytes() for folder in folders)
        differ += [str(name)] if data != other else []
        if name.suffix in (".pte", ".json", ".md"):
            assert str(tmp_path).encode() not in data, name
            assert b".etkit-new-" not in data, name
    assert differ == []


class _UnevenMaxPool(torch.nn.Module):
    """A pooling etkit cannot rewrite: 16 x 16 into 5 x 5 windows of two sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_max_pool2d(torch.relu(x), 5)


def test_an_op_outside_core_aten_is_named_with_what_to_do(tmp_path: Path) -> None:
    x = torch.rand(1, 2, 16, 16, generator=torch.Generator().manual_seed(0))
    # ExecuTorch's own verifier refuses it, for every target
    with pytest.raises(Exception) as refused:
        to_edge(torch.export.export(_UnevenMaxPool(), (x,), strict=True))
    hint = advice(refused.value)
    assert hint.startswith("aten.adaptive_max_pool2d.default is not a Core ATen op"), hint
    assert "max_pool2d where each output size divides its input size" in hint
    # the export says so in its one line (XNNPACK: the quicker lowering)
    with pytest.raises(ExportError) as failed:
        export_model(_UnevenMaxPool(), (x,), artifacts_root=tmp_path / "out", target="xnnpack")
    message = str(failed.value)
    assert "\n" not in message and f"What to do: {hint}" in message, message
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_advice_is_empty_for_a_failure_it_does_not_know() -> None:
    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    with pytest.raises(Exception) as caught:
        PassManager(passes=[InsertSomethingPass()])(graph)
    assert advice(caught.value) == ""
