"""Where a VGF export loses fidelity that the XNNPACK export of the same model keeps.

For each seed, builds the model fuzzer's model (``tests/model_fuzz.py``), exports it for both
targets with ``export_model(verify=True)``, and records each output's PSNR against the float
model (the verification's "float model" comparison). Prints the table and the seeds where VGF
is at least ``--gap`` dB further from float than XNNPACK.

    python bench/fidelity_gap.py --seed 0 --models 20 [--gap 10] [--out fidelity.jsonl]

One export at a time, in this process; an export that fails is recorded with its error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FUZZ_MODULE = HERE.parent / "tests" / "model_fuzz.py"
TARGETS = ("xnnpack", "vgf")
FLOAT_REFERENCE = "float model"
QUANT_REFERENCE = "quantized PT2E model"


def _model_fuzz() -> Any:
    spec = importlib.util.spec_from_file_location("model_fuzz", FUZZ_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_fuzz"] = module
    spec.loader.exec_module(module)
    return module


def float_psnrs(seed: int, target: str, work: Path) -> dict[str, Any]:
    """``{"psnr": {output: dB or None (identical)}, "seconds": s}`` or ``{"error": ...}``."""
    from etkit_exporter import export_model

    mf = _model_fuzz()
    model, inputs = mf.build(mf.generate(seed))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=work, prefix="gap-") as folder:
        try:
            result = export_model(
                model, inputs, target=target, verify=True, artifacts_root=Path(folder) / "x"
            )
        except Exception as error:  # recorded, the run goes on
            return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    comparisons = (result.verification or {}).get("comparisons", [])
    psnr = {
        str(c["output"]): c["psnr_db"] for c in comparisons if c["reference"] == FLOAT_REFERENCE
    }
    vs_quantized = {
        str(c["output"]): c["psnr_db"] for c in comparisons if c["reference"] == QUANT_REFERENCE
    }
    return {
        "psnr": psnr,
        "vs_quantized": vs_quantized,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _db(value: float | None) -> float:
    return float("inf") if value is None else float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--models", type=int, default=20, help="how many seeds")
    parser.add_argument("--seeds", help="comma-separated seeds (instead of --seed/--models)")
    parser.add_argument("--gap", type=float, default=10.0, help="dB that VGF must lose to list")
    parser.add_argument("--out", type=Path, help="append one JSON line per seed here")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from etkit_exporter.vgf.tools import configure_model_converter

    configure_model_converter()
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else list(range(args.seed, args.seed + args.models))
    )
    rows: list[tuple[int, str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="fidelity-gap-") as work:
        for seed in seeds:
            record: dict[str, Any] = {"seed": seed}
            for target in TARGETS:
                record[target] = float_psnrs(seed, target, Path(work))
            if args.out:
                with args.out.open("a") as store:
                    store.write(json.dumps(record) + "\n")
            x, v = record["xnnpack"], record["vgf"]
            if "error" in x or "error" in v:
                print(f"seed {seed}: xnnpack {x.get('error', 'ok')}; vgf {v.get('error', 'ok')}")
                continue
            for output in v["psnr"]:
                row = (seed, output, _db(v["psnr"][output]), _db(x["psnr"].get(output)))
                rows.append(row)
                own = (_db(v["vs_quantized"].get(output)), _db(x["vs_quantized"].get(output)))
                print(f"seed {seed:>4} output {output:>3}: VGF {row[2]:7.2f} dB  XNNPACK "
                      f"{row[3]:7.2f} dB vs float; {own[0]:7.2f} / {own[1]:7.2f} dB vs own "
                      f"PT2E ({v['seconds']} s, {x['seconds']} s)", flush=True)  # fmt: skip
    gaps = [r for r in rows if r[3] - r[2] >= args.gap]
    print(f"\n{len(gaps)} of {len(rows)} outputs: VGF at least {args.gap:g} dB worse than XNNPACK")
    for seed, output, vgf, xnn in sorted(gaps, key=lambda r: r[2] - r[3]):
        print(f"  seed {seed} output {output}: VGF {vgf:.2f} dB, XNNPACK {xnn:.2f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
