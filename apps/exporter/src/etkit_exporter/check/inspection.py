"""``etkit inspect ARTIFACTS``: per instruction of an export (each operator and each delegate
call), its time and how far its output is from the quantized and from the float model.

An XNNPACK export runs in ``executorch.runtime`` with an ETDump (intermediate outputs in a debug
buffer), read by ExecuTorch's ``Inspector`` with the export's ``etrecord.bin``: its events
(operators, delegate calls, the events delegates log inside, e.g. XNNPACK's operators and the
grid sampler's ``grid_sampler_2d``) with their times. A VGF export, which that runtime cannot run,
runs in etkit's Python runner (VGF delegates on the Vulkan device through ``scenario_runner``):
its per-instruction times, and for each grid-sampler call the verification's comparison with the
grid-sampler contract (report.json ``verification["delegates"]``).

The errors are etkit's own (docs/inspect.md says why not ``Inspector.calculate_numeric_gap``'s):
each instruction's output, as the runtime wrote it, against the value of the node that computes
it (``etrecord.json``) in the record's quantized graph run on the representative inputs (in
quantization steps when it is a quantized tensor, and PSNR), and against the float model's value
of the node it came from (``float_model/forward`` in the record, matched through ``from_node``).
The last instruction's rows therefore repeat the end-to-end verification, which
``outputs`` checks.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from executorch.devtools import Inspector
from executorch.devtools.etrecord import parse_etrecord

from etkit_exporter.artifact.etrecord import ETRECORD_NAME, INSTRUCTION_MAP_NAME, REFERENCE_GRAPH
from etkit_exporter.artifact.report import render_markdown
from etkit_exporter.artifact.sizes_text import size_lines
from etkit_exporter.artifact.staging import MANIFEST, foreign_content, write_manifest
from etkit_exporter.check.metrics import psnr
from etkit_exporter.check.references import QDQ_OPS, References, quantize_qparams, reference_values
from etkit_exporter.check.verdict import verdict_notes
from etkit_exporter.core.errors import InspectError as InspectError
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.programs import GridSamplerImpl, load_program
from etkit_exporter.programs.runtime import etdump_buffer_size, run_with_etdump, runtime_can_run

INSPECT_KEY: Final = "inspect"
# Inspector events that are the runtime's own work, not an instruction of the program
_FRAMEWORK_EVENTS: Final = frozenset({"Method::init", "Program::load_method", "Method::execute"})


@dataclass
class Row:
    """One line of the table: an instruction (``depth`` 0), or an event a delegate logged
    inside its call (``depth`` 1)."""

    instruction: int | None
    event: str
    backend: str
    ops: str
    ms: float | None
    depth: int = 0
    node: str | None = None
    vs_quantized: dict[str, Any] | None = None
    vs_float: dict[str, Any] | None = None
    vs_ideal: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "instruction": self.instruction,
            "event": self.event,
            "backend": self.backend,
            "ops": self.ops,
            "ms": None if self.ms is None else round(self.ms, 4),
            "depth": self.depth,
            "node": self.node,
            "vs_quantized": self.vs_quantized,
            "vs_float": self.vs_float,
            "vs_ideal": self.vs_ideal,
        }


@dataclass
class Inspection:
    """What ``inspect_export`` found (``as_dict`` is report.json's ``inspect``)."""

    target: str
    runner: str
    rows: list[Row]
    outputs: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    events: int = 0
    upstream_numeric_gap: list[dict[str, Any]] | None = None
    seconds: float = 0.0

    @property
    def outside_delegates(self) -> dict[str, Any] | None:
        return outside_delegates(self.rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "runner": self.runner,
            "events": self.events,
            "outside_delegates": self.outside_delegates,
            "rows": [row.as_dict() for row in self.rows],
            "outputs": self.outputs,
            "upstream_numeric_gap": self.upstream_numeric_gap,
            "notes": self.notes,
        }


def outside_delegates(rows: Sequence[Row], slowest: int = 3) -> dict[str, Any] | None:
    """The time of the instructions that run outside every delegate (kernels) against that of
    all instructions (each instruction's row, ``depth`` 0, timed): ``ms``, ``outside_ms``,
    ``share`` and the ``slowest`` kernels (``[event, ms]``); ``None`` when nothing was timed."""
    top = [r for r in rows if r.depth == 0 and r.ms is not None]
    if not top:
        return None
    kernels = sorted((r for r in top if r.backend == "kernel"), key=lambda r: -(r.ms or 0.0))
    total = sum(r.ms or 0.0 for r in top)
    outside = sum(r.ms or 0.0 for r in kernels)
    return {
        "ms": round(total, 3),
        "outside_ms": round(outside, 3),
        "share": round(outside / total, 4) if total else 0.0,
        "slowest": [[r.event, round(r.ms or 0.0, 3)] for r in kernels[:slowest]],
    }


def event_row(event: Any) -> Row | None:
    """The table's row of one event of ExecuTorch's Inspector, without comparisons; ``None``
    for the framework's own events (loading, ``Method::execute``, ``OPERATOR_CALL``)."""
    if event.name in _FRAMEWORK_EVENTS or event.name == "OPERATOR_CALL":
        return None
    return Row(
        instruction=getattr(event, "_instruction_id", None),
        event=event.name,
        backend=event.delegate_backend_name or _unnamed_backend(event),
        ops=_ops_summary(event.op_types),
        ms=event.perf_data.avg if event.perf_data is not None else None,
        depth=1 if event.is_delegated_op else 0,
    )


def _unnamed_backend(event: Any) -> str:
    """What runs an event whose backend the Inspector could not name (no ETRecord): a delegate
    call is still a delegate's, an event inside one none, any other a kernel."""
    if event.name == "DELEGATE_CALL":
        return "delegate"
    return "" if event.is_delegated_op else "kernel"


def outside_delegates_line(figures: dict[str, Any] | None) -> str | None:
    """One line for ``outside_delegates``' figures."""
    if figures is None:
        return None
    line = (
        f"time outside delegates: {figures['outside_ms']:.3f} of {figures['ms']:.3f} ms "
        f"({100 * figures['share']:.1f} %)"
    )
    if figures["slowest"]:
        line += "; slowest: " + ", ".join(f"{e} {ms:.3f} ms" for e, ms in figures["slowest"])
    return line


# ---------------------------------------------------------------------------------------------
# Reading the export


@dataclass
class _Export:
    folder: Path
    report: dict[str, Any]
    io_params: dict[str, Any]
    record: Any
    instructions: dict[int, dict[str, Any]]

    @property
    def target(self) -> str:
        return str(self.report.get("target", "xnnpack"))

    @property
    def pte(self) -> Path:
        return self.folder / "model.pte"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InspectError(f"{path.parent}: no {path.name}; is it an etkit export?") from None
    except (OSError, ValueError) as error:
        raise InspectError(f"{path}: not readable ({error})") from error


def _read_export(folder: Path) -> _Export:
    if not folder.is_dir():
        raise InspectError(f"{folder}: no such folder")
    for name in ("model.pte", ETRECORD_NAME, INSTRUCTION_MAP_NAME):
        if not (folder / name).is_file():
            extra = (
                " (an export older than etkit inspect? export again)" if name != "model.pte" else ""
            )
            raise InspectError(f"{folder}: no {name}{extra}")

    try:
        record = parse_etrecord(str(folder / ETRECORD_NAME))
    except Exception as error:
        raise InspectError(f"{folder / ETRECORD_NAME}: not an ETRecord ({error})") from error
    mapping = _read_json(folder / INSTRUCTION_MAP_NAME)
    return _Export(
        folder=folder,
        report=_read_json(folder / "report.json"),
        io_params=_read_json(folder / "io_quant_params.json"),
        record=record,
        instructions={int(k): v for k, v in mapping.get("instructions", {}).items()},
    )


# ---------------------------------------------------------------------------------------------
# Comparisons


def _as_logical(runtime: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``runtime`` (an ETDump tensor: its elements in memory order, shaped by its sizes) in the
    reference's logical layout when the reference is channels-last."""
    if (
        runtime.dim() == 4
        and reference.dim() == 4
        and reference.is_contiguous(memory_format=torch.channels_last)
        and not reference.is_contiguous()
    ):
        n, c, h, w = runtime.shape
        return runtime.contiguous().reshape(n, h, w, c).permute(0, 3, 1, 2)
    return runtime


def _db(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _versus_quantized(
    runtime: torch.Tensor, reference: torch.Tensor, qparams: tuple[float, int] | None
) -> dict[str, Any]:
    if runtime.shape != reference.shape:
        return {"skipped": f"shape {list(runtime.shape)} vs {list(reference.shape)}"}
    result: dict[str, Any] = {}
    if qparams is not None and not runtime.dtype.is_floating_point:
        steps = (runtime.long() - reference.long()).abs()
        result["max_steps"] = int(steps.max()) if steps.numel() else 0
        result["steps_histogram"] = {
            **{str(k): int((steps == k).sum()) for k in range(3)},
            "more": int((steps > 2).sum()),
        }
        scale, zero_point = qparams
        runtime = (runtime.double() - zero_point) * scale
        reference = (reference.double() - zero_point) * scale
    difference = (runtime.double() - reference.double()).abs()
    result["max_abs_error"] = float(difference.max()) if difference.numel() else 0.0
    result["psnr_db"] = _db(psnr(runtime.double(), reference.double()))
    return result


def _versus_float(value: torch.Tensor, candidates: list[torch.Tensor]) -> dict[str, Any] | None:
    """``value`` (float, logical layout) against the float model's value of the same origin;
    a padded RGBA tensor is compared on the float model's channels."""
    fitting: list[tuple[torch.Tensor, str]] = []
    for candidate in candidates:
        if candidate.shape == value.shape:
            fitting.append((candidate, ""))
        elif (
            candidate.dim() == value.dim() == 4
            and candidate.shape[0] == value.shape[0]
            and candidate.shape[2:] == value.shape[2:]
            and candidate.shape[1] < value.shape[1]
        ):
            note = f"channels 0-{candidate.shape[1] - 1} of {value.shape[1]}"
            fitting.append((candidate, note))
    if len(fitting) != 1:
        return None
    reference, note = fitting[0]
    compared = value[:, : reference.shape[1]] if note else value
    result: dict[str, Any] = {
        "max_abs_error": float((compared.double() - reference.double()).abs().max()),
        "psnr_db": _db(psnr(compared.double(), reference.double())),
    }
    if note:
        result["note"] = note
    return result


def _compare(
    runtime: Any, name: str | None, references: References
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``runtime`` (one output of an instruction) against node ``name`` in the quantized graph
    and against the float model."""
    if name is None or not isinstance(runtime, torch.Tensor):
        return None, None
    reference = references.quantized.get(name)
    if not isinstance(reference, torch.Tensor):
        return None, None
    runtime = _as_logical(runtime, reference)
    qparams = quantize_qparams(references.nodes.get(name))
    quantized = _versus_quantized(runtime, reference, qparams)
    if runtime.shape != reference.shape:
        return quantized, None
    value = runtime.double()
    if qparams is not None and not runtime.dtype.is_floating_point:
        value = (value - qparams[1]) * qparams[0]
    candidates = references.float_candidates(name)
    node = references.nodes.get(name)
    if not candidates and qparams is not None and node is not None:
        # a quantize of a value the float model has not (a grid at the sampler): its input's
        producer = node.args[0]
        if isinstance(producer, torch.fx.Node):
            candidates = references.float_candidates(producer.name)
    versus_float = (
        _versus_float(value, candidates)
        if runtime.dtype.is_floating_point or qparams is not None
        else None
    )
    return quantized, versus_float


def _ops_summary(op_types: Iterable[str], limit: int = 4) -> str:
    names: list[str] = []
    qdq = 0
    for op in op_types:
        short = op.split(".")[1] if op.count(".") >= 2 else op
        if any(q in op for q in QDQ_OPS):
            qdq += 1
            continue
        if short not in names:
            names.append(short)
    text = ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")
    if qdq:
        text += (" " if text else "") + f"({qdq} Q/DQ)"
    return text


# ---------------------------------------------------------------------------------------------
# Running


def _program_inputs(export: _Export) -> list[torch.Tensor]:
    inputs = list(export.record._representative_inputs or [])
    entries = export.io_params["inputs"]
    if len(inputs) != len(entries):
        raise InspectError(
            f"the ETRecord holds {len(inputs)} representative inputs, the program takes "
            f"{len(entries)}"
        )
    return [program_input(x, entry) for x, entry in zip(inputs, entries, strict=True)]


def _output_rows(
    export: _Export, outputs: Sequence[Any], references: References
) -> list[dict[str, Any]]:
    """Each program output against the quantized graph's and the float model's output, beside
    the verification's figures (report.json) for the same comparisons."""
    reference_outputs = _graph_outputs(export.record)
    with torch.no_grad():
        float_outputs = _float_outputs(export.record)
    verification = export.report.get("verification") or {}
    rows = []
    for index, (value, entry) in enumerate(zip(outputs, export.io_params["outputs"], strict=True)):
        if not isinstance(value, torch.Tensor):
            continue
        actual = float_output(value, entry).contiguous()
        row: dict[str, Any] = {"output": index}
        for key, refs in (
            ("vs_quantized_psnr_db", reference_outputs),
            ("vs_float_psnr_db", float_outputs),
        ):
            ref = refs[index] if refs is not None and index < len(refs) else None
            if isinstance(ref, torch.Tensor) and ref.numel() == actual.numel():
                row[key] = _db(psnr(actual.reshape(ref.shape), ref.float()))
        for comparison in verification.get("comparisons", []):
            if comparison.get("output") != index:
                continue
            key = (
                "verification_vs_quantized_psnr_db"
                if comparison["reference"].startswith("quantized")
                else "verification_vs_float_psnr_db"
            )
            row[key] = _db(comparison.get("psnr_db"))
        rows.append(row)
    return rows


def _graph_outputs(record: Any) -> list[Any] | None:
    reference = (record.graph_map or {}).get(REFERENCE_GRAPH, record.edge_dialect_program)
    with torch.no_grad():
        result = reference.module()(*record._representative_inputs)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _float_outputs_recorded(record: Any) -> bool:
    return "float_model/forward" in (record.graph_map or {})


def _float_outputs(record: Any) -> list[Any] | None:
    program = (record.graph_map or {}).get("float_model/forward")
    if program is None:
        return None
    result = program.module()(*record._representative_inputs)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _runtime_rows(
    export: _Export, references: References, workdir: Path
) -> tuple[list[Row], list[Any], int, list[dict[str, Any]] | None, list[str]]:
    etdump, debug = workdir / "run.etdp", workdir / "run.debug"
    outputs, _ = run_with_etdump(
        export.pte,
        _program_inputs(export),
        etdump,
        debug,
        debug_buffer_size=etdump_buffer_size(export.pte),
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inspector = Inspector(
            etdump_path=str(etdump), etrecord=export.record, debug_buffer_path=str(debug)
        )
    rows: list[Row] = []
    count = 0
    for block in inspector.event_blocks:
        for event in block.events:
            count += 1
            row = event_row(event)
            if row is None:
                continue
            instruction = row.instruction
            entry = export.instructions.get(instruction) if instruction is not None else None
            data = list(event.debug_data or [])
            compare_to = None
            if entry is not None and data:
                names = entry.get("outputs") or []
                if event.is_delegated_op:
                    # a delegate's own event logs its output (the grid sampler's does)
                    compare_to = names[-1] if len(names) == 1 and len(data) == 1 else None
                    row.node = _source_node(event, references)
                else:
                    compare_to = names[0] if len(names) == 1 and len(data) >= 1 else None
                    row.node = compare_to
            if compare_to is not None:
                row.vs_quantized, row.vs_float = _compare(data[-1], compare_to, references)
            rows.append(row)
    upstream: list[dict[str, Any]] | None
    try:
        upstream = _upstream_numeric_gap(inspector)
    except Exception as error:  # upstream's own failure is a finding, not ours
        upstream = [{"error": f"{type(error).__name__}: {error}"}]
    notes = [
        f"{export.pte.name} ran in executorch.runtime with an ETDump ({count} events) read by "
        f"ExecuTorch's Inspector with {ETRECORD_NAME}"
    ]
    return rows, outputs, count, upstream, notes


def _source_node(event: Any, references: References) -> str | None:
    """The source node a delegate's own event stands for: the grid sampler's event, the
    grid_sample node its debug handle names."""
    handles = event.debug_handles
    handles = [handles] if isinstance(handles, int) else list(handles or [])
    names = [
        node.name
        for node in references.nodes.values()
        if node.meta.get("debug_handle") in handles and "grid_sampler" in str(node.target)
    ]
    return names[0] if len(names) == 1 else None


def _upstream_numeric_gap(inspector: Any) -> list[dict[str, Any]]:
    """``Inspector.calculate_numeric_gap("SNR")``, one row per matched group (for the docs'
    comparison; etkit's own figures are in the rows)."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = inspector.calculate_numeric_gap("SNR")
    rows = []
    for _, item in frame.iterrows():
        gaps = list(item["gap"]) if isinstance(item["gap"], (list, tuple)) else [item["gap"]]
        runtime = item["runtime_intermediate_output"]
        aot = item["aot_intermediate_output"]
        rows.append(
            {
                "aot_ops": list(item["aot_ops"]),
                "runtime_ops": list(item["runtime_ops"]),
                "snr_db": [None if not math.isfinite(g) else round(float(g), 2) for g in gaps],
                "aot_dtype": str(getattr(aot, "dtype", "")).removeprefix("torch."),
                "runtime_dtype": str(getattr(runtime, "dtype", "")).removeprefix("torch."),
            }
        )
    return rows


def _runner_rows(
    export: _Export, references: References, grid_sampler_impl: GridSamplerImpl
) -> tuple[list[Row], list[Any], list[str]]:
    program = load_program(export.pte, grid_sampler_impl=grid_sampler_impl)
    result = program.run(_program_inputs(export), keep_values=True, keep_delegate_io=True)
    ideal = {
        row.get("instruction"): row
        for row in (export.report.get("verification") or {}).get("delegates", [])
    }
    written: dict[int, list[Any]] = {}
    for record in (result.values or {}).values():
        if record.source == "instruction" and record.instruction is not None:
            written.setdefault(record.instruction, []).append(record.value)
    calls: list[tuple[float, Row]] = []
    for kernel in result.kernel_calls:
        entry = export.instructions.get(kernel.instruction, {})
        names = entry.get("outputs") or []
        row = Row(kernel.instruction, kernel.operator, "kernel", "", 1000 * kernel.seconds)
        values = written.get(kernel.instruction, [])
        if len(names) == 1 and len(values) == 1:
            row.node = names[0]
            row.vs_quantized, row.vs_float = _compare(values[0], names[0], references)
        calls.append((kernel.started, row))
    for call in result.delegate_calls:
        entry = export.instructions.get(call.instruction, {})
        names = entry.get("outputs") or []
        row = Row(
            call.instruction, "DELEGATE_CALL", call.backend_id, call.implementation,
            1000 * call.seconds,
        )  # fmt: skip
        if call.outputs is not None and len(names) == len(call.outputs) == 1:
            row.node = names[0]
            row.vs_quantized, row.vs_float = _compare(call.outputs[0], names[0], references)
        verified = ideal.get(call.instruction)
        if verified is not None and "max_steps_vs_ideal" in verified:
            row.vs_ideal = {
                key: verified[key]
                for key in ("mode", "max_steps_vs_ideal", "steps_histogram", "ties")
                if key in verified
            }
        calls.append((call.started, row))
    rows = [row for _, row in sorted(calls, key=lambda item: item[0])]
    notes = [
        f"executorch.runtime cannot run {export.pte.name} (its VgfBackend delegates): it ran in "
        "etkit's Python runner (VGF on scenario_runner, Vulkan); times are the runner's, per "
        "instruction, and there is no ETDump for ExecuTorch's Inspector",
    ]
    if ideal:
        notes.append(
            "vs ideal: each grid-sampler call against the grid-sampler contract on the integer "
            "inputs the program gave it, from the export's verification"
        )
    else:
        notes.append("export with --verify to hold each grid-sampler call to its contract")
    return rows, list(result.outputs), notes


NO_FLOAT_MODEL = (
    "the ETRecord holds no float model (the default slim record): no 'vs float' figures; "
    "export with --etrecord full for them"
)


def inspect_export(folder: str | Path, *, grid_sampler_impl: GridSamplerImpl = "cpu") -> Inspection:
    """Inspects the export in ``folder`` (see the module's docstring). Raises ``InspectError``
    for a folder that is not a complete etkit export with an ETRecord."""
    began = time.perf_counter()
    export = _read_export(Path(folder))
    references = reference_values(export.record)
    upstream: list[dict[str, Any]] | None = None
    if runtime_can_run(export.pte):
        with tempfile.TemporaryDirectory(prefix="etkit-inspect-") as scratch:
            rows, outputs, events, upstream, notes = _runtime_rows(
                export, references, Path(scratch)
            )
        runner = "executorch.runtime (ETDump, Inspector)"
    else:
        rows, outputs, notes = _runner_rows(export, references, grid_sampler_impl)
        events = len(rows)
        runner = "etkit runner (VGF on scenario_runner, Vulkan)"

    return Inspection(
        target=export.target,
        runner=runner,
        rows=rows,
        outputs=_output_rows(export, outputs, references),
        notes=size_lines(export.report.get("sizes"))
        + verdict_notes(export.report.get("verification"))
        + notes
        + ([] if _float_outputs_recorded(export.record) else [NO_FLOAT_MODEL])
        + [line for line in [outside_delegates_line(outside_delegates(rows))] if line],
        events=events,
        upstream_numeric_gap=upstream,
        seconds=time.perf_counter() - began,
    )


# ---------------------------------------------------------------------------------------------
# Output


def _figure(result: dict[str, Any] | None, steps: bool) -> str:
    if not result:
        return ""
    if "skipped" in result:
        return "n/a"
    db = result.get("psnr_db")
    text = "inf dB" if db is None else f"{db:.1f} dB"
    if steps and "max_steps" in result:
        text = f"{result['max_steps']} st, " + text
    return text


def table_lines(inspection: Inspection | dict[str, Any]) -> list[str]:
    """The table as text lines (also what report.md's section is made from)."""
    data = inspection.as_dict() if isinstance(inspection, Inspection) else inspection
    header = (
        f"{'instr':>5}  {'event':<34} {'backend':<19} {'ms':>8}  {'vs quantized':>15}  "
        f"{'vs float':>9}  {'vs ideal':>8}  source"
    )
    lines = [header, "-" * len(header)]
    for row in data["rows"]:
        event = ("  " * row["depth"]) + row["event"]
        ms = "" if row["ms"] is None else f"{row['ms']:.3f}"
        delegate_call = row["depth"] == 0 and row["backend"] not in ("kernel", "")
        source = (row["ops"] if delegate_call else None) or row["node"] or row["ops"]
        ideal = row.get("vs_ideal")
        ideal_text = f"{ideal['max_steps_vs_ideal']} st" if ideal else ""
        instruction = "" if row["instruction"] is None else str(row["instruction"])
        lines.append(
            f"{instruction:>5}  {event[:34]:<34} {row['backend'][:19]:<19} {ms:>8}  "
            f"{_figure(row['vs_quantized'], True):>15}  {_figure(row['vs_float'], False):>9}  "
            f"{ideal_text:>8}  {source}"
        )
    return lines


def output_lines(inspection: Inspection | dict[str, Any]) -> list[str]:
    data = inspection.as_dict() if isinstance(inspection, Inspection) else inspection

    def db(value: Any) -> str:
        return "inf" if value is None else f"{value:.2f}"

    lines = []
    for row in data["outputs"]:
        quantized = db(row.get("vs_quantized_psnr_db"))
        text = f"output {row['output']}: {quantized} dB vs the quantized model"
        if "vs_float_psnr_db" in row:  # not without the float model in the record
            text += f", {db(row['vs_float_psnr_db'])} dB vs the float model"
        if "verification_vs_quantized_psnr_db" in row or "verification_vs_float_psnr_db" in row:
            text += (
                f" (verification: {db(row.get('verification_vs_quantized_psnr_db'))} and "
                f"{db(row.get('verification_vs_float_psnr_db'))} dB)"
            )
        lines.append(text)
    return lines


def print_inspection(inspection: Inspection, write: Callable[[str], object] = print) -> None:
    for note in inspection.notes:
        write(note)
    write("")
    for line in table_lines(inspection):
        write(line)
    write("")
    for line in output_lines(inspection):
        write(line)


def write_into_report(folder: Path, inspection: Inspection) -> None:
    """Adds the inspection to the export's report (report.json ``inspect``, report.md's
    "Inspection" section) and lists the changed files in its manifest again. Refuses a folder
    whose files differ from its manifest (``InspectError``)."""

    foreign = foreign_content(folder)
    if foreign is None or foreign:
        why = "no valid manifest" if foreign is None else f"changed since: {', '.join(foreign)}"
        raise InspectError(f"{folder}: not an intact etkit export ({why}); not writing the report")
    manifest = json.loads((folder / MANIFEST).read_text())
    report = json.loads((folder / "report.json").read_text())
    report[INSPECT_KEY] = inspection.as_dict()
    for name, text in (
        ("report.json", json.dumps(report, indent=2, default=str) + "\n"),
        ("report.md", render_markdown(report)),
    ):
        staged = folder / f".{name}.partial"
        staged.write_text(text)
        staged.replace(folder / name)
    write_manifest(folder, manifest.get("producer", {}))
