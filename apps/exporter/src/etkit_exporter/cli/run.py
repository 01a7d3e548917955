"""``etkit run MODEL.pte``: run an etkit export on inputs from files, write its outputs.

Inputs (``--input FILE``, once per program input, in order) are ``.npy``/``.pt`` tensors or
images (``.png``/``.jpg``, read as 1 x C x H x W and mapped from [0, 255] to ``--image-range``);
a float input of a quantized program input is quantized with that input's parameters from the
``io_quant_params.json`` beside the program, an integer one is taken as it is. Outputs go to
``--out`` as ``output_K.npy`` (as the program returns them) and, for image-like outputs (4-D with
1, 3 or 4 channels), ``output_K.png`` (dequantized, mapped from ``--image-range`` to 8 bits for
viewing). Everything is read and checked before the program runs; nothing is written unless the
run succeeds.

``MODEL.pte`` may also be an export's folder (its ``model.pte`` runs). Every argument and file is
checked before torch or ExecuTorch is imported, so a mistake is answered at once. A float value
past the range an input's quantization holds (pixel values in [0, 255] for a model taking
[-1, 1]) is clipped by that quantization: the summary's warnings say how many values, and the
range. A value of a dtype the program does not take is refused naming the input, the dtype given
and the one expected.

``--etdump PATH`` profiles the run. A program ``executorch.runtime`` can run (an XNNPACK
export: every delegate's backend registered there) runs there with an ETDump written to
``PATH`` and its intermediate outputs to ``PATH.debug``, for ExecuTorch's ``Inspector`` (with
the export's ``etrecord.bin``). A program only etkit's runner runs (a VGF export) gets a Chrome
trace instead, ``PATH`` with the suffix ``.json`` (Perfetto and ``chrome://tracing`` open it):
each kernel and delegate call at the time it ran.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch

    from etkit_exporter.programs import GridSamplerImpl

# torch, numpy, ExecuTorch, the runner and the app's modules that import them are imported in the
# functions that use them: `etkit run` checks its arguments and files first, and answers a
# mistake in 0.05 s instead of after torch's 2.4 s import.

PROGRAM_NAME: Final = "model.pte"
INPUT_SUFFIXES: Final = (".npy", ".pt", ".png", ".jpg", ".jpeg")


class RunUsageError(ValueError):
    """A mistake in what ``etkit run`` was given; the message names it."""


def resolve_program(path: Path) -> Path:
    """The program ``path`` names: a ``.pte``/``.bpte`` file, or an export's folder (its
    ``model.pte``). Raises ``RunUsageError`` when there is none."""
    if path.is_dir():
        if (path / PROGRAM_NAME).is_file():
            return path / PROGRAM_NAME
        raise RunUsageError(
            f"{path} is a folder without {PROGRAM_NAME}: give an etkit export's folder or its "
            f"{PROGRAM_NAME}"
        )
    if not path.is_file():
        raise RunUsageError(f"{path}: no such program file or export folder")
    return path


def check_arguments(
    inputs: Sequence[Path], out: Path | None = None, etdump: Path | None = None
) -> None:
    """Checks what needs no program: each input file exists and is of a kind ``etkit run``
    reads, ``out`` is new or an empty folder, ``etdump`` is not a folder. Raises
    ``RunUsageError`` naming the first mistake."""
    for path in inputs:
        if not path.is_file():
            raise RunUsageError(f"--input {path}: no such file")
        if path.suffix.lower() not in INPUT_SUFFIXES:
            raise RunUsageError(f"--input {path}: expected .npy, .pt, .png or .jpg")
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunUsageError(f"--out {out} exists and is not an empty folder; choose another")
    if etdump is not None and etdump.is_dir():
        raise RunUsageError(f"--etdump {etdump} is a folder; give a file name")


def _read_input(path: Path, image_range: tuple[float, float]) -> torch.Tensor:
    import torch

    from etkit_exporter.core.calibration_data import (
        IMAGE_SUFFIXES,
        CalibrationDataError,
        read_array,
        read_image,
    )

    check_arguments([path])
    suffix = path.suffix.lower()
    try:
        if suffix in IMAGE_SUFFIXES:
            return read_image(path, image_range)
        if suffix == ".npy":
            return read_array(path)
        if suffix == ".pt":
            value = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(value, torch.Tensor):
                return value
            raise RunUsageError(f"--input {path}: holds a {type(value).__name__}, not a tensor")
    except CalibrationDataError as error:
        raise RunUsageError(str(error)) from error
    except RunUsageError:
        raise
    except Exception as error:
        raise RunUsageError(f"--input {path}: not readable ({error})") from error
    raise RunUsageError(f"--input {path}: expected .npy, .pt, .png or .jpg")


def _checked_input(
    value: torch.Tensor, entry: dict[str, Any], source: str, warnings: list[str]
) -> torch.Tensor:
    """``value`` as the program takes the input ``entry`` describes; a float value past the
    range of the input's quantization adds a warning to ``warnings`` (it is clipped)."""
    from etkit_exporter.core.io_params import program_input

    if "shape" in entry and not _fits(list(value.shape), entry):
        lower = entry.get("min_shape", entry["shape"])  # a dynamic size: any within bounds
        takes = ", ".join(
            str(a) if a == b else f"{a}..{b}" for a, b in zip(lower, entry["shape"], strict=True)
        )
        raise RunUsageError(
            f"{source}: shape {list(value.shape)}, but input {entry['index']} ({entry['name']}) "
            f"takes [{takes}]"
        )
    if value.dtype.is_floating_point and not bool(value.isfinite().all()):
        raise RunUsageError(
            f"{source}: input {entry['index']} ({entry['name']}) holds NaN or infinite values"
        )
    clipped = clipping_warning(value, entry, source)
    if clipped is not None:
        warnings.append(clipped)
    return program_input(value, entry)


def _fits(shape: list[int], entry: dict[str, Any]) -> bool:
    """Whether ``shape`` is the one an io_quant_params.json ``entry`` takes: its ``shape``,
    or with a ``min_shape`` (a dynamic size) any shape within the two."""
    lower = entry.get("min_shape", entry["shape"])
    if len(shape) != len(entry["shape"]) or len(lower) != len(shape):
        return False
    return all(a <= s <= b for s, a, b in zip(shape, lower, entry["shape"], strict=True))


def methods_of(program: Any) -> list[str]:
    """The methods of ``program`` (a ``PteProgram``) that take inputs: ``forward`` and, in an
    export of several sizes, ``forward_540x960`` and the like (not the IO-parameter getters
    such as ``input0_scale``)."""
    return [name for name in program.method_names if program.method(name).inputs]


def choose_method(program: Any, method: str | None, size: str | None) -> str:
    """The method ``--method`` or ``--size HxW`` names (``forward`` when neither): the
    method of that size in an export of several sizes, or ``forward`` when its inputs take
    dynamic sizes. ``RunUsageError`` listing the program's methods otherwise."""
    names = methods_of(program)
    if method is not None and size is not None:
        raise RunUsageError("give --method or --size, not both")
    if method is not None:
        if method not in names:
            raise RunUsageError(
                f"the program has no method {method!r}; its methods: {', '.join(names)}"
            )
        return method
    if size is None:
        return "forward"
    text = size.strip().lower()
    if f"forward_{text}" in names:
        return f"forward_{text}"
    sizes = {_size_of(program, name): name for name in names}
    if text in sizes:
        return sizes[text]  # forward: the first size of an export of several
    if any(getattr(info, "dynamic", False) for info in program.method("forward").input_infos):
        return "forward"  # a range: the inputs' sizes are checked against its bounds
    raise RunUsageError(
        f"the program has no method for size {size}; its sizes: "
        + ", ".join(f"{s} ({name})" for s, name in sizes.items())
    )


def _size_of(program: Any, method: str) -> str:
    """The height x width of ``method``'s first 4-D input ("" when it has none)."""
    for info in program.method(method).input_infos:
        sizes: tuple[int, ...] = tuple(getattr(info, "sizes", ()))
        if len(sizes) == 4:
            return f"{sizes[2]}x{sizes[3]}"
    return ""


def clipping_warning(value: torch.Tensor, entry: dict[str, Any], source: str) -> str | None:
    """What quantizing the float ``value`` with the parameters of ``entry`` (an
    io_quant_params.json entry) clips: how many values lie more than half a step outside the
    range its integers hold, and that range; ``None`` when nothing is clipped."""
    if entry.get("scale") is None or not value.dtype.is_floating_point or value.numel() == 0:
        return None
    scale, zero = float(entry["scale"]), int(entry["zero_point"])
    low, high = (entry["quant_min"] - zero) * scale, (entry["quant_max"] - zero) * scale
    values = value.double()
    outside = int(((values < low - scale / 2) | (values > high + scale / 2)).sum())
    if outside == 0:
        return None
    smallest, largest = float(values.min()), float(values.max())
    hint = ""
    if smallest >= 0 and 2 * high < largest <= 255:
        hint = (
            "; pixel values in [0, 255]? scale them to the model's range (a .png is mapped "
            "by --image-range)"
        )
    return (
        f"{source}: {outside} of {value.numel()} values of input {entry['index']} "
        f"({entry['name']}) lie outside [{low:.4g}, {high:.4g}], the range its {entry['dtype']} "
        f"quantization (scale {scale:.6g}) holds, and are clipped to it (the values span "
        f"[{smallest:.4g}, {largest:.4g}]{hint})"
    )


def _check_program_inputs(
    values: list[torch.Tensor],
    program: Any,
    entries: list[dict[str, Any]],
    sources: Sequence[Path],
    params_path: Path | None,
    method: str = "forward",
) -> None:
    """Each value (as the program will get it) against the input the program declares: its
    dtype and, for static inputs, its shape. Refused naming the input, what was given and what
    it takes, before any runtime sees it (``executorch.runtime`` answers with an error code)."""
    from etkit_pterunner import TensorInfo, dtype_name

    infos = program.method(method).input_infos
    for value, info, entry, source in zip(values, infos, entries, sources, strict=True):
        if not isinstance(info, TensorInfo) or info.dtype is None:
            continue
        name = f"input {entry['index']} ({entry['name']})"
        if value.dtype != info.dtype:
            wanted, given = dtype_name(info.dtype), dtype_name(value.dtype)
            if value.dtype.is_floating_point and entry.get("scale") is None:
                fix = (
                    f"there is no io_quant_params.json beside the program to quantize float "
                    f"values with: copy the export's beside it, or give {wanted} values"
                    if params_path is None
                    else f"give {wanted} values"
                )
            else:
                fix = f"give float values (quantized as io_quant_params.json says) or {wanted} ones"
            raise RunUsageError(
                f"{source}: {name} takes {wanted} {list(info.sizes)}, got {given} "
                f"{list(value.shape)}: {fix}"
            )
        if not info.dynamic and tuple(value.shape) != tuple(info.sizes):
            raise RunUsageError(
                f"{source}: shape {list(value.shape)}, but {name} takes {list(info.sizes)}"
            )


def _write_png(path: Path, value: torch.Tensor, image_range: tuple[float, float]) -> None:
    import torch
    from PIL import Image

    low, high = image_range
    pixels = ((value[0].permute(1, 2, 0) - low) / (high - low) * 255).round().clamp(0, 255)
    array = pixels.to(torch.uint8).numpy()
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[array.shape[2]]
    Image.fromarray(array[:, :, 0] if mode == "L" else array, mode=mode).save(path)


def trace_path(etdump: Path) -> Path:
    """Where ``--etdump PATH`` puts the Chrome trace of a run in etkit's runner."""
    return etdump if etdump.suffix == ".json" else etdump.with_suffix(".json")


def debug_buffer_path(etdump: Path) -> Path:
    """Where ``--etdump PATH`` puts the ETDump's intermediate outputs (the debug buffer)."""
    return etdump.with_name(etdump.name + ".debug")


def run_scenario_folder(
    folder: Path,
    inputs: list[Path],
    out: Path,
    image_range: tuple[float, float] = (-1.0, 1.0),
) -> dict[str, Any]:
    """Runs an export's ``scenario/`` folder with ``scenario_runner`` (its own example inputs,
    or ``inputs``: files read as ``run_export`` reads them, quantized with the export's
    ``io_quant_params.json``) and writes the outputs into ``out`` as ``run_export`` does."""
    if not (folder / "scenario.json").is_file():
        raise RunUsageError(f"--scenario {folder}: no scenario.json there (export with --scenario)")
    check_arguments(inputs, out)
    params_path = folder.parent / "io_quant_params.json"
    params = json.loads(params_path.read_text()) if params_path.is_file() else None
    import numpy as np
    import torch

    from etkit_exporter.core.io_params import float_output
    from etkit_exporter.vgf.scenario import ScenarioError, run_scenario

    values = None
    warnings: list[str] = []
    if inputs:
        entries = (
            params["inputs"]
            if params
            else [{"index": k, "name": f"input {k}"} for k in range(len(inputs))]
        )
        if len(inputs) != len(entries):
            raise RunUsageError(
                f"{folder} takes {len(entries)} inputs; {len(inputs)} --input given"
            )
        values = [
            _checked_input(_read_input(p, image_range), e, str(p), warnings)
            for p, e in zip(inputs, entries, strict=True)
        ]
    start = time.perf_counter()
    try:
        outputs = run_scenario(folder, values)
    except (ScenarioError, ValueError) as error:
        raise RunUsageError(str(error)) from error
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k, array in enumerate(outputs):
        value = torch.from_numpy(np.ascontiguousarray(array))
        np.save(out / f"output_{k}.npy", value.numpy())
        written.append(f"output_{k}.npy")
        entry = params["outputs"][k] if params else {"scale": None}
        if value.dim() == 4 and value.shape[1] in (1, 3, 4):
            _write_png(out / f"output_{k}.png", float_output(value, entry), image_range)
            written.append(f"output_{k}.png")
    return {
        "outputs": written,
        "runner": "scenario_runner, one process, Vulkan",
        "seconds": seconds,
        "warnings": warnings,
    }


def run_export(
    pte: Path,
    inputs: list[Path],
    out: Path,
    *,
    backend_impl: GridSamplerImpl = "cpu",
    image_range: tuple[float, float] = (-1.0, 1.0),
    etdump: Path | None = None,
    method: str | None = None,
    size: str | None = None,
) -> dict[str, Any]:
    """Runs ``pte`` (a ``.pte``, or an export's folder) on the files ``inputs`` and writes its
    outputs into ``out`` (a new or empty folder): its ``forward``, or the method ``method``
    names or the one of ``size`` (``choose_method``). Returns a summary: outputs written, seconds
    per delegate call, total seconds, what ran it, warnings (inputs clipped by their
    quantization, the runner's), and with ``etdump`` the profile written (module docstring)."""
    pte = resolve_program(pte)
    check_arguments(inputs, out, etdump)
    params_path = pte.with_name("io_quant_params.json")
    params = json.loads(params_path.read_text()) if params_path.is_file() else None
    import numpy as np
    import torch

    from etkit_exporter.core.io_params import float_output
    from etkit_exporter.programs import load_program
    from etkit_pterunner import PteError

    try:
        program = load_program(pte, grid_sampler_impl=backend_impl)
        name = choose_method(program, method, size)
        if etdump is not None and name != "forward":
            raise RunUsageError(f"--etdump profiles forward only, not {name}")
        in_runtime = _runs_in_executorch_runtime(program, profile=etdump is not None)
        if not in_runtime:
            program.check(name)
    except PteError as error:
        raise RunUsageError(f"{pte}: {error}") from error
    count = len(program.method(name).inputs)
    if params and name in params.get("methods", {}):
        params = params["methods"][name]  # that method's IO table
    entries = (
        params["inputs"] if params else [{"index": k, "name": f"input {k}"} for k in range(count)]
    )
    if len(inputs) != len(entries):
        raise RunUsageError(f"{pte} takes {len(entries)} inputs; {len(inputs)} --input given")
    warnings: list[str] = []
    values = [
        _checked_input(_read_input(path, image_range), entry, str(path), warnings)
        for path, entry in zip(inputs, entries, strict=True)
    ]
    _check_program_inputs(values, program, entries, inputs, params_path if params else None, name)
    if size is not None and name == "forward" and values and values[0].dim() >= 3:
        given = "x".join(str(s) for s in values[0].shape[-2:])
        if given != size.strip().lower():
            raise RunUsageError(f"--size {size}, but {inputs[0]} is {given}")
    if in_runtime:
        outputs, summary = _run_in_executorch_runtime(pte, values, etdump, name)
    else:
        try:
            result = program.run(values, name)
        except PteError as error:
            raise RunUsageError(f"{pte}: {error}") from error
        outputs = list(result.outputs)
        summary = {
            "runner": "etkit runner",
            "seconds": result.seconds,
            "delegate_calls": [
                (call.backend_id, call.implementation, call.seconds)
                for call in result.delegate_calls
            ],
            "warnings": list(result.warnings),
        }
        if etdump is not None:
            from etkit_pterunner import write_chrome_trace

            trace = write_chrome_trace(result, trace_path(etdump), program=pte.name)
            summary["trace"] = str(trace)
            summary["trace_events"] = len(result.kernel_calls) + len(result.delegate_calls)
    summary["warnings"] = [*warnings, *summary["warnings"]]
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for k, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor):
            continue
        np.save(out / f"output_{k}.npy", value.contiguous().numpy())
        written.append(f"output_{k}.npy")
        entry = params["outputs"][k] if params else {"scale": None}
        if value.dim() == 4 and value.shape[1] in (1, 3, 4):
            _write_png(out / f"output_{k}.png", float_output(value, entry), image_range)
            written.append(f"output_{k}.png")
    return {"outputs": written, "method": name, **summary}


def _runs_in_executorch_runtime(program: Any, *, profile: bool) -> bool:
    """Whether to run in ``executorch.runtime``: when it has every backend the program's
    delegates name, and either an ETDump is asked for or etkit's runner cannot run it."""
    from etkit_exporter.programs.runtime import runtime_can_run

    return runtime_can_run(program) and (profile or bool(program.unsupported()))


def _run_in_executorch_runtime(
    pte: Path, values: list[torch.Tensor], etdump: Path | None, name: str = "forward"
) -> tuple[list[Any], dict[str, Any]]:
    """Runs ``pte`` in ``executorch.runtime``; with ``etdump``, profiled (ETDump and its debug
    buffer written, its delegate calls read back through the Inspector, with the export's
    ETRecord beside the program when there is one)."""
    from etkit_exporter.programs.runtime import run_with_etdump, runtime_method

    summary: dict[str, Any] = {"runner": "executorch.runtime", "warnings": []}
    try:
        if etdump is None:
            method = runtime_method(pte, name)
            began = time.perf_counter()
            outputs = list(method.execute(values)) if method is not None else []
            summary.update(seconds=time.perf_counter() - began, delegate_calls=[])
            return outputs, summary
        debug = debug_buffer_path(etdump)
        outputs, seconds = run_with_etdump(pte, values, etdump, debug)
    except RuntimeError as error:
        raise RunUsageError(f"{pte}: executorch.runtime failed: {error}") from error
    summary.update(seconds=seconds, etdump=str(etdump), debug_buffer=str(debug))
    summary.update(_etdump_calls(etdump, debug, pte.with_name("etrecord.bin")))
    return outputs, summary


def _etdump_calls(etdump: Path, debug: Path, etrecord: Path) -> dict[str, Any]:
    """The delegate calls an ETDump holds (backend names from the ETRecord, if there is one),
    and how many events it holds."""
    from executorch.devtools import Inspector

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inspector = Inspector(
            etdump_path=str(etdump),
            etrecord=str(etrecord) if etrecord.is_file() else None,
            debug_buffer_path=str(debug),
        )
    events = [event for block in inspector.event_blocks for event in block.events]
    calls = [
        (event.delegate_backend_name or "delegate", "executorch.runtime",
         (event.perf_data.avg if event.perf_data else 0.0) / 1000)
        for event in events
        if event.name == "DELEGATE_CALL"
    ]  # fmt: skip
    return {"delegate_calls": calls, "etdump_events": len(events)}


def run_frames(
    pte: Path,
    frames: Path,
    out: Path,
    *,
    backend_impl: GridSamplerImpl = "cpu",
    image_range: tuple[float, float] = (-1.0, 1.0),
) -> dict[str, Any]:
    """Runs ``pte`` (an export with state: io_quant_params.json's ``state``) over the frames in
    the folder ``frames``, in name order, each state input given what its output returned the
    frame before, as it is (the first frame: the state at zero): a frame is a file (a program
    with one input besides its state) or a sub-folder with one file per such input, sorted by
    name. Writes ``frame_NNN/output_K.npy`` (and ``.png`` for image-like outputs) into
    ``out``. Returns a summary: frames, seconds, frames per second, what ran it, warnings."""
    import numpy as np
    import torch

    from etkit_exporter.core.io_params import float_output, program_input
    from etkit_exporter.programs import load_program
    from etkit_pterunner import PteError

    pte = resolve_program(pte)
    check_arguments([], out)
    params_path = pte.with_name("io_quant_params.json")
    params = json.loads(params_path.read_text()) if params_path.is_file() else {}
    pairs = {p["input_index"]: p["output_index"] for p in params.get("state", [])}
    if not pairs:
        raise RunUsageError(
            f"--frames: {pte} keeps no state (its io_quant_params.json names no state pair); "
            "run each frame with --input"
        )
    entries = params["inputs"]
    free = [e for e in entries if e["index"] not in pairs]
    listed = sorted(frames.iterdir()) if frames.is_dir() else []
    if not listed:
        raise RunUsageError(f"--frames {frames}: give a folder of frames (files or sub-folders)")
    try:
        program = load_program(pte, grid_sampler_impl=backend_impl)
        in_runtime = _runs_in_executorch_runtime(program, profile=False)
        if not in_runtime:
            program.check("forward")
    except PteError as error:
        raise RunUsageError(f"{pte}: {error}") from error
    method = None
    if in_runtime:
        from etkit_exporter.programs.runtime import runtime_method

        method = runtime_method(pte)
    runner = "executorch.runtime" if in_runtime else "etkit runner"

    def run(values: list[torch.Tensor]) -> list[torch.Tensor]:
        if method is not None:
            return list(method.execute(values))
        return list(program.run(values).outputs)

    warnings: list[str] = []
    state = {k: program_input(torch.zeros(entries[k]["shape"]), entries[k]) for k in pairs}
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for number, frame in enumerate(listed):
        files = sorted(p for p in frame.iterdir()) if frame.is_dir() else [frame]
        if len(files) != len(free):
            raise RunUsageError(
                f"--frames {frame}: {len(files)} files where the program takes {len(free)} "
                "inputs besides its state; give one file per input"
            )
        given = iter(files)
        values = [
            state[e["index"]] if e["index"] in pairs
            else _checked_input(_read_input(path := next(given), image_range), e, str(path),
                                warnings)
            for e in entries
        ]  # fmt: skip
        outputs = [y.clone() for y in run(values)]
        state = {k: outputs[j] for k, j in pairs.items()}
        folder = out / f"frame_{number:03d}"
        folder.mkdir()
        for k, value in enumerate(outputs):
            np.save(folder / f"output_{k}.npy", value.contiguous().numpy())
            if value.dim() == 4 and value.shape[1] in (1, 3, 4):
                _write_png(folder / f"output_{k}.png", float_output(value, params["outputs"][k]),
                           image_range)  # fmt: skip
    seconds = time.perf_counter() - began
    return {
        "frames": len(listed),
        "seconds": seconds,
        "frames_per_second": len(listed) / seconds if seconds > 0 else None,
        "runner": runner,
        "warnings": warnings,
    }
