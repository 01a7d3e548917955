#!/usr/bin/env python3
"""Runs etkit's one-VGF demo programs on ExecuTorch's stock ``executor_runner`` (built by
``build_executor_runner.sh`` with only the Arm VGF backend) and on etkit's runner, and compares
their outputs byte for byte. An on-demand check, not part of the test suite (README.md).

For each built-in demo (``etkit_exporter.export.demos.DEMOS``): export it for VGF, check that
the program is one ``VgfBackend`` delegate (else skip it, saying why: the stock runner has none
of etkit's delegates), quantize the demo's example inputs with the program's
``io_quant_params`` and write them as raw bytes in each input's memory order (its dim order),
run ``etkit_exporter.programs.load_program(pte).run(...)`` and ``executor_runner --inputs ...
--output_file X`` (in the Vulkan environment etkit itself uses, ``ml_emulation_env``), read
``X-<k>.bin`` per output and compare. A control run with the first input perturbed (seeded)
must differ from etkit's output, or the comparison could not fail. Exits 1 when an output
differs or a control does not; 2 on a usage error.

    .venv/bin/python scripts/stock_runtime/compare.py [--runner PATH] [--models flow-warp,stn]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RUNNER = ROOT / "build" / "stock-runtime" / "cmake-out" / "executor_runner"
DEFAULT_WORK = ROOT / "build" / "stock-runtime-compare"
_LOADED = re.compile(r"Model loaded in ([0-9.]+) ms")
_EXECUTED = re.compile(r"Model executed successfully (\d+) time\(s\) in ([0-9.]+) ms")


class UsageError(Exception):
    """A caller's mistake: printed as one line, exit status 2."""


@dataclass
class Row:
    """One model's comparison."""

    model: str
    outputs: int = 0
    nbytes: int = 0
    differing: int = 0
    control_differing: int = 0
    load_s: float = float("nan")
    run_ms: float = float("nan")
    etkit_s: float = float("nan")
    skipped: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return self.skipped is not None or (self.differing == 0 and self.control_differing > 0)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    from etkit_exporter.export.demos import DEMOS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runner",
        type=Path,
        default=Path(os.environ.get("ETKIT_EXECUTOR_RUNNER", DEFAULT_RUNNER)),
        help="the executor_runner binary (default: $ETKIT_EXECUTOR_RUNNER, else "
        "build/stock-runtime/cmake-out/executor_runner)",
    )
    parser.add_argument(
        "--models",
        default=",".join(DEMOS),
        help=f"comma-separated demos (default: all: {', '.join(DEMOS)})",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=DEFAULT_WORK,
        help="where exports, inputs and outputs go (default build/stock-runtime-compare)",
    )
    parser.add_argument(
        "--reuse-exports",
        action="store_true",
        help="use WORK/<model>/model.pte from an earlier run instead of exporting again",
    )
    parser.add_argument("--seed", type=int, default=1234, help="seed of the control's input")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in DEMOS]
    if unknown or not models:
        raise UsageError(f"--models: unknown demo {unknown or '(none)'}; choose from {list(DEMOS)}")
    args.models = models
    if not (args.runner.is_file() and os.access(args.runner, os.X_OK)):
        raise UsageError(
            f"no executor_runner at {args.runner}: build it with "
            "scripts/stock_runtime/build_executor_runner.sh, or pass --runner / set "
            "ETKIT_EXECUTOR_RUNNER"
        )
    return args


def _export(name: str, folder: Path, reuse: bool) -> tuple[Path, dict[str, Any], tuple[Any, ...]]:
    """The demo's program, its io_quant_params and its example inputs."""
    import json

    from etkit_exporter import export_model
    from etkit_exporter.export.demos import DEMOS

    model, example = DEMOS[name]()
    pte, params = folder / "model.pte", folder / "io_quant_params.json"
    if reuse and pte.is_file() and params.is_file():
        return pte, json.loads(params.read_text()), example
    result = export_model(model, example, artifacts_root=folder, target="vgf", force=True)
    return result.pte_path, result.io_quant_params, example


def _memory_bytes(tensor: Any, dim_order: tuple[int, ...]) -> bytes:
    """The bytes of ``tensor`` as laid out in memory in ``dim_order`` (outermost first), what
    ``executor_runner --inputs`` copies in and ``--output_file`` writes out."""
    data: bytes = tensor.permute(*dim_order).contiguous().numpy().tobytes()
    return data


def _perturbed(tensor: Any, seed: int) -> Any:
    """A seeded random tensor like ``tensor`` (same shape, dtype and layout)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if tensor.dtype.is_floating_point:
        noise = torch.rand(tensor.shape, generator=generator) * 2 - 1
    else:
        info = torch.iinfo(tensor.dtype)
        noise = torch.randint(info.min, info.max + 1, tensor.shape, generator=generator)
    return torch.empty_like(tensor).copy_(noise.to(tensor.dtype))


def _run_stock(
    runner: Path, pte: Path, inputs: list[bytes], folder: Path, tag: str, env: dict[str, str]
) -> tuple[list[bytes], float, float]:
    """Runs ``executor_runner`` on ``inputs`` (memory-order bytes); returns the output files'
    bytes, the load seconds and the run milliseconds it logged."""
    paths = []
    for index, data in enumerate(inputs):
        path = folder / f"{tag}_input_{index}.bin"
        path.write_bytes(data)
        paths.append(str(path))
    prefix = folder / f"{tag}_runner_out"
    for stale in folder.glob(f"{prefix.name}-*.bin"):
        stale.unlink()
    command = [
        str(runner),
        f"--model_path={pte}",
        f"--inputs={','.join(paths)}",
        f"--output_file={prefix}",
        "--print_output=none",
    ]
    process = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    log = process.stdout + process.stderr
    (folder / f"{tag}_runner.log").write_text(log)
    if process.returncode != 0:
        last = [line for line in log.splitlines() if line.startswith("E ")] or log.splitlines()
        raise RuntimeError(
            f"executor_runner exited {process.returncode}: {last[-1] if last else 'no output'} "
            f"(log: {folder / f'{tag}_runner.log'})"
        )
    loaded, executed = _LOADED.search(log), _EXECUTED.search(log)
    load_s = float(loaded.group(1)) / 1000 if loaded else float("nan")
    run_ms = float(executed.group(2)) / int(executed.group(1)) if executed else float("nan")
    outputs = []
    for index in range(len(list(folder.glob(f"{prefix.name}-*.bin")))):
        outputs.append((folder / f"{prefix.name}-{index}.bin").read_bytes())
    return outputs, load_s, run_ms


def _differing(a: bytes, b: bytes) -> int:
    """Bytes that differ, a length difference counting as that many."""
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


def compare(name: str, args: argparse.Namespace, env: dict[str, str]) -> Row:
    """Exports demo ``name``, runs it on both runners and compares; a ``Row``."""
    from etkit_exporter.core.backend_ids import VGF_BACKEND
    from etkit_exporter.core.io_params import program_input
    from etkit_exporter.programs import load_program
    from etkit_pterunner import TensorInfo

    row = Row(name)
    folder = args.work / name
    folder.mkdir(parents=True, exist_ok=True)
    print(f"[{name}] exporting for VGF ...", flush=True)
    pte, params, example = _export(name, folder, args.reuse_exports)
    program = load_program(pte)
    backends = [d.backend_id for d in program.delegates]
    if backends != [VGF_BACKEND]:
        row.skipped = (
            f"{len(backends)} delegates ({', '.join(backends) or 'none'}), not one "
            f"{VGF_BACKEND}: the stock runner has only the VGF backend"
        )
        return row
    method = program.method("forward")
    outside = sorted(set(method.operators))
    if outside:
        row.notes.append(f"operators outside the delegate: {', '.join(outside)}")
    if not all(isinstance(i, TensorInfo) for i in (*method.input_infos, *method.output_infos)):
        row.skipped = "an input or output is not a tensor: executor_runner --inputs takes tensors"
        return row
    in_orders = [i.dim_order for i in method.input_infos if isinstance(i, TensorInfo)]
    out_orders = [i.dim_order for i in method.output_infos if isinstance(i, TensorInfo)]
    values = [
        program_input(value, entry) for value, entry in zip(example, params["inputs"], strict=True)
    ]
    print(f"[{name}] etkit runner ...", flush=True)
    start = time.perf_counter()
    result = program.run(values)
    row.etkit_s = time.perf_counter() - start
    expected = [
        _memory_bytes(out, order) for out, order in zip(result.outputs, out_orders, strict=True)
    ]
    print(f"[{name}] executor_runner ...", flush=True)
    inputs = [_memory_bytes(v, order) for v, order in zip(values, in_orders, strict=True)]
    got, row.load_s, row.run_ms = _run_stock(args.runner, pte, inputs, folder, "same", env)
    if len(got) != len(expected):
        row.notes.append(f"executor_runner wrote {len(got)} outputs, etkit {len(expected)}")
    row.outputs = len(expected)
    row.nbytes = sum(len(e) for e in expected)
    row.differing = sum(
        _differing(e, g) for e, g in zip(expected, got + [b""] * len(expected), strict=False)
    )
    control = [_perturbed(values[0], args.seed), *values[1:]]
    control_inputs = [_memory_bytes(v, o) for v, o in zip(control, in_orders, strict=True)]
    perturbed, _, _ = _run_stock(args.runner, pte, control_inputs, folder, "control", env)
    row.control_differing = sum(
        _differing(e, g) for e, g in zip(expected, perturbed + [b""] * len(expected), strict=False)
    )
    return row


def _table(rows: list[Row]) -> str:
    lines = [
        "| model | outputs | bytes | differing | control differing | runner load s | run ms "
        "| etkit run s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.skipped or r.error:
            what = f"skipped: {r.skipped}" if r.skipped else f"FAILED: {r.error}"
            lines.append(f"| {r.model} | {what} | | | | | | |")
            continue
        lines.append(
            f"| {r.model} | {r.outputs} | {r.nbytes} | {r.differing} | {r.control_differing} "
            f"| {r.load_s:.2f} | {r.run_ms:.1f} | {r.etkit_s:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _arguments(argv)
        from etkit_exporter.vgf.vulkan_env import EmulationLayersMissingError, ml_emulation_env

        try:
            env = ml_emulation_env()
        except EmulationLayersMissingError as error:
            raise UsageError(str(error)) from error
    except UsageError as error:
        print(f"compare.py: error: {error}", file=sys.stderr)
        return 2
    print(f"executor_runner: {args.runner}")
    rows = []
    for name in args.models:
        try:
            row = compare(name, args, env)
        except RuntimeError as error:  # executor_runner failed: report it, go on
            row = Row(name, error=str(error))
        rows.append(row)
        for note in row.notes:
            print(f"[{name}] note: {note}")
    print(_table(rows))
    failed = [r for r in rows if not r.ok]
    for r in failed:
        reason = r.error or (
            "outputs differ" if r.differing else "the perturbed control did not differ"
        )
        print(f"FAIL {r.model}: {reason}")
    compared = [r for r in rows if r.skipped is None and r.error is None]
    if not compared:
        print("FAIL: no model could be compared")
        return 1
    if not failed:
        skipped = len(rows) - len(compared)
        print(
            f"{len(compared)} model(s): every output byte-identical, every control differs"
            + (f"; {skipped} skipped" if skipped else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
