"""The model fuzzer on demand: generates N grid-sampling models (``tests/model_fuzz.py``), exports
each for each target with verification on, and prints the tally (exported and verified /
refused before export with a reason / failed verification / crashed) and the failing seeds.
Each failure is written under ``--out`` as a standalone model file with the command that
reproduces it, and shrunk (``-min.py``) while it still fails the same way.

    python bench/fuzz.py --models 50 [--target vgf] [--seed 1000] [--out fuzz-out]

The models run in worker processes (``--jobs``, default 1), so a model that kills its process
(a native crash) or hangs (``--timeout``) is counted as crashed and the run goes on. Results
are appended to ``OUT/results.jsonl`` as they come.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FUZZ_MODULE = HERE.parent / "tests" / "model_fuzz.py"
TARGETS = ("xnnpack", "vgf")
SHRINKS_PER_CLASS = 2  # per worker: failures of one class after these are written, not shrunk


def _model_fuzz() -> Any:
    spec = importlib.util.spec_from_file_location("model_fuzz", FUZZ_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_fuzz"] = module
    spec.loader.exec_module(module)
    return module


# -- the worker: one process running (seed, target) pairs, a JSON line per result -------------


def worker(pairs: list[tuple[int, str]], out: Path, shrink_budget: int) -> None:
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    mf = _model_fuzz()
    from etkit_exporter.vgf.tools import configure_model_converter

    configure_model_converter()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    shrunk: Counter[tuple[str, str, str]] = Counter()  # a class is shrunk a few times, not always
    for seed, target in pairs:
        print(json.dumps({"start": seed, "target": target}), flush=True)
        spec = mf.generate(seed)
        outcome = mf.classify(spec, target, work)
        record: dict[str, Any] = {
            "seed": seed,
            "target": target,
            "kind": outcome.kind,
            "message": outcome.message,
            "signature": outcome.signature,
            "seconds": round(outcome.seconds, 1),
            "model": spec.counts(),
        }
        if "program" in outcome.details:  # delegates, sampler paths, ops outside
            record["program"] = outcome.details["program"]
        if "margin" in outcome.details:  # how close a pass came to the envelope's bounds
            record["margin"] = outcome.details["margin"]
        if outcome.kind == "failed_verification":
            record["failures"] = json.loads(
                json.dumps(outcome.details.get("failures"), default=str)
            )
        if outcome.kind in ("failed_verification", "crashed"):
            stem = f"seed{seed}-{target}"
            record["repro"] = str(mf.write_repro(spec, target, outcome, out, stem))
            key = (target, outcome.kind, outcome.signature)
            if shrunk[key] < SHRINKS_PER_CLASS:
                shrunk[key] += 1
                record.update(_shrink(mf, spec, target, outcome, out, stem, work, shrink_budget))
        print(json.dumps(record), flush=True)


def _shrink(
    mf: Any, spec: Any, target: str, outcome: Any, out: Path, stem: str, work: Path, budget: int
) -> dict[str, Any]:
    if budget <= 0:
        return {}
    last = {"outcome": outcome}

    def still_fails(candidate: Any) -> bool:
        try:
            result = mf.classify(candidate, target, work)
        except Exception:  # the candidate's own build, not etkit
            return False
        same = result.kind == outcome.kind and result.signature == outcome.signature
        if same:
            last["outcome"] = result
        return bool(same)

    small, calls = mf.shrink(spec, still_fails, budget=budget, seconds=budget * 600.0)
    if mf.render(small) == mf.render(spec):
        return {"shrink_calls": calls}
    path = mf.write_repro(small, target, last["outcome"], out, f"{stem}-min")
    return {"shrink_calls": calls, "min_repro": str(path), "min_model": small.counts()}


# -- the parent: workers, timeouts, the tally --------------------------------------------------


WORKERS: list[subprocess.Popen] = []  # ended when the run is interrupted


def _spawn(pairs: list[tuple[int, str]], args: argparse.Namespace, log: Any) -> subprocess.Popen:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker",
        "--pairs", ",".join(f"{s}:{t}" for s, t in pairs), "--out", str(args.out),
        "--shrink-budget", str(args.shrink_budget),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ}
    )
    WORKERS.append(process)
    return process


def _run_job(
    pairs: list[tuple[int, str]], args: argparse.Namespace, results: queue.Queue, index: int
) -> None:
    """Runs ``pairs`` in a worker, restarting it after a model that kills or hangs it."""
    log_path = args.out / f"worker-{index}.log"
    with log_path.open("a") as log:
        while pairs:
            process = _spawn(pairs, args, log)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
            current: tuple[int, str] | None = None
            started = time.monotonic()
            while True:
                limit = args.timeout * (1 + args.shrink_budget) if current else args.timeout
                try:
                    line = lines.get(timeout=max(1.0, limit - (time.monotonic() - started)))
                except queue.Empty:
                    process.kill()
                    process.wait()
                    if current is not None:
                        results.put(_died(current, f"no result within {limit:.0f} s (killed)"))
                        pairs = pairs[pairs.index(current) + 1 :]
                    break
                if line is None:
                    code = process.wait()
                    if current is not None:
                        results.put(_died(current, f"the worker process died (exit {code})"))
                        pairs = pairs[pairs.index(current) + 1 :]
                    else:
                        pairs = []
                    break
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "start" in message:
                    current, started = (message["start"], message["target"]), time.monotonic()
                    continue
                results.put(message)
                done = (message["seed"], message["target"])
                pairs = pairs[pairs.index(done) + 1 :]
                current = None
    results.put({"job_done": index})


def _pump(process: subprocess.Popen, lines: queue.Queue) -> None:
    """The worker's stdout, line by line, then ``None``."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _died(pair: tuple[int, str], why: str) -> dict[str, Any]:
    return {
        "seed": pair[0], "target": pair[1], "kind": "crashed", "message": why,
        "signature": why.split(" (")[0], "seconds": None, "model": "",
    }  # fmt: skip


def tally(records: list[dict[str, Any]], targets: tuple[str, ...]) -> str:
    kinds = ("verified", "refused", "failed_verification", "crashed")
    lines = [f"{'target':<9}{'models':>7}" + "".join(f"{k:>21}" for k in kinds)]
    for target in targets:
        mine = [r for r in records if r["target"] == target]
        counts = Counter(r["kind"] for r in mine)
        lines.append(f"{target:<9}{len(mine):>7}" + "".join(f"{counts[k]:>21}" for k in kinds))
    for target in targets:
        margins = [
            (r["margin"], r["seed"]) for r in records if r["target"] == target and r.get("margin")
        ]
        if margins:
            power = max(margins, key=lambda m: m[0]["power_share"])
            bias = max(margins, key=lambda m: m[0]["bias_share"])
            lines.append(
                f"{target}: closest passes: error power {100 * power[0]['power_share']:.0f} % of "
                f"its bound (seed {power[1]}), mean {100 * bias[0]['bias_share']:.0f} % of its "
                f"bound (seed {bias[1]})"
            )
    refusals = Counter(r["message"] for r in records if r["kind"] == "refused")
    if refusals:
        lines.append("refusals:")
        lines += [f"  {n} x {message}" for message, n in refusals.most_common()]
    failing = [r for r in records if r["kind"] in ("failed_verification", "crashed")]
    if failing:
        classes: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in failing:
            classes[(r["target"], r["kind"], r["signature"])].append(r)
        lines.append("failure classes (target, outcome, signature: seeds):")
        for (target, kind, sig), members in sorted(classes.items(), key=lambda i: -len(i[1])):
            seeds = ", ".join(str(r["seed"]) for r in members)
            lines.append(f"  {target} {kind} x{len(members)}: {sig[:160]}\n    seeds: {seeds}")
        lines.append("failing seeds:")
        for r in sorted(failing, key=lambda r: (r["target"], r["seed"])):
            lines.append(f"  {r['target']} seed {r['seed']}: {r['kind']}: {r['message'][:200]}")
            repro = r.get("min_repro") or r.get("repro")
            if repro:
                lines.append(
                    f"    etkit-export -m {repro} -t {r['target']} --verify "
                    f"-o /tmp/{Path(repro).stem}-{r['target']} --force"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20, help="how many models (seeds)")
    parser.add_argument("--target", choices=(*TARGETS, "both"), default="both")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="repro files here")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per export")
    parser.add_argument(
        "--shrink-budget", type=int, default=12, help="exports spent shrinking each failure"
    )
    parser.add_argument(
        "--tally", type=Path, metavar="RESULTS", help="print the tally of a results.jsonl and exit"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tally:
        records = [json.loads(line) for line in args.tally.read_text().splitlines() if line]
        present = tuple(t for t in TARGETS if any(r["target"] == t for r in records))
        print(tally(records, present))
        return 0
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        pairs = [(int(s), t) for s, t in (p.split(":") for p in args.pairs.split(","))]
        worker(pairs, args.out, args.shrink_budget)
        return 0
    if args.models < 1 or args.jobs < 1:
        parser.error("--models and --jobs must be at least 1")
    targets = TARGETS if args.target == "both" else (args.target,)
    seeds = range(args.seed, args.seed + args.models)
    pairs = [(s, t) for s in seeds for t in targets]
    results: queue.Queue = queue.Queue()
    for index in range(args.jobs):
        threading.Thread(
            target=_run_job, args=(pairs[index :: args.jobs], args, results, index), daemon=True
        ).start()
    records: list[dict[str, Any]] = []
    try:
        _collect(results, records, len(pairs), args)
    except KeyboardInterrupt:
        for process in WORKERS:
            process.kill()
        print(f"interrupted after {len(records)} of {len(pairs)} exports")
    print(tally(records, targets))
    return 1 if any(r["kind"] in ("failed_verification", "crashed") for r in records) else 0


def _collect(
    results: queue.Queue, records: list[dict[str, Any]], total: int, args: argparse.Namespace
) -> None:
    done = 0
    with (args.out / "results.jsonl").open("a") as store:
        while done < args.jobs:
            record = results.get()
            if "job_done" in record:
                done += 1
                continue
            records.append(record)
            store.write(json.dumps(record) + "\n")
            store.flush()
            print(
                f"[{len(records)}/{total}] {record['target']} seed {record['seed']}: "
                f"{record['kind']}"
                + (f": {record['message'][:160]}" if record["message"] else "")
                + (f" ({record['seconds']} s)" if record.get("seconds") else ""),
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
