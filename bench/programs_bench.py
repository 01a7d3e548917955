"""Whole programs side by side (issue 39, item 3): each zoo model at a realistic size as
etkit's XNNPACK program, stock ExecuTorch XNNPACK fp32 and int8 (PT2E with XNNPACKQuantizer),
PyTorch eager fp32 and ONNX Runtime fp32, in one process, one call of each per round, rounds
interleaved; the figure is each one's median, and the ratios are against etkit's program.

Every program gets its native inputs: etkit's int8 as io_quant_params.json says, the others
float32. Threads: ``--threads`` for PyTorch (``torch.set_num_threads``) and ONNX Runtime
(``intra_op_num_threads``); ExecuTorch's XNNPACK threadpool takes every core (this machine: 2),
so keep ``--threads`` at the core count for a like-for-like table. Calls take turns, so no
runtime's idle threads may spin after a call: ONNX Runtime runs without spinning and PyTorch's
OpenMP with ``OMP_WAIT_POLICY=PASSIVE`` (set here before torch loads). With spinning threads
the programs ran up to 2.1x slower (flow-warp at 544x960: etkit's 97.7 ms against 46.7 ms,
eager 198.8 against 128.6). etkit's row also gives the share of its instructions' time spent
outside every delegate (the median of five ETDump runs,
``etkit_exporter.check.inspection.outside_delegates``). A flow that fails (an export upstream
refuses, a program that does not load) is a row with its one-line reason.

Run on demand (not in CI; exports take minutes):

    .venv/bin/python bench/programs_bench.py [--models flow-warp rife ifnet raft-small stn
        kornia-perspective] [--rounds 15] [--threads 2] [--json bench-programs.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "apps" / "exporter" / "tests"))

Made = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]


def _frames(height: int, width: int, seed: int, low: float = -1.0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    first = torch.rand(1, 3, height, width, generator=generator) * (1 - low) + low
    return first, torch.roll(first, shifts=(2, 3), dims=(2, 3))


def flow_warp() -> Made:
    from test_sizes import AnySizeFlowWarp  # the demo, its pixel grid from the input's size

    torch.manual_seed(0)
    return AnySizeFlowWarp().eval(), _frames(544, 960, 1)


def rife() -> Made:
    import real_models

    torch.manual_seed(10)  # the zoo's RIFE-shaped network: two IFBlocks of 16 channels, 4 warps
    model = real_models.RIFE().eval()
    return model, _frames(544, 960, 2, low=0.0)


def ifnet() -> Made:
    path = ROOT / "bench" / "fuzz_findings" / "P-rife-ifnet-v425-64x128.py"
    spec = importlib.util.spec_from_file_location("ifnet_v425", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ifnet_v425"] = module
    spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(1)
    return module.ModelUnderTest, (torch.rand(1, 6, 256, 448, generator=generator) * 2 - 1,)


def raft_small() -> Made:
    import third_party_models as zoo

    frames = _frames(256, 448, 3)
    return zoo.RaftWarp().eval(), frames


def stn() -> Made:
    import real_models

    model, (digits,) = real_models.stn_tutorial()
    return model, (digits.repeat(32, 1, 1, 1),)  # a batch of 64 digits


def kornia_perspective() -> Made:
    import kornia
    import third_party_models as zoo

    size = (544, 960)
    # the zoo's matrix is for 16 x 20 images: at 544 x 960 its perspective row would put the
    # horizon inside the image (coordinates past 2^24 pixels, which the contract refuses); the
    # same shape of warp at this size
    matrix = torch.tensor([[[0.95, 0.08, 15.0], [-0.06, 1.02, -8.0], [4e-5, -3e-5, 1.0]]])
    model = zoo._Call(kornia.geometry.transform.warp_perspective, (matrix,), dsize=size)
    return model.eval(), (_frames(*size, 4, low=0.0)[0],)


MODELS: dict[str, Callable[[], Made]] = {
    "flow-warp": flow_warp,
    "rife": rife,
    "ifnet": ifnet,
    "raft-small": raft_small,
    "stn": stn,
    "kornia-perspective": kornia_perspective,
}
FLOWS = ("etkit int8", "stock fp32", "stock int8", "eager fp32", "onnxruntime fp32")


def _line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def _stock(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], quantize: bool) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(model, inputs, strict=True)
    if quantize:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
        prepared(*inputs)
        program = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    manager = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    return bytes(manager.to_executorch().buffer)


def _onnx(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], threads: int) -> Any:
    import onnxruntime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    assert exported is not None
    data = exported.model_proto.SerializeToString()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # its threads would spin after each call, taking the cores from the next program's call
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {n: x.numpy() for n, x in zip(names, inputs, strict=True)}
    return lambda: session.run(None, feed)


def _etkit(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], folder: Path
) -> tuple[Callable[[], Any], dict[str, Any] | None]:
    from etkit_exporter import export_model
    from etkit_exporter.check.inspection import event_row, outside_delegates
    from etkit_exporter.core.io_params import program_input
    from etkit_exporter.programs.runtime import run_with_etdump, runtime_method

    result = export_model(model, inputs, artifacts_root=folder / "etkit", target="xnnpack")
    entries = result.io_quant_params["inputs"]
    native = [program_input(x, entry) for x, entry in zip(inputs, entries, strict=True)]
    method = runtime_method(result.pte_path)
    share: dict[str, Any] | None = None
    try:
        from executorch.devtools import Inspector

        # Each ETDump run loads the program afresh, and one cold run's share moved between 4.6
        # and 24 % on the STN; the run with the median share of five stands.
        shares = []
        for run in range(5):
            etdump = folder / f"etkit-{run}.etdp"
            run_with_etdump(result.pte_path, native, etdump, None, isolated=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                inspector = Inspector(etdump_path=str(etdump))
            events = [e for block in inspector.event_blocks for e in block.events]
            rows = [row for row in map(event_row, events) if row is not None]
            shares.append(outside_delegates(rows))
        shares.sort(key=lambda s: float(s.get("share") or 0.0))
        share = shares[len(shares) // 2]
    except Exception as error:  # the latency still stands
        share = {"error": _line(error)}
    return lambda: method.execute(native), share


def measure(name: str, rounds: int, threads: int, folder: Path) -> dict[str, Any]:
    model, inputs = MODELS[name]()
    model.eval()
    calls: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}
    export_seconds: dict[str, float] = {}
    outside: dict[str, Any] | None = None

    def build(flow: str, make: Callable[[], Any]) -> None:
        start = time.perf_counter()
        try:
            calls[flow] = make()
            calls[flow]()  # warm-up; a program that loads but cannot run fails here
        except Exception as error:
            calls.pop(flow, None)
            errors[flow] = _line(error)
        export_seconds[flow] = round(time.perf_counter() - start, 1)

    def etkit_flow() -> Callable[[], Any]:
        nonlocal outside
        call, outside = _etkit(model, inputs, folder / name)
        return call

    from etkit_exporter.programs.runtime import runtime_method

    def stock(quantize: bool) -> Callable[[], Any]:
        path = folder / name / f"stock-{'int8' if quantize else 'fp32'}.pte"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_stock(model, inputs, quantize))
        method = runtime_method(path)
        return lambda: method.execute(list(inputs))

    def eager() -> Callable[[], Any]:
        def call() -> Any:
            with torch.no_grad():
                return model(*inputs)

        return call

    build("etkit int8", etkit_flow)
    build("stock fp32", lambda: stock(False))
    build("stock int8", lambda: stock(True))
    build("eager fp32", eager)
    build("onnxruntime fp32", lambda: _onnx(model, inputs, threads))
    times: dict[str, list[float]] = {flow: [] for flow in calls}
    for _ in range(rounds):
        for flow, call in calls.items():
            start = time.perf_counter()
            call()
            times[flow].append(time.perf_counter() - start)
    medians = {flow: 1000 * statistics.median(t) for flow, t in times.items()}
    etkit_ms = medians.get("etkit int8")
    return {
        "model": name,
        "inputs": [list(x.shape) for x in inputs],
        "median_ms": {k: round(v, 3) for k, v in medians.items()},
        "times_etkit": {k: round(v / etkit_ms, 2) for k, v in medians.items()} if etkit_ms else {},
        "errors": errors,
        "export_seconds": export_seconds,
        "etkit_outside_delegates": outside,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="etkit-programs-bench-") as scratch:
        for name in args.models:
            rows.append(measure(name, args.rounds, args.threads, Path(scratch)))
            print(json.dumps(rows[-1]), flush=True)
    print("\nms, median; in brackets each one's time over etkit's (above 1: etkit is faster)")
    print("\n| model | " + " | ".join(FLOWS) + " | etkit outside delegates |")
    print("|---|" + "---|" * (len(FLOWS) + 1))
    for row in rows:
        cells = []
        for flow in FLOWS:
            if flow in row["median_ms"]:
                ms, ratio = row["median_ms"][flow], row["times_etkit"].get(flow)
                cells.append(f"{ms:.1f} ms" + (f" ({ratio}x)" if flow != "etkit int8" else ""))
            else:
                cells.append("failed: " + row["errors"].get(flow, "?")[:60])
        share = row["etkit_outside_delegates"] or {}
        outside = f"{100 * share['share']:.1f} %" if "share" in share else share.get("error", "")
        print(f"| {row['model']} {row['inputs'][0]} | " + " | ".join(cells) + f" | {outside} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
