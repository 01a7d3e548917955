"""The loop verdict: a recurrent program judged over the frames users run, not one step.

The written program runs ``frames`` in order, each frame's state inputs given what its own
state outputs returned the frame before (as an engine copies them, integers as they are); the
quantized PT2E model runs the same frames feeding back its own state, and the float model its
own. Each frame is judged as one frame is (``judgement.judge_outputs``): against the quantized
model's loop, within the rounding envelope of that frame, where each envelope run carries its
own perturbed state through the frames (``envelope._Rounding``, one generator per run), so the
spread legitimate rounding reaches after t frames of feedback is measured, not assumed. A
program whose difference leaves the envelope's at any frame fails, the first such frame and
output named. The figures per frame (PSNR against the quantized and the float loop) go to
``verification["loop"]`` and a plot beside the verification pictures (``verify_loop.png``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import torch
from PIL import Image, ImageDraw
from torch.utils import _pytree as pytree

from etkit_exporter.check.envelope import (
    ENVELOPE_SEED,
    Envelope,
    _Rounding,
    quantize_bands,
)
from etkit_exporter.check.judgement import judge_outputs, output_reducer
from etkit_exporter.check.metrics import psnr
from etkit_exporter.check.tolerance import DEFAULT_TOLERANCE, VerifyTolerance
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.programs import load_program
from etkit_exporter.programs.runtime import runtime_method

if TYPE_CHECKING:
    from etkit_pterunner import DelegateFn


class StatePairs(Protocol):
    """What the loop reads of a model's state (``export.state.ModelState``): each pair's
    output name, and the output index feeding each state input."""

    @property
    def pairs(self) -> Sequence[Any]: ...

    @property
    def inputs(self) -> dict[int, int]: ...


Frame = tuple[torch.Tensor, ...]
LOOP_FRAMES: Final = 16
"""Frames a loop verdict runs by default (a sequence shorter than this holds its last frame)."""
PLOT_NAME: Final = "verify_loop.png"
# A program fault the loop driver can inject (the recurrent mutation suite): ``(frame number,
# state input index, the state the program returned) -> what the next frame gets``
StateFault = Callable[[int, int, torch.Tensor, torch.Tensor | None], torch.Tensor]


def loop_frames(frames: Sequence[Frame], count: int) -> tuple[list[Frame], int]:
    """``frames`` run for ``count`` frames: as given, the last frame held where there are
    fewer (a still scene after the sequence ends). Returns them and how many were given."""
    if not frames:
        raise ValueError("a loop verdict needs at least one frame")
    given = list(frames)[:count]
    return given + [given[-1]] * (count - len(given)), len(given)


def _leaves(value: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _with_state(
    frame: Frame, feeds: Mapping[int, int], state: Mapping[int, Any] | None
) -> list[Any]:
    return [state[k] if state is not None and k in state else x for k, x in enumerate(frame)]


def _program(
    pte: Path, target: str, delegates: Mapping[str, DelegateFn] | None
) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The written program, loaded once, as a function of one frame's inputs."""
    if target == "vgf" or delegates:
        program = load_program(pte, delegates=delegates)
        return lambda inputs: [y.clone() for y in program.run(inputs).outputs]
    method = runtime_method(pte)
    return lambda inputs: [y.clone() for y in method.execute(inputs)]


def verify_loop(
    pte: Path,
    model: torch.nn.Module,
    quantized_model: torch.nn.Module,
    frames: Sequence[Frame],
    state: StatePairs,
    io_params: dict[str, Any],
    target: str = "xnnpack",
    *,
    given: int | None = None,
    tolerance: VerifyTolerance = DEFAULT_TOLERANCE,
    float_export: bool = False,
    delegates: Mapping[str, DelegateFn] | None = None,
    pictures: Path | None = None,
    fault: StateFault | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """``verification["loop"]`` (module docstring): ``{"result", "frames", "frames_given",
    "first_failing_frame", "failing", "per_frame": [...], "state_saturation": [...],
    "seconds": {...}, "frames_per_second": {...}}``. ``fault`` (tests: the recurrent
    mutations) replaces what the program's state outputs hand the next frame."""
    feeds = state.inputs
    run = _program(pte, target, delegates)
    envelope_runs = 0 if float_export else tolerance.samples + 2
    graph = quantized_model if isinstance(quantized_model, torch.fx.GraphModule) else None
    bands = quantize_bands(graph, tolerance.band) if graph is not None else {}
    generators = [torch.Generator().manual_seed(ENVELOPE_SEED + r) for r in range(envelope_runs)]
    program_state: dict[int, torch.Tensor] | None = None
    quantized_state: dict[int, torch.Tensor] | None = None
    float_state: dict[int, torch.Tensor] | None = None
    run_states: list[dict[int, torch.Tensor] | None] = [None] * envelope_runs
    seconds = {"program": 0.0, "quantized model": 0.0, "float model": 0.0, "envelope": 0.0}
    rows: list[dict[str, Any]] = []
    saturation: list[dict[str, Any]] = []
    names = [e["name"] for e in io_params["outputs"]]
    first: dict[str, Any] | None = None
    for t, frame in enumerate(frames):
        if progress is not None:
            progress("loop", t, len(frames))
        start = time.perf_counter()
        inputs = [program_input(x, e) for x, e in zip(frame, io_params["inputs"], strict=True)]
        if program_state is not None:
            for k, value in program_state.items():
                inputs[k] = value
        raw = run(inputs)
        returned = {k: raw[j] for k, j in feeds.items()}
        if fault is not None:
            previous = program_state
            returned = {
                k: fault(t, k, v, None if previous is None else previous.get(k))
                for k, v in returned.items()
            }
        program_state = returned
        actual = [float_output(y, e) for y, e in zip(raw, io_params["outputs"], strict=True)]
        seconds["program"] += time.perf_counter() - start

        with torch.no_grad():
            start = time.perf_counter()
            quantized = _leaves(quantized_model(*_with_state(frame, feeds, quantized_state)))
            quantized_state = {k: quantized[j] for k, j in feeds.items()}
            seconds["quantized model"] += time.perf_counter() - start
            start = time.perf_counter()
            floats = _leaves(model(*_with_state(frame, feeds, float_state)))
            float_state = {k: floats[j] for k, j in feeds.items()}
            seconds["float model"] += time.perf_counter() - start
            start = time.perf_counter()
            envelope = None
            if graph is not None and envelope_runs:
                reduce = output_reducer(quantized, io_params["outputs"])
                kept: list[tuple[list[Any], dict[str, Any]]] = []
                for r in range(envelope_runs):
                    extra = r - tolerance.samples
                    mode = "dither" if extra < 0 else ("up", "down")[extra]
                    generator = generators[r]
                    interpreter = _Rounding(graph, bands, mode, generator, ())
                    values = _leaves(interpreter.run(*_with_state(frame, feeds, run_states[r])))
                    run_states[r] = {k: values[j] for k, j in feeds.items()}
                    kept.append(([reduce(i, y) for i, y in enumerate(values)], {}))
                    del values
                envelope = Envelope(
                    kept[: tolerance.samples], kept[tolerance.samples :], tolerance.band, len(bands)
                )
            seconds["envelope"] += time.perf_counter() - start
        verdict = judge_outputs(
            actual, quantized, io_params["outputs"], tolerance, envelope=envelope,
            float_export=float_export,
        )  # fmt: skip
        row: dict[str, Any] = {"frame": t, "result": verdict["result"], "outputs": []}
        for index, (y, q, f) in enumerate(zip(actual, quantized, floats, strict=True)):
            y = y.contiguous().reshape(q.shape)
            row["outputs"].append(
                {
                    "name": names[index],
                    "psnr_vs_quantized_db": _db(psnr(y, q)),
                    "psnr_vs_float_db": _db(psnr(y, f)),
                }
            )
        if verdict["result"] == "fail":
            failing = [names[o["output"]] for o in verdict["outputs"] if not o["passes"]]
            row["failing_outputs"] = failing
            if first is None:
                first = {"frame": t, "outputs": failing, "states": [
                    p.output_name for p in state.pairs if p.output_name in failing
                ]}  # fmt: skip
        rows.append(row)
        saturation.append({"frame": t, **_state_saturation(state, floats, io_params)})
    if progress is not None:
        progress("loop", len(frames), len(frames))
    count = len(frames)
    section: dict[str, Any] = {
        "result": "fail" if first is not None else "pass",
        "frames": count,
        "frames_given": count if given is None else given,
        "envelope_runs": envelope_runs,
        "first_failure": first,
        "per_frame": rows,
        "state_saturation": saturation,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "frames_per_second": {
            k: (round(count / v, 2) if v > 0 else None) for k, v in seconds.items()
        },
    }
    if pictures is not None:
        write_loop_plot(pictures / PLOT_NAME, rows)
        section["plot"] = PLOT_NAME
    return section


def _db(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _state_saturation(
    state: StatePairs, floats: Sequence[torch.Tensor], io_params: Mapping[str, Any]
) -> dict[str, float | None]:
    """Each state's share of values the float model's loop put outside what the state's
    quantization represents at this frame (None for a float state)."""
    shares: dict[str, float | None] = {}
    for pair in state.pairs:
        entry = io_params["outputs"][pair.output]
        value = floats[pair.output]
        if entry.get("scale") is None:
            shares[pair.output_name] = None
            continue
        scale, zero = float(entry["scale"]), int(entry["zero_point"])
        low = (entry["quant_min"] - zero - 0.5) * scale
        high = (entry["quant_max"] - zero + 0.5) * scale
        outside = int(((value < low) | (value > high)).sum())
        shares[pair.output_name] = outside / max(value.numel(), 1)
    return shares


def write_loop_plot(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Per-frame PSNR of each output against the quantized model's loop (solid) and the float
    model's (dots), frame on x: a PNG of 640 x 360."""
    width, height, margin = 640, 360, 40
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    series: dict[str, list[float | None]] = {}
    for row in rows:
        for output in row["outputs"]:
            for key, tag in (
                ("psnr_vs_quantized_db", "vs quantized"),
                ("psnr_vs_float_db", "vs float"),
            ):
                series.setdefault(f"{output['name']} {tag}", []).append(output[key])
    finite = [v for values in series.values() for v in values if v is not None]
    top = max(finite, default=60.0) + 2
    bottom = min(finite, default=0.0) - 2
    if top - bottom < 4:
        bottom = top - 4
    frames = max(len(rows) - 1, 1)

    def at(t: int, db: float) -> tuple[float, float]:
        x = margin + (width - 2 * margin) * t / frames
        y = height - margin - (height - 2 * margin) * (db - bottom) / (top - bottom)
        return x, y

    draw.rectangle([margin, margin, width - margin, height - margin], outline="black")
    title = "PSNR per frame (dB): program vs quantized loop (lines), vs float loop (dots)"
    draw.text((margin, 8), title, fill="black")
    draw.text((margin, height - margin + 8), f"frame 0 .. {len(rows) - 1}", fill="black")
    draw.text((4, margin), f"{top:.0f}", fill="black")
    draw.text((4, height - margin - 10), f"{bottom:.0f}", fill="black")
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for n, (label, values) in enumerate(series.items()):
        colour = colours[(n // 2) % len(colours)]
        points = [at(t, v if v is not None else top) for t, v in enumerate(values)]
        if label.endswith("vs quantized") and len(points) > 1:
            draw.line(points, fill=colour, width=2)
        else:
            for x, y in points:
                draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
        draw.text((width - margin - 200, margin + 4 + 12 * n), label, fill=colour)
    image.save(path)


def frames_per_second(section: Mapping[str, Any]) -> str:
    """One line of the loop's cost, for logs and report.md."""
    fps = section.get("frames_per_second", {})
    parts = [f"{k} {v:g}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{k} -"
             for k, v in fps.items()]  # fmt: skip
    return "frames per second: " + ", ".join(parts)
