"""Export time: etkit's ``export_model`` against the plain upstream flow, stage by stage.

Run on demand (not in CI): .venv/bin/python bench/export_bench.py [--rounds N] [--target T]

Models: a RIFE-shaped frame interpolator at 64x128 (tests/real_models.py's RIFE: two IFBlocks,
four grid samplers) and the flow-warp demo. Upstream: what a user of ExecuTorch 1.5.1 writes
without etkit: ``torch.export``, PT2E with the target's own quantizer (``VgfQuantizer`` or
``XNNPACKQuantizer``, symmetric int8), ``to_edge_transform_and_lower`` with the target's
partitioner, ``to_executorch``. The grid samplers stay outside the delegates there (portable
``grid_sampler_2d`` in float); etkit also quantizes the boundaries and grid samplers, lowers them
to its own backend, pins layouts and writes its artifacts. Both flows run in this one process,
taking turns round after round; figures are the median per stage, and ratios etkit/upstream.
Target: etkit at most 1.25x upstream's total; the RIFE-shaped model under 30 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
Stages = dict[str, float]


def _real_models() -> Any:
    spec = importlib.util.spec_from_file_location("real_models", ROOT / "tests/real_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_models"] = module
    spec.loader.exec_module(module)
    return module


def rife_64x128() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    real_models = _real_models()
    torch.manual_seed(10)
    model = real_models.RIFE().eval()
    with torch.no_grad():
        for block in model.blocks:
            block.lastconv.weight.mul_(4.0)
    frame = real_models._smooth_image(1, 3, 64, 128, seed=11)
    shifted = torch.roll(frame, shifts=(1, 2), dims=(2, 3))
    return model, ((frame + 1) / 2, (shifted + 1) / 2)


def flow_warp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from etkit_exporter.export.demos import DEMOS

    model, inputs = DEMOS["flow-warp"]()
    return model, inputs


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]] = {
    "rife-64x128": rife_64x128,
    "flow-warp": flow_warp,
}


def upstream(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str) -> Stages:
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    stages: Stages = {}
    start = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        now = time.perf_counter()
        stages[name] = now - start
        start = now

    if target == "vgf":
        from executorch.backends.arm.quantizer import (
            VgfQuantizer,
            get_symmetric_quantization_config,
        )
        from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner

        spec = VgfCompileSpec("TOSA-1.0+INT+FP+int16")
        quantizer: Any = VgfQuantizer(spec)
        quantizer.set_global(get_symmetric_quantization_config())
        partitioner: Any = VgfPartitioner(spec)
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
        )
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            get_symmetric_quantization_config as xnnpack_config,
        )

        quantizer = XNNPACKQuantizer().set_global(xnnpack_config())
        partitioner = XnnpackPartitioner()
    captured = torch.export.export(model, inputs, strict=True)
    lap("capture")
    prepared = prepare_pt2e(captured.module(check_guards=False), quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    lap("quantize")
    exported = torch.export.export(converted, inputs, strict=True)
    lap("re_export")
    manager = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    lap("lower_main")
    program = manager.to_executorch()
    _ = program.buffer
    lap("serialize")
    return stages


def etkit(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str) -> Stages:
    from etkit_exporter import export_model

    with tempfile.TemporaryDirectory(prefix="etkit-export-bench-") as folder:
        result = export_model(model, inputs, artifacts_root=Path(folder) / "out", target=target)
    return {name: float(seconds) for name, seconds in result.report["timings_s"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--target", choices=("vgf", "xnnpack", "both"), default="both")
    parser.add_argument("--model", choices=(*MODELS, "all"), default="all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    targets = ("vgf", "xnnpack") if args.target == "both" else (args.target,)
    names = tuple(MODELS) if args.model == "all" else (args.model,)
    print(f"export time, {args.rounds} round(s), torch threads 1, {torch.__version__}")
    for name in names:
        for target in targets:
            runs: dict[str, list[Stages]] = {"etkit": [], "upstream": []}
            for _ in range(args.rounds):
                for flow, run in (("upstream", upstream), ("etkit", etkit)):
                    model, inputs = MODELS[name]()
                    runs[flow].append(run(model, inputs, target))
            print(f"\n{name}, {target}:")
            median = {
                flow: {
                    stage: statistics.median(r[stage] for r in stage_runs)
                    for stage in stage_runs[0]
                }
                for flow, stage_runs in runs.items()
            }
            stages = list(dict.fromkeys([*median["upstream"], *median["etkit"]]))
            print(f"  {'stage':<24} {'upstream s':>10} {'etkit s':>10} {'ratio':>7}")
            for stage in stages:
                up, et = median["upstream"].get(stage), median["etkit"].get(stage)
                ratio = f"{et / up:7.2f}" if up and et is not None else "      -"
                print(
                    f"  {stage:<24} {'-' if up is None else f'{up:.2f}':>10} "
                    f"{'-' if et is None else f'{et:.2f}':>10} {ratio}"
                )
            up_total, et_total = sum(median["upstream"].values()), sum(median["etkit"].values())
            print(
                f"  {'total':<24} {up_total:>10.2f} {et_total:>10.2f} {et_total / up_total:7.2f}"
                f"   (target <= 1.25x{'; RIFE under 30 s' if name.startswith('rife') else ''})"
            )


if __name__ == "__main__":
    main()
