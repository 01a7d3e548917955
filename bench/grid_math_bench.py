"""Integer where it counts: what keeping only the coordinate arithmetic in float does to fidelity
and speed, side by side in one run.

Run on demand (not in CI):

    .venv/bin/python bench/grid_math_bench.py [--old-tree DIR] [--targets xnnpack,vgf] [--runs N]

Models: the flow-warp demo; a flow estimator (three convs predict a flow in pixels from two
frames, frame 0 is warped by it); the PyTorch spatial-transformer tutorial's classifier
(tests/real_models.py's ``stn_tutorial``); the RIFE- and RAFT-shaped models of
tests/real_models.py. Variants:

- ``before``: the rule of the previous commit (every node whose uses all lead into a grid
  sampler's grid input left in float, the layers predicting the flow included), exported by
  that commit's etkit-quant and etkit-exporter (``--old-tree``: a ``git worktree add DIR HEAD``
  of the commit before this change; its packages go first on ``PYTHONPATH`` in a subprocess);
- ``float``: ``grid_math="float"``, the default now (the coordinate arithmetic in float, every
  layer before it in int8);
- ``int``: ``grid_math="int"`` (the coordinate arithmetic quantized by the base quantizer too).

Per model, variant and target: the convs, linears and matmuls the lowered program runs in float
(``etkit_exporter.float_ops``), all float ops, PSNR against the float model, export time and,
for XNNPACK, the ``.pte``'s median run time in ``executorch.runtime``. XNNPACK's PSNR is the
written program's; VGF's is the PT2E model's (the VGF program matches it; verifying it needs
the Vulkan runner and minutes per model).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("flow-warp", "flow-estimator", "stn-classifier", "rife", "raft")


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _real_models() -> Any:
    return sys.modules.get("real_models") or _load("real_models", ROOT / "tests/real_models.py")


class FlowEstimator(torch.nn.Module):
    """Two frames -> three convs -> a flow in pixels -> frame 0 backward-warped by it (RIFE's
    warp: pixel flow over the align_corners=True grid, border padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 2, 3, padding=1),
        )

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        flow = self.net(torch.cat([frame0, frame1], 1))
        return _real_models().backward_warp(frame0, flow)


def model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    real = _real_models()
    if name == "flow-warp":
        from etkit_exporter.export.demos import flow_warp

        return flow_warp()
    if name == "flow-estimator":
        torch.manual_seed(40)
        estimator = FlowEstimator().eval()
        with torch.no_grad():  # flows of a few pixels
            estimator.net[4].weight.mul_(8.0)
        frame = real._smooth_image(1, 3, 32, 48, seed=41)
        return estimator, (frame, torch.roll(frame, shifts=(1, 2), dims=(2, 3)))
    factories = {"stn-classifier": real.stn_tutorial, "rife": real.rife, "raft": real.raft}
    made: tuple[torch.nn.Module, tuple[torch.Tensor, ...]] = factories[name]()
    return made


def _psnr(actual: torch.Tensor, reference: torch.Tensor) -> float:
    error = float(((actual.float() - reference.float()) ** 2).mean())
    peak = float(reference.abs().max()) or 1.0
    return math.inf if error == 0 else 10 * math.log10(peak * peak / error)


def _as_list(value: object) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)  # type: ignore[call-overload]


def _float_ops_module() -> Any:
    """This tree's ``etkit_exporter.artifact.float_ops``, also under the previous commit's packages
    (which lack what it imports: given here)."""
    import etkit_quant.boundary as boundary
    import etkit_quant.graph as graph

    if not hasattr(graph, "compute_kind"):
        new_graph = _load("etkit_quant_graph_now", ROOT / "libs/quant/src/etkit_quant/graph.py")
        graph.compute_kind = new_graph.compute_kind  # type: ignore[attr-defined]
        boundary.COORDINATE_ARITHMETIC = "coordinate arithmetic"  # type: ignore[attr-defined]
        boundary.USER_CHOICE = "user choice"  # type: ignore[attr-defined]
        boundary.float_reason = lambda node: None  # type: ignore[attr-defined]
    return _load("float_ops_now", ROOT / "apps/exporter/src/etkit_exporter/artifact/float_ops.py")


def _program_inputs(inputs: tuple[torch.Tensor, ...], io: dict[str, Any]) -> list[torch.Tensor]:
    result = []
    for value, entry in zip(inputs, io["inputs"], strict=True):
        if entry.get("scale") is not None:
            q = torch.round(value / entry["scale"]) + entry["zero_point"]
            dtype = {"int8": torch.int8, "int16": torch.int16}[entry["dtype"]]
            value = q.clamp(entry["quant_min"], entry["quant_max"]).to(dtype)
        if entry.get("dim_order") == [0, 2, 3, 1]:
            value = value.contiguous(memory_format=torch.channels_last)
        result.append(value.contiguous() if entry.get("dim_order") != [0, 2, 3, 1] else value)
    return result


def _float_outputs(outputs: list[torch.Tensor], io: dict[str, Any]) -> list[torch.Tensor]:
    result = []
    for value, entry in zip(outputs, io["outputs"], strict=True):
        if entry.get("scale") is not None:
            value = (value.float() - entry["zero_point"]) * float(entry["scale"])
        result.append(value.float())
    return result


def measure(name: str, variant: str, target: str, runs: int, work: Path) -> dict[str, Any]:
    """One export of model ``name`` (``variant`` "before", "float" or "int") for ``target``."""
    from etkit_exporter.export.pipeline import export_model

    module, inputs = model(name)
    with torch.no_grad():
        reference = _as_list(module(*inputs))
    from executorch.exir.program import EdgeProgramManager

    kwargs = {} if variant == "before" else {"grid_math": variant}
    out = work / f"{name}-{variant}-{target}"
    float_ops = _float_ops_module()
    found: list[Any] = []
    to_executorch = EdgeProgramManager.to_executorch

    def capture(self: EdgeProgramManager, *args: Any, **kw: Any) -> Any:
        # the lowered edge program, before to_executorch: the same for every variant
        grid_math = "float" if variant == "before" else variant
        found[:] = float_ops.float_ops(self.exported_program(), grid_math=grid_math)
        return to_executorch(self, *args, **kw)

    EdgeProgramManager.to_executorch = capture  # type: ignore[method-assign]
    start = time.perf_counter()
    try:
        result = export_model(
            module, inputs, artifacts_root=out, target=target, force=True, **kwargs
        )
    finally:
        EdgeProgramManager.to_executorch = to_executorch  # type: ignore[method-assign]
    seconds = time.perf_counter() - start
    ops = found
    heavy = [op for op in ops if op.kind in float_ops.HEAVY_KINDS]
    row: dict[str, Any] = {
        "model": name,
        "variant": variant,
        "target": target,
        "heavy_float": len(heavy),
        "heavy_float_ops": sorted({op.op for op in heavy}),
        "float_ops": len(ops),
        "export_s": round(seconds, 1),
    }
    if target == "xnnpack":
        from executorch.runtime import Runtime

        from etkit_gridsampler import runtime

        runtime.register()
        io = json.loads((out / "io_quant_params.json").read_text())
        method = Runtime.get().load_program(out / "model.pte").load_method("forward")
        program_inputs = _program_inputs(inputs, io)
        outputs = _float_outputs(list(method.execute(program_inputs)), io)
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            method.execute(program_inputs)
            times.append(time.perf_counter() - begin)
        row["run_ms"] = round(1000 * statistics.median(times), 3)
        row["psnr_db"] = [round(_psnr(o, r), 1) for o, r in zip(outputs, reference, strict=True)]
    else:
        converted = result.converted_model
        assert converted is not None
        with torch.no_grad():
            outputs = _as_list(converted(*inputs))
        row["psnr_db"] = [round(_psnr(o, r), 1) for o, r in zip(outputs, reference, strict=True)]
    return row


def _child(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="grid-math-bench-") as folder:
        for name in args.models.split(","):
            for target in args.targets.split(","):
                for variant in args.variants.split(","):
                    row = measure(name, variant, target, args.runs, Path(folder))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    Path(args.json).write_text(json.dumps(rows))


def _run_variant(args: argparse.Namespace, variants: str, old_tree: Path | None) -> list[Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result = Path(handle.name)
    env = dict(os.environ)
    if old_tree is not None:
        paths = [old_tree / "libs/quant/src", old_tree / "apps/exporter/src"]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, __file__, "--child", "--json", str(result), "--variants", variants,
        "--models", args.models, "--targets", args.targets, "--runs", str(args.runs),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True)
    rows: list[Any] = json.loads(result.read_text())
    result.unlink()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the README."""
    lines = [
        "| model | target | variant | convs/linears/matmuls in float | float ops | PSNR vs float "
        "(dB) | export (s) | XNNPACK run (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        heavy = f"{r['heavy_float']}" + (
            f" ({', '.join(o.removeprefix('aten::') for o in r['heavy_float_ops'])})"
            if r["heavy_float"]
            else ""
        )
        psnr = " / ".join(f"{p:.1f}" for p in r["psnr_db"])
        run = f"{r['run_ms']:.2f}" if "run_ms" in r else ""
        lines.append(
            f"| {r['model']} | {r['target']} | {r['variant']} | {heavy} | {r['float_ops']} | "
            f"{psnr} | {r['export_s']:.1f} | {run} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, help="a worktree of the commit before")
    parser.add_argument("--targets", default="xnnpack")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default="float,int")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    rows = []
    if args.old_tree is not None:
        rows += _run_variant(args, "before", args.old_tree)
    rows += _run_variant(args, args.variants, None)
    order = {v: k for k, v in enumerate(["before", "float", "int"])}
    rows.sort(key=lambda r: (MODELS.index(r["model"]), r["target"], order[r["variant"]]))
    print(table(rows))


if __name__ == "__main__":
    main()
