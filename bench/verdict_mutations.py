"""The verdict's mutation score on demand: every mutation of tests/verdict_mutations.py on every
model and target, each exported with the mutation in place and verified; prints per mutation
whether it fired, its size against the rounding envelope and whether the verdict caught it,
then the score (caught / fired) overall and for the mutations larger than the envelope.

    python bench/verdict_mutations.py [--models flow-warp,stn] [--targets xnnpack,vgf,vgf-split]
        [--mutations NAME,...] [--out /tmp/verdict-mutations] [--json results.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _mutations() -> Any:
    spec = importlib.util.spec_from_file_location(
        "verdict_mutations", HERE.parent / "tests" / "verdict_mutations.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["verdict_mutations"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="flow-warp,stn")
    parser.add_argument("--targets", default="xnnpack,vgf,vgf-split")
    parser.add_argument("--mutations", default="")
    parser.add_argument("--out", type=Path, default=Path("/tmp/verdict-mutations"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    vm = _mutations()
    from etkit_exporter.export.demos import DEMOS

    names = [m for m in args.mutations.split(",") if m] or list(vm.MUTATIONS)
    rows: list[dict[str, Any]] = []
    for model_name in args.models.split(","):
        for target_name in args.targets.split(","):
            target, split = target_name.split("-")[0], target_name.endswith("-split")
            model, inputs = DEMOS[model_name]()
            out = args.out / f"{model_name}-{target_name}"
            clean, error = vm.export_verified(
                model, inputs, out / "clean", target, sampler_delegate=split
            )
            verdict = (clean.get("verdict") or {}).get("result")
            print(
                f"== {model_name} {target_name}: clean program {verdict} ({error or 'no error'})",
                flush=True,
            )
            for name in names:
                start = time.monotonic()
                outcome = vm.run_mutation(
                    name, model, inputs, clean, out / name, target, sampler_delegate=split
                )
                row = {
                    "model": model_name,
                    "target": target_name,
                    **asdict(outcome),
                    "seconds": round(time.monotonic() - start, 1),
                }
                rows.append(row)
                state = (
                    "n/a"
                    if outcome.applied is None
                    else "ERROR " + str(outcome.error)
                    if outcome.error and not outcome.fired
                    else "not fired"
                    if not outcome.fired
                    else "CAUGHT"
                    if outcome.caught
                    else "missed"
                )
                print(
                    f"  {name:34} {state:9} power {outcome.size:9.3g} "
                    + f"mean {outcome.bias:8.3g} x bound "
                    + (outcome.applied or "")
                    + (f" | {outcome.reasons[0]}" if outcome.reasons else ""),
                    flush=True,
                )
    fired = [r for r in rows if r["fired"] and r["references_unchanged"]]
    caught = [r for r in fired if r["caught"]]
    large = [r for r in fired if r["size"] > 1 or r["bias"] > 1]
    print(
        f"mutation score: {len(caught)} of {len(fired)} fired mutations caught "
        f"({100 * len(caught) / max(len(fired), 1):.1f} %); larger than the envelope: "
        f"{sum(r['caught'] for r in large)} of {len(large)}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
