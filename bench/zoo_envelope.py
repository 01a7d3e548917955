"""The rounding envelope's measured size on every model of the real-model zoo
(``tests/real_models.py``), on demand: each model exported with ``verify=True`` for each target
as the zoo tests export it, and per output the program's error power and mean against the
quantized PT2E model beside the envelope's own (its runs' mean power) and the bounds the verdict
held them to, with the share of the bound used (the closest a legitimate program comes to
failing).

    python bench/zoo_envelope.py [--targets xnnpack,vgf] [--models rife,raft,...]
        [--json zoo-envelope.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _row(name: str, target: str, index: int, output: dict[str, Any]) -> dict[str, Any]:
    power, bound = output.get("power_steps2"), output.get("power_bound_steps2")
    mean, bias_bound = output.get("mean_steps"), output.get("bias_bound_steps")
    return {
        "model": name,
        "target": target,
        "output": index,
        "psnr_db": output.get("psnr_db"),
        "max_steps": output.get("max_steps"),
        "power_steps2": power,
        "envelope_power_steps2": output.get("envelope_power_steps2"),
        "power_bound_steps2": bound,
        "power_share": round(power / bound, 3) if power is not None and bound else None,
        "bias_share": (
            round(abs(mean) / bias_bound, 3) if mean is not None and bias_bound else None
        ),
        "passes": output.get("passes"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="xnnpack,vgf")
    parser.add_argument("--models", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(HERE.parent / "tests"))
    import real_models

    from etkit_exporter import export_model

    names = [n for n in args.models.split(",") if n] or sorted(real_models.REAL_MODELS)
    rows: list[dict[str, Any]] = []
    print("model target output psnr_db max_steps power envelope_power bound power_share bias_share")
    for target in args.targets.split(","):
        for name in names:
            case = real_models.REAL_MODELS[name]
            model, inputs = case.make()
            began = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="etkit-zoo-envelope-") as scratch:
                try:
                    result = export_model(
                        model, inputs, artifacts_root=Path(scratch) / "out",
                        quantized_input_qspecs=case.input_qspecs,
                        quantized_output_qspecs=case.output_qspecs,
                        target=target, verify=True,
                    )  # fmt: skip
                except Exception as error:  # reported, and the run goes on
                    print(f"{name} {target} FAILED: {type(error).__name__}: {error}"[:300])
                    rows.append({"model": name, "target": target, "error": str(error)[:500]})
                    continue
            verdict = (result.verification or {}).get("verdict") or {}
            for index, output in enumerate(verdict.get("outputs") or []):
                row = _row(name, target, index, output)
                row["seconds"] = round(time.perf_counter() - began, 1)
                rows.append(row)
                print(" ".join(str(row[k]) for k in list(row)[:11]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    shares = [r["power_share"] for r in rows if r.get("power_share") is not None]
    if shares:
        print(f"closest to the power bound: {max(shares):.3f} of it; {len(shares)} outputs")
    return 0 if all("error" not in r and r.get("passes") is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
