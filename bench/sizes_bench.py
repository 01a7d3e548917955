"""Latency of a program of several sizes against the fixed-size export of each size (issue 38),
side by side in one process, XNNPACK in executorch.runtime.

Run on demand (not in CI; exports at 1080p take minutes on a small machine):

    .venv/bin/python bench/sizes_bench.py [--sizes 544x960 1088x1920] [--repeats 20]
        [--out bench-sizes.json]

``--model flow-warp`` (default): the flow-warp demo with its pixel grid computed from the
input's size (the demo's ``linspace`` fixes its size; tests/test_sizes.py's
``AnySizeFlowWarp``); ``--model rife``: tests/real_models.py's RIFE-shaped network with 64
channels (its ``linspace`` fixes its size: no range). The programs:

- ``range``: one method over 256-1088 x 256-1920 (multiples of 32): ``dynamic_size``;
- ``enumerated``: one method per size (``sizes``), the size's own method timed;
- ``fixed``: the plain export at that size alone.

The bytes of each program are written too, with each several-size program's ratio to the
largest fixed export (issue 38 asks at most 1.1x for three enumerated sizes).

At each size the three run alternately (``--repeats`` rounds, one call each per round, each
program first in a round in turn, after one warm-up call each, each fed the same frames
quantized with its own input parameters); the figure is the median, and the ratio of each to
``fixed``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps" / "exporter" / "tests"))

from test_sizes import AnySizeFlowWarp

from etkit_exporter import export_model
from etkit_exporter.core.io_params import program_input
from etkit_exporter.programs.runtime import runtime_method

RANGE = ((256, 1088), (256, 1920), 32)


def _frames(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(height * 7919 + width)
    return tuple(torch.rand(1, 3, height, width, generator=generator) * 2 - 1 for _ in range(2))  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["544x960", "1088x1920"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench-sizes.json"))
    parser.add_argument("--model", choices=("flow-warp", "rife"), default="flow-warp")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes]
    torch.manual_seed(0)
    model: torch.nn.Module = AnySizeFlowWarp().eval()
    if args.model == "rife":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import real_models

        torch.manual_seed(10)
        model = real_models.RIFE(c=64).eval()
    example = _frames(256, 256)
    results: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory(prefix="etkit-sizes-bench-") as scratch:
        root = Path(scratch)
        programs: dict[str, Path] = {}
        began = time.perf_counter()
        if args.model == "flow-warp":
            ranged = export_model(model, example, artifacts_root=root / "range",
                                  target="xnnpack", dynamic_size=RANGE)  # fmt: skip
            programs["range"] = ranged.pte_path
        listed = export_model(model, example, artifacts_root=root / "enumerated",
                              target="xnnpack", sizes=sizes)  # fmt: skip
        programs["enumerated"] = listed.pte_path
        results["export_seconds"] = round(time.perf_counter() - began, 1)
        results["bytes"] = {k: v.stat().st_size for k, v in programs.items()}
        for index, size in enumerate(sizes):
            label = f"{size[0]}x{size[1]}"
            fixed = export_model(model, _frames(*size), artifacts_root=root / f"fixed-{label}",
                                 target="xnnpack")  # fmt: skip
            results["bytes"][f"fixed {label}"] = fixed.pte_path.stat().st_size
            method = "forward" if index == 0 else f"forward_{label}"
            runs = {
                "enumerated": runtime_method(programs["enumerated"], method),
                "fixed": runtime_method(fixed.pte_path),
            }
            if "range" in programs:
                runs["range"] = runtime_method(programs["range"])
            # each program gets the same float frames quantized with its own input parameters
            # (the fixed export is calibrated at its own size): fed one program's integers, the
            # other reads other values, and the sampler's memory traffic follows the flow those
            # values make (a few per cent at 1088x1920 here)
            io = {"enumerated": listed.io_quant_params, "fixed": fixed.io_quant_params}
            if "range" in programs:
                io["range"] = ranged.io_quant_params
            frames = _frames(*size)
            inputs = {
                name: [program_input(x, e) for x, e in zip(frames, io[name]["inputs"], strict=True)]
                for name in runs
            }
            times: dict[str, list[float]] = {name: [] for name in runs}
            outputs = {
                name: list(run.execute(inputs[name])) for name, run in runs.items()
            }  # warm-up
            order = list(runs)
            for round_index in range(args.repeats):
                # each program takes each place in the round in turn: the first call of a round
                # ran a steady few per cent slower or faster than the others here (caches)
                shift = round_index % len(order)
                for name in order[shift:] + order[:shift]:
                    start = time.perf_counter()
                    runs[name].execute(inputs[name])
                    times[name].append(time.perf_counter() - start)
            medians = {name: statistics.median(t) for name, t in times.items()}
            results["sizes"][label] = {
                "median_ms": {k: round(1000 * v, 3) for k, v in medians.items()},
                "ratio_to_fixed": {k: round(v / medians["fixed"], 3) for k, v in medians.items()},
                # range and enumerated share one calibration (the fixed export has its own)
                "outputs_equal_to_enumerated": {
                    k: all(torch.equal(a, b) for a, b in zip(v, outputs["enumerated"], strict=True))
                    for k, v in outputs.items()
                    if k != "fixed"
                },
            }
            print(label, json.dumps(results["sizes"][label]), flush=True)
    # issue 38's measure: the program of every size against the largest single-size export
    largest = max(v for k, v in results["bytes"].items() if k.startswith("fixed "))
    results["bytes_ratio_to_largest_fixed"] = {
        k: round(v / largest, 4) for k, v in results["bytes"].items() if not k.startswith("fixed ")
    }
    ratios = results["bytes_ratio_to_largest_fixed"]
    print("bytes", json.dumps(results["bytes"]), "ratio to the largest fixed", json.dumps(ratios))
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
