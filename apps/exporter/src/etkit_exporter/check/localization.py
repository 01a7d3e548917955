"""Where a program diverges: each delegate call's outputs judged against the quantized PT2E
model's value of the same tensor (the ETRecord's quantized edge graph, the node
``etrecord.json`` says the call writes), and every call output upstream of a sampler's grid
judged in pixels (``check.coordinates``).

The coordinate rule is part of every verdict; the per-call judgement is made when the verdict
fails (its rows and its first failing call are what a failed report shows). Either way the
graph is run only as far as the tensors judged need (``envelope.ancestors``), each envelope run
keeps its figures of them, not their values, and nothing else of the graph is kept: memory is
one run of the quantized graph plus the tensors compared.
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from executorch.devtools import Inspector
from executorch.devtools.etrecord import parse_etrecord

from etkit_exporter.artifact.etrecord import ETRECORD_NAME, INSTRUCTION_MAP_NAME
from etkit_exporter.check.coordinates import (
    CoordinateCheck,
    coordinate_producers,
    judge_coordinates,
    sampler_sites,
)
from etkit_exporter.check.envelope import Envelope, Reducer, ancestors, rounding_envelope
from etkit_exporter.check.judgement import judge_tensor, judge_unit, run_figures
from etkit_exporter.check.references import capture, quantize_qparams, reference_program
from etkit_exporter.check.tolerance import VerifyTolerance
from etkit_exporter.core.io_params import program_input
from etkit_exporter.programs.runtime import run_with_etdump

# (stage, done, total): what a long verification reports as it goes
Progress = Callable[[str, int, int], None]


@dataclass
class CallJudgement:
    """``judge_calls``' findings: the first failing call (``None`` if none or not localized),
    every call's row, a note when nothing could be compared, the coordinate rows, and whether
    the calls were judged (``localized``)."""

    first: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    coordinates: list[dict[str, Any]] = field(default_factory=list)
    localized: bool = False


def judge_calls(
    folder: Path,
    tolerance: VerifyTolerance,
    delegate_calls: Sequence[Any] | None,
    io_params: Mapping[str, Any],
    *,
    float_export: bool = False,
    localize: bool = True,
    progress: Progress | None = None,
) -> CallJudgement:
    """Each delegate call of a run of ``folder/model.pte`` on the example inputs against the
    quantized PT2E model's value of the same tensor and that value's rounding envelope: figures
    and verdict by ``judge_tensor`` (``localize``; also made when the coordinate rule fails);
    and every call output upstream of a sampler's grid judged in pixels. ``delegate_calls``:
    the runner's records of the verified run (``keep_delegate_io``); ``None`` runs the program
    again in ``executorch.runtime`` with an ETDump and reads the delegate calls' outputs from
    its debug buffer."""

    record_path, map_path = folder / ETRECORD_NAME, folder / INSTRUCTION_MAP_NAME
    if not record_path.is_file() or not map_path.is_file():
        note = (
            f"the export has no {ETRECORD_NAME} and {INSTRUCTION_MAP_NAME} to map delegate "
            "outputs to graph nodes"
        )
        return CallJudgement(note=note)
    record = parse_etrecord(str(record_path))
    mapping = json.loads(map_path.read_text())["instructions"]
    program, inputs = reference_program(record)
    module = program.module()
    sites = sampler_sites(module.graph)
    producers = coordinate_producers(module.graph, sites)
    if delegate_calls is None and not localize and not producers:
        return CallJudgement()  # nothing observable feeds a grid: no run of the program needed
    observed = (
        _runner_outputs(delegate_calls)
        if delegate_calls is not None
        else _etdump_outputs(folder, record, io_params)
    )
    calls = []
    for instruction, backend, outputs in observed:
        entry = mapping.get(str(instruction)) or {}
        names = entry.get("outputs") or []
        outputs = list(outputs)[-len(names) :] if names else []  # an ETDump logs inputs first
        calls.append((instruction, backend, entry, list(zip(outputs, names, strict=False))))
    values = {n: v for *_, pairs in calls for v, n in pairs if n and isinstance(v, torch.Tensor)}
    del observed

    # the coordinate rule: the grids the observed tensors feed, and their envelope
    fed = {i for name in values for i in producers.get(name, [])}
    grids = {sites[i].grid for i in fed}
    nodes = {n.name: n for n in module.graph.nodes}
    check = CoordinateCheck(
        sites,
        producers,
        capture(module, inputs, keep=grids, needed=ancestors(module.graph, grids)),
        lambda name, value: capture(
            module, inputs, {name: value}, keep=grids, needed=ancestors(module.graph, grids)
        ),
    )
    judgement = CallJudgement()
    quantized: dict[str, Any] = {}
    call_reducers: dict[str, Reducer] = {}
    if localize:
        quantized = capture(module, inputs, keep=values, needed=ancestors(module.graph, values))
        call_reducers = _call_reducers(values, quantized, nodes)
    envelope = _envelope(
        module, inputs, tolerance, _combined(check.reducers(), call_reducers), float_export,
        progress,
    )  # fmt: skip
    judgement.coordinates = judge_coordinates(
        values,
        check,
        lambda grid: _figures_of(envelope, grid, "grid"),
        tolerance.coordinate_bias_px,
        _stage(progress, "coordinates"),
    )
    wrong_place = next((c for c in judgement.coordinates if not c["passes"]), None)
    if not localize and wrong_place is None:
        return judgement
    if not localize:  # the coordinate rule failed: where, call by call
        quantized = capture(module, inputs, keep=values, needed=ancestors(module.graph, values))
        envelope = _envelope(
            module, inputs, tolerance, _combined({}, _call_reducers(values, quantized, nodes)),
            float_export, progress,
        )  # fmt: skip
    judgement.localized = True
    # each node computed by the quantized model from the program's own values upstream of it
    own = capture(module, inputs, values, keep=values, needed=ancestors(module.graph, values))
    rows: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for instruction, backend, entry, pairs in calls:
        row: dict[str, Any] = {
            "instruction": instruction,
            "backend": backend,
            "ops": entry.get("ops", ""),
            "delegate": entry.get("lowered_module"),
        }
        judged: list[dict[str, Any]] = []
        local: list[dict[str, Any]] = []
        for k, (value, name) in enumerate(pairs):
            node = nodes.get(name)
            spread = _figures_of(envelope, name, "call")
            figures = _judge_call_output(
                value, quantized.get(name), node, tolerance, float_export, spread
            )
            if figures is None:
                continue
            judged.append({"output": k, "node": name, **figures})
            mine = _judge_call_output(value, own.get(name), node, tolerance, float_export, spread)
            if mine is not None:
                local.append(mine)
        if judged:
            worst = _worst(judged)
            row.update(
                {
                    "node": worst["node"],
                    "psnr_db": worst["psnr_db"],
                    "max_steps": worst.get("max_steps"),
                    "max_abs_error": worst["max_abs_error"],
                    "mean_steps": worst.get("mean_steps"),
                    "passes": all(j["passes"] for j in judged),
                }
            )
            if local:
                own_worst = _worst(local)
                row["own_inputs"] = {
                    "psnr_db": own_worst["psnr_db"],
                    "max_steps": own_worst.get("max_steps"),
                    "passes": all(j["passes"] for j in local),
                }
            if not row["passes"]:
                row["reasons"] = worst.get("reasons", [])
                row["source"] = _source_line(nodes.get(worst["node"]))
        rows.append(row)
        if first is None and row.get("passes") is False:
            row["first_failing"] = True
            first = dict(row)
    if first is None and wrong_place is not None:
        row = next(r for r in rows if wrong_place["node"] in _names(r, calls))
        row["first_failing"] = True
        first = {**row, "passes": False, "reasons": wrong_place["reasons"]}
        first["source"] = _source_line(nodes.get(wrong_place["node"]))
    if first is not None and first.get("own_inputs", {}).get("passes"):
        # within tolerance on its own inputs: it carries a difference from upstream
        wrong = next((r for r in rows if r.get("own_inputs", {}).get("passes") is False), None)
        first["first_wrong_on_own_inputs"] = None if wrong is None else wrong["instruction"]
    if not any("passes" in row for row in rows):
        judgement.note = "no delegate call's output maps to a node of the quantized graph"
    judgement.first, judgement.rows = first, rows
    return judgement


def _stage(progress: Progress | None, name: str) -> Callable[[int, int], None] | None:
    return None if progress is None else (lambda done, total: progress(name, done, total))


def _envelope(
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    tolerance: VerifyTolerance,
    reducers: Mapping[str, Reducer],
    float_export: bool,
    progress: Progress | None,
) -> Envelope | None:
    """The record graph's rounding envelope of the ``reducers``' nodes, computed only as far as
    they need (``None`` for a float export or when nothing is judged)."""
    if float_export or not reducers:
        return None
    return rounding_envelope(
        module,
        inputs,
        samples=tolerance.samples,
        band=tolerance.band,
        capture=reducers,
        needed=ancestors(module.graph, reducers),
        on_run=_stage(progress, "envelope of the delegate calls"),
    )


def _combined(grids: Mapping[str, Reducer], calls: Mapping[str, Reducer]) -> dict[str, Reducer]:
    """One reducer per node judged: it keeps ``{"grid": the coordinate rule's figures, "call":
    the call judgement's}`` (``None`` for a judgement that does not read the node)."""

    def make(name: str) -> Reducer:
        grid, call = grids.get(name), calls.get(name)

        def reduce(value: torch.Tensor) -> dict[str, Any]:
            return {
                "grid": None if grid is None else grid(value),
                "call": None if call is None else call(value),
            }

        return reduce

    return {name: make(name) for name in {*grids, *calls}}


def _figures_of(envelope: Envelope | None, name: str, key: str) -> tuple[list[Any], list[Any]]:
    """Node ``name``'s figures for one judgement (``key``: "grid" or "call") in every dithered
    and every mode run of the envelope (none without one)."""
    if envelope is None:
        return [], []
    dithered, modes = envelope.node(name)

    def pick(runs: list[Any]) -> list[Any]:
        return [r[key] for r in runs if r.get(key) is not None]

    return pick(dithered), pick(modes)


def _call_reducers(
    values: Mapping[str, torch.Tensor],
    quantized: Mapping[str, Any],
    nodes: Mapping[str, torch.fx.Node],
) -> dict[str, Reducer]:
    """What an envelope run keeps of each delegate call output: its ``RunFigures`` against the
    quantized model's value, in the unit ``_judge_call_output`` judges the program's in (none
    where the two cannot be compared)."""
    reducers: dict[str, Reducer] = {}
    for name, value in values.items():
        reference = quantized.get(name)
        if not isinstance(reference, torch.Tensor) or value.numel() != reference.numel():
            continue
        qparams = quantize_qparams(nodes.get(name))
        if qparams is not None and not value.dtype.is_floating_point:
            scale, zero_point = qparams
            expected = (reference.double() - zero_point) * scale

            def integer(d: torch.Tensor, s: float = scale, z: int = zero_point,
                        e: torch.Tensor = expected) -> Any:  # fmt: skip
                return run_figures((d.double() - z) * s, e, s)

            reducers[name] = integer
        elif value.dtype.is_floating_point:
            flat = reference.double().reshape(-1)  # once, not once a run
            unit = judge_unit(flat, None)

            def real(d: torch.Tensor, r: torch.Tensor = flat, u: float = unit) -> Any:
                return run_figures(d, r, u) if d.dtype.is_floating_point else None

            reducers[name] = real
    return reducers


def _names(row: Mapping[str, Any], calls: Sequence[Any]) -> set[str]:
    """The node names a call row's instruction writes."""
    for instruction, _backend, _entry, pairs in calls:
        if instruction == row["instruction"]:
            return {n for _v, n in pairs if n}
    return set()


def _judge_call_output(
    value: Any,
    reference: Any,
    node: torch.fx.Node | None,
    tolerance: VerifyTolerance,
    float_export: bool,
    spread: tuple[list[Any], list[Any]] = ([], []),
) -> dict[str, Any] | None:
    """A delegate call's output ``value`` against ``reference`` (the value of the quantized
    graph's ``node``) and that node's envelope figures (``spread``: dithered, modes):
    ``judge_tensor``'s figures, in steps of the node's scale for an integer output; ``None``
    where the two cannot be compared."""
    if not isinstance(value, torch.Tensor) or not isinstance(reference, torch.Tensor):
        return None
    if value.numel() != reference.numel():
        return None
    qparams = quantize_qparams(node)
    dithered, modes = spread
    if qparams is not None and not value.dtype.is_floating_point:
        scale, zero_point = qparams

        def real(t: torch.Tensor) -> torch.Tensor:
            return (t.double() - zero_point) * scale

        expected = real(reference)
        return judge_tensor(
            real(value).reshape(expected.shape),
            expected,
            scale,
            tolerance,
            envelope=dithered,
            modes=modes,
        )
    if value.dtype.is_floating_point:
        return judge_tensor(
            value.double().reshape(reference.shape),
            reference.double(),
            None,
            tolerance,
            envelope=dithered,
            modes=modes,
            float_reference=float_export,
        )
    return None


def _worst(judged: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Of a call's judged outputs, a failing one first, then the one most steps off."""
    return min(judged, key=lambda j: (j["passes"], -(j.get("max_steps") or 0)))


def _runner_outputs(calls: Sequence[Any]) -> list[tuple[int, str, list[torch.Tensor]]]:
    return [
        (int(call.instruction), str(call.backend_id), list(call.outputs or ())) for call in calls
    ]


def _etdump_outputs(
    folder: Path, record: Any, io_params: Mapping[str, Any]
) -> list[tuple[int, str, list[torch.Tensor]]]:
    """The delegate calls of a run of ``folder/model.pte`` in ``executorch.runtime`` with an
    ETDump, on the record's representative inputs: instruction, backend, and the tensors its
    debug buffer holds for the call (its inputs, then its outputs: ``judge_calls`` takes the
    last ones)."""

    inputs = [
        program_input(x, entry)
        for x, entry in zip(record._representative_inputs, io_params["inputs"], strict=True)
    ]
    found: list[tuple[int, str, list[torch.Tensor]]] = []
    with tempfile.TemporaryDirectory(prefix="etkit-verdict-") as scratch:
        etdump, debug = Path(scratch) / "run.etdp", Path(scratch) / "run.debug"
        run_with_etdump(folder / "model.pte", inputs, etdump, debug, isolated=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inspector = Inspector(
                etdump_path=str(etdump), etrecord=record, debug_buffer_path=str(debug)
            )
        for block in inspector.event_blocks:
            for event in block.events:
                instruction = getattr(event, "_instruction_id", None)
                if event.name != "DELEGATE_CALL" or instruction is None:
                    continue
                data = [d for d in (event.debug_data or []) if isinstance(d, torch.Tensor)]
                found.append((int(instruction), str(event.delegate_backend_name or ""), data))
    return found


_FRAME: Final = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_QDQ_NAMES: Final = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
                     "dequantize_per_channel", "_to_dim_order_copy", "clone")  # fmt: skip


def _source_line(node: torch.fx.Node | None) -> str | None:
    """The model's source line that computes ``node``'s value (its stack trace's innermost frame
    outside torch), through the quantize/dequantize and layout copies after it."""
    for _ in range(8):
        if node is None:
            return None
        trace = node.meta.get("stack_trace")
        if isinstance(trace, str) and not any(q in str(node.target) for q in _QDQ_NAMES):
            frames = [
                m
                for m in _FRAME.finditer(trace)
                if "torch/" not in m.group(1) and "torchao/" not in m.group(1)
            ]
            if frames:
                file, line, function, code = frames[-1].groups()
                return f"{file}:{line} in {function}: {code.strip()}"
        previous = node.args[0] if node.args else None
        node = previous if isinstance(previous, torch.fx.Node) else None
    return None
