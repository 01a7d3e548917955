"""Model Explorer per-node data ("Add per-node data" in its UI) from an export's verification:
per delegate call of ``model.pte``'s ``forward``, its time and its error, keyed by the node ids
of the ``.pte`` adapters (``attributes.node_id``).

The files are Model Explorer's ``ModelNodeData`` JSON (``model_explorer.node_data_builder``:
graph id -> ``{"results": {node id: {"value": ..., "bgColor": ...}}, "thresholds" | "gradient"}``),
written here with ``json`` so that verification needs no Model Explorer. One value per node and
file, so there are four:

- ``model_explorer_node_data.json``: every measured delegate, a line of text
  (``0.436 ms; 0 steps vs ideal; output 1: 0 steps, identical to the quantized model``),
  the node coloured by its largest error in steps (green 0, yellow 1, orange more);
- ``model_explorer_node_data_ms.json``: the call's time in milliseconds;
- ``model_explorer_node_data_steps.json``: its error in output quantization steps: a grid
  sampler's output against the contract's ideal on its own inputs (``max_steps_vs_ideal``),
  else the program output the delegate writes against the quantized PT2E model;
- ``model_explorer_node_data_db.json``: the PSNR in dB of the program output the delegate
  writes against the quantized PT2E model (absent where identical or not measured).

When the verdict failed, each delegate call that the localization compared (its own output
against the quantized PT2E model's value of the same tensor, ``verification["verdict"]
["delegate_calls"]``) says so in ``model_explorer_node_data.json`` (``vs PT2E: 4 steps max,
38.1 dB: FIRST TO FAIL``), coloured red when it fails, and its figures are those of
``_steps.json`` and ``_db.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from etkit_exporter.model_explorer.attributes import DelegateCallSite, delegate_call_sites
from etkit_pterunner import MethodInfo, PteProgram

NODE_DATA_FILE: Final = "model_explorer_node_data.json"
MS_FILE: Final = "model_explorer_node_data_ms.json"
STEPS_FILE: Final = "model_explorer_node_data_steps.json"
DB_FILE: Final = "model_explorer_node_data_db.json"
QUANTIZED_REFERENCE: Final = "quantized PT2E model"

GREEN, YELLOW, ORANGE, RED = "#c8e6c9", "#fff59d", "#ffcc80", "#ef9a9a"


@dataclass(frozen=True)
class OutputError:
    """A program output a delegate writes, against the quantized PT2E model."""

    output: int  # the program output; -1: the delegate's own output (the localization's)
    max_steps: int | None
    psnr_db: float | None  # None: identical (or not measured)


@dataclass
class DelegateFigures:
    """What verification measured of one delegate-call instruction."""

    node_id: str
    backend: str
    milliseconds: float | None = None
    steps_vs_ideal: int | None = None
    outputs: list[OutputError] = field(default_factory=list)
    verdict: str | None = None  # "ok", "fails", "first to fail": the localization's

    @property
    def steps(self) -> int | None:
        """The grid sampler's steps against the contract's ideal, else the largest steps of the
        program outputs it writes against the quantized model."""
        if self.steps_vs_ideal is not None:
            return self.steps_vs_ideal
        measured = [o.max_steps for o in self.outputs if o.max_steps is not None]
        return max(measured) if measured else None

    @property
    def psnr_db(self) -> float | None:
        """The lowest PSNR of the program outputs it writes against the quantized model."""
        measured = [o.psnr_db for o in self.outputs if o.psnr_db is not None]
        return min(measured) if measured else None

    @property
    def worst_steps(self) -> int | None:
        measured = [o.max_steps for o in self.outputs if o.max_steps is not None]
        if self.steps_vs_ideal is not None:
            measured.append(self.steps_vs_ideal)
        return max(measured) if measured else None

    def summary(self) -> str:
        parts = []
        if self.milliseconds is not None:
            parts.append(f"{self.milliseconds:.3f} ms")
        if self.steps_vs_ideal is not None:
            parts.append(f"{_steps(self.steps_vs_ideal)} vs ideal")
        if self.verdict is not None:
            parts.append(f"verdict vs the quantized model: {self.verdict}")
        for o in self.outputs:
            label = "its output" if o.output < 0 else f"output {o.output}"
            if o.psnr_db is None and o.max_steps in (0, None):
                parts.append(f"{label}: identical to the quantized model")
                continue
            figures = [] if o.max_steps is None else [_steps(o.max_steps)]
            if o.psnr_db is not None:
                figures.append(f"{o.psnr_db:.2f} dB")
            parts.append(f"{label}: {', '.join(figures)} vs the quantized model")
        return "; ".join(parts)


def _steps(count: int) -> str:
    return f"{count} step" + ("" if count == 1 else "s")


def _steps_color(steps: int | None) -> str | None:
    if steps is None:
        return None
    return GREEN if steps == 0 else YELLOW if steps == 1 else ORANGE


def _output_producers(method: MethodInfo) -> dict[int, DelegateCallSite]:
    """Program output index -> the delegate call that writes it (the first instruction that
    names its value), for outputs a delegate writes."""
    sites = {(s.chain, s.instruction.position): s for s in delegate_call_sites(method)}
    producers: dict[int, DelegateCallSite] = {}
    for k, value in enumerate(method.outputs):
        if value in method.inputs:
            continue
        for chain_index, chain in enumerate(method.chains):
            touching = [
                i for i in chain if value in i.args or value in (i.move_to, i.move_from, i.value)
            ]
            if touching:
                site = sites.get((chain_index, touching[0].position))
                if site is not None:
                    producers[k] = site
                break
    return producers


def _verification(folder: Path, verification: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if verification is not None:
        return verification
    report = json.loads((folder / "report.json").read_text())
    found = report.get("verification")
    if not isinstance(found, dict):
        raise ValueError(
            f"{folder / 'report.json'} holds no verification: export with verify=True "
            "(etkit-export --verify)"
        )
    return found


def delegate_figures(
    artifacts_dir: str | Path, verification: Mapping[str, Any] | None = None
) -> list[DelegateFigures]:
    """Per delegate-call instruction of ``forward`` that verification measured or whose output
    it compared: its node id, time, error in steps and dB (see the module's docstring). Reads
    ``model.pte`` in ``artifacts_dir`` and, unless ``verification`` (report.json's
    ``verification`` object) is given, ``report.json`` there; raises ``FileNotFoundError`` when
    one is missing and ``ValueError`` when the report holds no verification."""
    folder = Path(artifacts_dir)
    verification = _verification(folder, verification)
    method = PteProgram.load(folder / "model.pte").method("forward")
    sites = {(s.chain, s.instruction.position): s for s in delegate_call_sites(method)}
    figures: dict[str, DelegateFigures] = {}

    def entry(site: DelegateCallSite) -> DelegateFigures:
        if site.node_id not in figures:
            figures[site.node_id] = DelegateFigures(site.node_id, site.delegate.backend_id)
        return figures[site.node_id]

    for row in verification.get("delegates") or []:
        site = sites.get((int(row.get("chain", 0)), int(row["instruction"])))
        if site is None:
            continue
        item = entry(site)
        milliseconds = float(row["seconds"]) * 1000
        item.milliseconds = milliseconds + (item.milliseconds or 0.0)
        if row.get("max_steps_vs_ideal") is not None:
            steps = int(row["max_steps_vs_ideal"])
            item.steps_vs_ideal = max(steps, item.steps_vs_ideal or 0)
    producers = _output_producers(method)
    for comparison in verification.get("comparisons") or []:
        if comparison.get("reference") != QUANTIZED_REFERENCE:
            continue
        site = producers.get(int(comparison["output"]))
        if site is None:
            continue
        steps = comparison.get("max_steps")
        db = comparison.get("psnr_db")
        entry(site).outputs.append(
            OutputError(
                int(comparison["output"]),
                None if steps is None else int(steps),
                None if db is None else float(db),
            )
        )
    for row in (verification.get("verdict") or {}).get("delegate_calls") or []:
        site = sites.get((int(row.get("chain", 0)), int(row["instruction"])))
        if site is None or "passes" not in row:
            continue
        item = entry(site)
        item.verdict = (
            "ok" if row["passes"] else "FIRST TO FAIL" if row.get("first_failing") else "fails"
        )
        steps = row.get("max_steps")
        item.outputs = [
            OutputError(
                -1,
                None if steps is None else int(steps),
                None if row.get("psnr_db") is None else float(row["psnr_db"]),
            )
        ]
    order = [s.node_id for s in delegate_call_sites(method)]
    return sorted(figures.values(), key=lambda f: order.index(f.node_id))


def node_data(
    artifacts_dir: str | Path, verification: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """File name -> Model Explorer ``ModelNodeData`` JSON object, for the four files of the
    module's docstring (a file with no values is left out); arguments as ``delegate_figures``."""
    figures = delegate_figures(artifacts_dir, verification)
    summary = {
        f.node_id: {
            "value": f.summary(),
            **_color(RED if f.verdict not in (None, "ok") else _steps_color(f.worst_steps)),
        }
        for f in figures
        if f.summary()
    }
    ms = {
        f.node_id: {"value": round(f.milliseconds, 6)}
        for f in figures
        if f.milliseconds is not None
    }
    steps = {f.node_id: {"value": f.steps} for f in figures if f.steps is not None}
    db = {f.node_id: {"value": round(f.psnr_db, 4)} for f in figures if f.psnr_db is not None}
    files: dict[str, dict[str, Any]] = {
        NODE_DATA_FILE: {"results": summary},
        MS_FILE: {
            "results": ms,
            "gradient": [{"stop": 0, "bgColor": "#fff3e0"}, {"stop": 1, "bgColor": "#ff9800"}],
        },
        STEPS_FILE: {
            "results": steps,
            "thresholds": [
                {"value": 0, "bgColor": GREEN},
                {"value": 1, "bgColor": YELLOW},
                {"value": 2**31, "bgColor": ORANGE},
            ],
        },
        DB_FILE: {
            "results": db,
            "thresholds": [
                {"value": 30, "bgColor": RED},
                {"value": 50, "bgColor": ORANGE},
                {"value": 1e9, "bgColor": GREEN},
            ],
        },
    }
    return {name: {"forward": data} for name, data in files.items() if data["results"]}


def _color(color: str | None) -> dict[str, str]:
    return {} if color is None else {"bgColor": color}


def write_node_data(
    artifacts_dir: str | Path, verification: Mapping[str, Any] | None = None
) -> Path:
    """Writes the Model Explorer per-node data files of the module's docstring into
    ``artifacts_dir`` (beside its ``model.pte``; the verification read from its ``report.json``
    unless given) and returns the path of ``model_explorer_node_data.json``, which is always
    written (empty results when verification measured no delegate); a metric file with no
    values is not written (and an earlier one removed). Load them in Model Explorer with "Add
    per-node data", or ``model-explorer model.pte --node_data_paths=...``."""
    folder = Path(artifacts_dir)
    files = node_data(folder, verification)
    files.setdefault(NODE_DATA_FILE, {"forward": {"results": {}}})
    for name in (NODE_DATA_FILE, MS_FILE, STEPS_FILE, DB_FILE):
        path = folder / name
        if name in files:
            path.write_text(json.dumps(files[name], indent=2) + "\n")
        else:
            path.unlink(missing_ok=True)
    return folder / NODE_DATA_FILE
