"""The export report: partitions, what stayed outside and why, grid samplers, the IO table,
stage timings and toolchain versions; as JSON and as Markdown."""

from __future__ import annotations

import importlib.metadata
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from torch.export import ExportedProgram

from etkit_exporter.artifact.float_ops import markdown as float_ops_markdown
from etkit_exporter.artifact.sizes_text import sizes_markdown
from etkit_exporter.artifact.verdict_text import envelope_lines, tolerance_text, verdict_lines
from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND, VGF_BACKEND
from etkit_exporter.vgf.scenario_writer import scenario_markdown
from etkit_exporter.vgf.segments import vgf_seams
from etkit_gridsampler import delegate_format
from etkit_quant.graph import target_name

_DISTRIBUTIONS = (
    "torch", "executorch", "torchao", "tosa-tools", "ai-ml-sdk-model-converter",
    "ai-ml-sdk-scenario-runner", "etkit-quant", "etkit-partition", "etkit-layout",
    "etkit-gridsampler", "etkit-pterunner", "etkit-exporter",
)  # fmt: skip


def _versions() -> dict[str, str]:
    versions = {}
    for name in _DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _qparams(q: Any) -> dict[str, Any] | None:
    if q is None:
        return None
    return {
        "dtype": str(q.dtype).removeprefix("torch."),
        "scale": q.scale,
        "zero_point": q.zero_point,
        "quant_min": q.quant_min,
        "quant_max": q.quant_max,
    }


def build_report(
    program: ExportedProgram,
    *,
    target: str,
    io_params: dict[str, Any],
    detagged: dict[str, str],
    grid_rejections: list[tuple[str, str]],
    timings: dict[str, float],
    intermediates: Path,
    verification: dict[str, Any] | None,
    tosa_spec: str | None,
    saturation: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report of an exported program (``program``: the final edge program)."""

    partitions: list[dict[str, Any]] = []
    grid_samplers: list[dict[str, Any]] = []
    outside: list[dict[str, str]] = []
    rejected = dict(grid_rejections)
    for node in program.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("lowered_module"):
            delegate = getattr(program.graph_module, str(node.target))
            ops = Counter(
                target_name(n).removesuffix(".default")
                for n in delegate.original_module.graph.nodes
                if n.op == "call_function"
            )
            partitions.append(
                {
                    "name": str(node.target),
                    "backend": delegate.backend_id,
                    "nodes": sum(ops.values()),
                    "ops": dict(sorted(ops.items())),
                }
            )
            if delegate.backend_id == VGF_BACKEND:  # its segments and the values between them
                with tempfile.TemporaryDirectory(prefix="etkit-seams-") as scratch:
                    partitions[-1]["vgf"] = vgf_seams(
                        bytes(delegate.processed_bytes), Path(scratch)
                    )
            if delegate.backend_id == GRID_SAMPLER_BACKEND:
                blob = delegate_format.decode(bytes(delegate.processed_bytes))
                grid_samplers.append(
                    {
                        "delegate": str(node.target),
                        "mode": blob.op.mode,
                        "padding_mode": blob.op.padding_mode,
                        "align_corners": blob.op.align_corners,
                        "image": _qparams(blob.op.image),
                        "grid": _qparams(blob.op.grid),
                        # the delegate takes a float32 grid and quantizes it (a fused quantize)
                        "grid_quantized_in_delegate": blob.quantizes_grid,
                        "output": _qparams(blob.op.output),
                        "image_shape": list(blob.image_shape),
                        "grid_shape": list(blob.grid_shape),
                    }
                )
        elif node.op == "call_function":
            name = target_name(node)
            if not name or "executorch_call_delegate" in str(node.target):
                continue  # delegate calls and getitem
            if node.name in rejected:
                reason = f"grid-sampler backend: {rejected[node.name]}"
            elif node.name in detagged:
                reason = f"kept outside by {detagged[node.name]}"
            else:
                reason = f"not supported by the {target} backend"
            outside.append({"node": node.name, "op": name, "reason": reason})
    return {
        "target": target,
        "tosa_spec": tosa_spec,
        "partitions": partitions,
        "outside_delegates": outside,
        "grid_samplers": grid_samplers,
        "delegate_seams": delegate_seams(program),
        "io": io_params,
        "timings_s": timings,
        "intermediates": sorted(p.name for p in intermediates.glob("*")),
        "verification": verification,
        "saturation": saturation or [],
        "versions": _versions(),
    }


def delegate_seams(program: ExportedProgram) -> dict[str, int]:
    """The program's seams between delegates: its delegate calls, and the values one call reads
    straight from another call's outputs (a boundary the split of the work made: each is a
    value leaving one delegate's memory and entering another's)."""
    calls = [
        node
        for node in program.graph.nodes
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target)
    ]

    def producer(value: Any) -> Any:
        if getattr(value, "op", None) == "call_function" and "getitem" in str(value.target):
            return value.args[0]
        return value

    called = set(calls)
    between = sum(1 for call in calls for value in call.args[1:] if producer(value) in called)
    return {"delegate_calls": len(calls), "values_between_delegates": between}


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The report as readable Markdown, one section after another."""
    lines = [f"# etkit export report ({report['target']})", ""]
    lines += verdict_markdown((report.get("verification") or {}).get("verdict"), top=True)
    lines += _partitions_markdown(report["partitions"])
    lines += _seams_markdown(report["partitions"], report.get("delegate_seams"))
    lines += _outside_markdown(report["outside_delegates"])
    lines += _grid_samplers_markdown(report["grid_samplers"], report.get("grid_sampler_paths"))
    lines += _io_markdown(report["io"])
    lines += sizes_markdown(report.get("sizes"))
    lines += _saturation_markdown(report.get("saturation"))
    lines += float_ops_markdown(report.get("float_ops"))
    lines += _verification_markdown(report.get("verification"))
    lines += inspection_markdown(report.get("inspect"))
    if report.get("scenario"):
        lines += ["", *scenario_markdown(report["scenario"])]
    lines += _timings_markdown(report.get("timings_s"), report.get("peak_memory_mb"))
    lines += ["", "## Toolchain", ""]
    lines += _table(["package", "version"], [[k, v] for k, v in report["versions"].items()])
    return "\n".join(lines) + "\n"


def _seams_markdown(partitions: list[dict[str, Any]], seams: dict[str, int] | None) -> list[str]:
    """The seams under "Partitions": values between delegate calls; each VGF's segments and
    the values its segments hand each other."""
    lines = []
    if seams:
        lines.append(
            f"- {seams['delegate_calls']} delegate calls; "
            f"{seams['values_between_delegates']} values pass straight from one to another"
        )
    for p in partitions:
        vgf = p.get("vgf")
        if vgf:
            lines.append(
                f"- {p['name']} (VGF): {vgf['graph_segments']} graph and "
                f"{vgf['compute_segments']} compute segments; {vgf['seam_count']} values between "
                f"segments ({vgf['seam_bytes']} bytes an inference), "
                f"{vgf['graph_to_graph']} between two graph segments"
            )
    return ["", *lines] if lines else []


def _partitions_markdown(partitions: list[dict[str, Any]]) -> list[str]:
    """The "Partitions" section: each delegate, its backend and the ops it holds."""
    return [
        "## Partitions",
        "",
        *_table(
            ["delegate", "backend", "nodes", "ops"],
            [
                [
                    p["name"],
                    p["backend"],
                    p["nodes"],
                    ", ".join(f"{k} x{v}" for k, v in p["ops"].items()),
                ]
                for p in partitions
            ],
        ),
    ]


def _outside_markdown(outside: list[dict[str, str]]) -> list[str]:
    """The "Outside the delegates" section: each op no delegate holds, and why."""
    lines = ["", "## Outside the delegates", ""]
    if not outside:
        return [*lines, "(none)"]
    return lines + _table(
        ["node", "op", "reason"], [[o["node"], o["op"], o["reason"]] for o in outside]
    )


def _qparams_text(entry: dict[str, Any] | None) -> str:
    return (
        "float32"
        if entry is None
        else f"{entry['dtype']} {entry['scale']:.6g}/{entry['zero_point']}"
    )


def _grid_samplers_markdown(
    samplers: list[dict[str, Any]], paths: list[dict[str, Any]] | None
) -> list[str]:
    """The "Grid samplers" section: each delegated sampler's parameters, and where each
    sampler runs."""
    lines = ["", "## Grid samplers", ""]
    lines += _table(
        ["delegate", "mode", "padding", "align_corners", "image", "grid", "output"],
        [
            [
                g["delegate"],
                g["mode"],
                g["padding_mode"],
                g["align_corners"],
                _qparams_text(g["image"]),
                _qparams_text(g["grid"])
                + (" (float32 in, quantized here)" if g.get("grid_quantized_in_delegate") else ""),
                _qparams_text(g["output"]),
            ]
            for g in samplers
        ],
    )
    if paths:
        lines += ["", "Where each grid sampler runs (vgf-compute-segment: inside the VGF, etkit's "
                  "shader; etkit-delegate: etkit's own delegate):", ""]  # fmt: skip
        lines += _table(
            ["node", "path", "why not in the VGF", "params"],
            [
                [
                    p["node"],
                    p["path"],
                    p.get("reason") or "",
                    (p.get("segment") or {}).get("params", ""),
                ]
                for p in paths
            ],
        )
    return lines


def _io_markdown(io: dict[str, Any]) -> list[str]:
    """The "Inputs and outputs" section: the IO table."""
    rows = []
    for kind in ("inputs", "outputs"):
        for e in io[kind]:
            texture = e["texture"]["format"] if e.get("texture") else ""
            scale = "" if e["scale"] is None else f"{e['scale']:.6g}"
            rows.append(
                [
                    kind[:-1],
                    e["index"],
                    e["name"],
                    e.get("shape"),
                    e.get("dim_order"),
                    e.get("dtype"),
                    scale,
                    e["zero_point"],
                    texture,
                ]
            )
    return [
        "",
        "## Inputs and outputs",
        "",
        *_table(
            ["", "index", "name", "shape", "dim order", "dtype", "scale", "zero point", "texture"],
            rows,
        ),
    ]


def _saturation_markdown(saturation: list[dict[str, Any]] | None) -> list[str]:
    """The "Saturation" section: what each fixed-range boundary clips of the calibration data."""
    lines = [
        "",
        "## Saturation (calibration data each fixed range clips: more than half a step outside)",
        "",
    ]
    if not saturation:
        return [*lines, "(no fixed-range boundary)"]
    return lines + _table(
        ["boundary", "qspec", "range", "clipped", "observed", "verdict"],
        [
            [
                s["name"],
                s["qspec"],
                f"[{s['range'][0]:.6g}, {s['range'][1]:.6g}]",
                f"{s['outside']} of {s['total']} ({100 * s['fraction']:.3g} %)",
                f"[{s['observed'][0]:.6g}, {s['observed'][1]:.6g}]",
                "ok"
                if s["passes"]
                else "**clips**" + (f": use {s['instead']}" if s["instead"] else ""),
            ]
            for s in saturation
        ],
    )


def _verification_markdown(verification: dict[str, Any] | None) -> list[str]:
    """The "Verification" section: the verdict, each output against the references, each
    delegate call of the run, and the pictures."""
    if not verification:
        return []
    runner = verification.get("runner", "executorch.runtime")
    lines = ["", f"## Verification ({runner})", ""]
    lines += verdict_markdown(verification.get("verdict"), top=False)
    lines += _table(
        ["output", "vs", "max abs error", "PSNR dB", "int8 steps (max; 0/1/2/more)"],
        [
            [
                v["output"],
                v["reference"],
                f"{v['max_abs_error']:.6g}",
                _db(v["psnr_db"]),
                f"{v['max_steps']}; " + "/".join(map(str, v["steps_histogram"].values()))
                if "max_steps" in v
                else "",
            ]
            for v in verification["comparisons"]
        ],
    )
    lines += _delegate_calls_markdown(verification.get("delegates"))
    lines += _loop_markdown(verification.get("loop"))
    for v in verification["comparisons"]:
        if v.get("picture"):
            alt = f"output {v['output']}: float model, program, error"
            lines += ["", f"![{alt}]({v['picture']})"]
    return lines


def _delegate_calls_markdown(calls: list[dict[str, Any]] | None) -> list[str]:
    """The verified run's delegate calls, a grid sampler's against its contract's ideal."""
    if not calls:
        return []
    return [
        "",
        "Delegate calls of that run. A grid-sampler call's output is compared with the "
        "grid-sampler contract's ideal (float64 grid_sample of the integer inputs the "
        "program gave it, quantized); the contract allows 1 step for bilinear and none "
        "for nearest away from rounding ties.",
        "",
        *_table(
            ["instruction", "backend", "ran on", "ms", "steps vs ideal (max; 0/1/2/more)"],
            [
                [
                    c["instruction"],
                    c["backend"] + (f" ({c['mode']})" if "mode" in c else ""),
                    c["implementation"],
                    f"{1000 * c['seconds']:.2f}",
                    f"{c['max_steps_vs_ideal']}; "
                    + "/".join(map(str, c["steps_histogram"].values()))
                    + (f"; {c['ties']} ties" if "ties" in c else "")
                    if "max_steps_vs_ideal" in c
                    else "",
                ]
                for c in calls
            ],
        ),
    ]


def _timings_markdown(
    timings: dict[str, float] | None, report_peaks: dict[str, float | None] | None = None
) -> list[str]:
    """The "Stage timings" section (report.md written by ``write_report`` points to
    ``timings.json`` instead, so that the report does not differ from run to run)."""
    lines = ["", "## Stage timings", ""]
    if timings is None:
        return [
            *lines,
            f"In {TIMINGS_NAME}: each stage's seconds (`timings_s`), peak resident memory "
            "(`peak_memory_mb`) and the verification's own stages (`verification_stages`); "
            "measured figures differ from run to run, this report does not.",
        ]
    peaks = report_peaks or {}
    rows = [[k, v, _mb(peaks.get(k))] for k, v in timings.items()]
    return lines + _table(["stage", "seconds", "peak resident MB"], rows)


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _db(value: float | None) -> str:
    return "inf (identical)" if value is None else f"{value:.2f}"


def verdict_markdown(verdict: dict[str, Any] | None, *, top: bool) -> list[str]:
    """The verdict in report.md: at the ``top`` of the report only a failure (one line per
    fact); in the Verification section the verdict, the tolerance and, for a failure, the table
    of delegate calls against the quantized PT2E model with the first failing one marked."""

    if not verdict:
        return []
    failed = verdict.get("result") == "fail"
    if top:
        if not failed:
            return []
        return [
            "**Verification failed**: this program is not within tolerance of the quantized "
            "PT2E model; it was kept for inspection and not put in place of the artifacts "
            "folder.",
            "",
            *[f"- {line}" for line in verdict_lines(verdict)],
            "",
        ]
    tolerance = verdict.get("tolerance", {})
    lines = [
        f"Verdict: **{'fail' if failed else 'pass'}** against the quantized PT2E model; "
        f"the verdict's rules (etkit's docs, explanation): {tolerance_text(tolerance)}.",
        "",
    ]
    judged = envelope_lines(verdict)
    if judged:
        lines += [*[f"- {line}" for line in judged], ""]
    calls = verdict.get("delegate_calls")
    if calls:
        lines += [
            "Where it diverges: each delegate call's output against the quantized PT2E model's "
            "value of the same tensor (the ETRecord's quantized graph on the same inputs).",
            "",
        ]
        lines += _table(
            ["instruction", "backend", "ops", "output node", "PSNR dB", "steps max",
             "mean steps", "verdict", "on its own inputs"],
            [
                [
                    c["instruction"],
                    c["backend"],
                    c.get("ops") or "",
                    c.get("node") or "",
                    _db(c["psnr_db"]) if "psnr_db" in c else "",
                    "" if c.get("max_steps") is None else c["max_steps"],
                    "" if c.get("mean_steps") is None else f"{c['mean_steps']:+.3g}",
                    "not compared"
                    if "passes" not in c
                    else "ok"
                    if c["passes"]
                    else "**first to fail**"
                    if c.get("first_failing")
                    else "fails",
                    _own_inputs(c.get("own_inputs")),
                ]
                for c in calls
            ],
        )  # fmt: skip
        lines += [
            "",
            "On its own inputs: the call's output against the quantized model's ops run on the "
            "program's own values upstream of it (a call that is off only against PT2E's values "
            "carries a difference from upstream).",
        ]
        lines.append("")
    return lines


def _own_inputs(own: dict[str, Any] | None) -> str:
    if own is None:
        return ""
    figures = _db(own.get("psnr_db"))
    if own.get("max_steps") is not None:
        figures += f", {own['max_steps']} steps"
    return f"{'ok' if own.get('passes') else 'fails'} ({figures})"


def inspection_markdown(inspection: dict[str, Any] | None) -> list[str]:
    """report.md's "Inspection" section, from report.json's ``inspect`` (``etkit inspect``
    writes it; none before)."""
    if not inspection:
        return []

    def figure(result: dict[str, Any] | None, steps: bool) -> str:
        if not result or "skipped" in result:
            return ""
        text = _db(result.get("psnr_db"))
        if steps and "max_steps" in result:
            text = f"{result['max_steps']} steps, {text}"
        return text + (f" ({result['note']})" if result.get("note") else "")

    lines = ["", f"## Inspection ({inspection['runner']})", ""]
    lines += [f"{note}." for note in inspection.get("notes", [])]
    lines += [
        "",
        "Each instruction's output against the same node in the quantized graph and in the "
        "float model (PSNR dB; quantization steps for integer tensors); see "
        "apps/exporter/docs/inspect.md.",
        "",
    ]
    lines += _table(
        ["instr", "event", "backend", "ms", "vs quantized", "vs float", "vs ideal", "source"],
        [
            [
                "" if r["instruction"] is None else r["instruction"],
                ("&nbsp;&nbsp;" * r["depth"]) + r["event"],
                r["backend"],
                "" if r["ms"] is None else f"{r['ms']:.3f}",
                figure(r["vs_quantized"], True),
                figure(r["vs_float"], False),
                f"{r['vs_ideal']['max_steps_vs_ideal']} steps" if r.get("vs_ideal") else "",
                r["node"] or r["ops"],
            ]
            for r in inspection["rows"]
        ],
    )
    lines.append("")
    for o in inspection.get("outputs", []):
        quantized = _db(o.get("vs_quantized_psnr_db"))
        line = f"Output {o['output']}: {quantized} dB against the quantized model"
        if "vs_float_psnr_db" in o:  # not without the float model in the ETRecord
            line += f", {_db(o['vs_float_psnr_db'])} dB against the float model"
        if "verification_vs_quantized_psnr_db" in o:
            line += (
                f" (the verification: {_db(o.get('verification_vs_quantized_psnr_db'))} and "
                f"{_db(o.get('verification_vs_float_psnr_db'))} dB)"
            )
        lines += [line + ".", ""]
    return lines[:-1] if lines[-1] == "" else lines


TIMINGS_NAME = "timings.json"
# What differs from run to run, written to timings.json: the stage timings, each stage's peak
# resident memory and the profile of the calls inside them (``etkit_exporter.export.pass_profile``)
MEASURED_KEYS = ("timings_s", "peak_memory_mb", "profile_s")


LOOP_MEASURED = ("seconds", "frames_per_second")  # a loop's cost: timings.json


def _loop_markdown(loop: dict[str, Any] | None) -> list[str]:
    """The loop over frames (``check.loop``): its result, and per output the PSNR against the
    quantized and the float loop at frames 1, 8 and the last, and the worst state saturation."""
    if not loop:
        return []
    frames = loop["frames"]
    given = loop.get("frames_given", frames)
    held = f" ({given} given, the last held)" if given < frames else ""
    first = loop.get("first_failure")
    verdict = (
        "pass"
        if first is None
        else f"**fail** from frame {first['frame']} ({', '.join(first['outputs'])})"
    )
    lines = ["", f"### The loop: {frames} frames{held}, {verdict}", ""]
    rows = loop.get("per_frame", [])
    picked = sorted({t for t in (1, 8, frames - 1) if 0 <= t < len(rows)})
    header = ["output", *(f"frame {t}: vs quantized / vs float dB" for t in picked)]
    body = []
    for index, output in enumerate(rows[0]["outputs"] if rows else []):
        cells = [output["name"]]
        for t in picked:
            o = rows[t]["outputs"][index]
            cells.append(f"{_db(o['psnr_vs_quantized_db'])} / {_db(o['psnr_vs_float_db'])}")
        body.append(cells)
    lines += _table(header, body)
    shares = [
        (row["frame"], name, share)
        for row in loop.get("state_saturation", [])
        for name, share in row.items()
        if name != "frame" and isinstance(share, float)
    ]
    if shares:
        frame, name, share = max(shares, key=lambda s: s[2])
        lines += ["", f"State saturation: at most {100 * share:.3g} % ({name}, frame {frame})."]
    if loop.get("plot"):
        lines += ["", f"![PSNR per frame]({loop['plot']})"]
    return lines


def write_report(report: dict[str, Any], folder: Path) -> None:
    """``report.json`` and ``report.md`` in ``folder``, and the measured figures, which differ
    from run to run, apart in ``timings.json``: the stage timings (``timings_s``), each stage's
    peak resident memory (``peak_memory_mb``), their profile (``profile_s``) and the
    verification's own stages (``verification_stages``: seconds and peak MB each), so that two
    exports of one model write the same report files (and manifest)."""
    measured = {k: report[k] for k in MEASURED_KEYS if k in report}
    written = {k: v for k, v in report.items() if k not in MEASURED_KEYS}
    verification = written.get("verification")
    if isinstance(verification, dict) and "stages" in verification:  # its own stages' cost
        measured["verification_stages"] = verification["stages"]
        written["verification"] = verification = {
            k: v for k, v in verification.items() if k != "stages"
        }
    loop = verification.get("loop") if isinstance(verification, dict) else None
    if isinstance(verification, dict) and isinstance(loop, dict) and "seconds" in loop:
        # the loop's cost (seconds, frames per second) is measured: timings.json
        measured["verification_loop"] = {k: loop[k] for k in LOOP_MEASURED if k in loop}
        written["verification"] = {
            **verification,
            "loop": {k: v for k, v in loop.items() if k not in LOOP_MEASURED},
        }
    (folder / "report.json").write_text(json.dumps(written, indent=2, default=str) + "\n")
    (folder / "report.md").write_text(render_markdown(written))
    if "timings_s" in measured:
        (folder / TIMINGS_NAME).write_text(json.dumps(measured, indent=2) + "\n")
