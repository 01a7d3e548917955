"""Running an exported program in ``executorch.runtime`` and comparing it with the PyTorch
models it came from."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from etkit_exporter.diagnostics import capture_native_log
from etkit_exporter.io_params import float_output, program_input
from etkit_exporter.pictures import is_image_like, write_panel

logger = logging.getLogger(__name__)


def psnr(actual: torch.Tensor, reference: torch.Tensor) -> float | None:
    """Peak signal-to-noise ratio in dB, the peak being the reference's dynamic range
    (max - min; 2 for a full [-1, 1] image). ``None`` when the two are identical (infinite)."""
    mse = float(((actual.double() - reference.double()) ** 2).mean())
    peak = float(reference.max() - reference.min()) or 1.0
    return None if mse == 0 else 10 * math.log10(peak * peak / mse)


def _outputs(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [v for v in value if isinstance(v, torch.Tensor)]  # type: ignore[attr-defined]


def _run_in_executorch_runtime(pte: Path, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from executorch.runtime import Runtime

    from etkit_gridsampler import runtime

    runtime.register()
    failure: RuntimeError | None = None
    with capture_native_log(echo=logger.isEnabledFor(logging.DEBUG)) as log:
        try:
            method = Runtime.get().load_program(pte).load_method("forward")
            raw = list(method.execute(inputs))
        except RuntimeError as error:
            failure = error
    if failure is not None:
        said = "; ".join(log.errors[-3:]) or "nothing on its log"
        raise RuntimeError(f"{failure} (the runtime said: {said})") from failure
    return raw


def _run_in_etkit_runner(pte: Path, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from etkit_exporter.runner import PteProgram

    result = PteProgram.load(pte, grid_sampler_impl="cpu").run(inputs)
    for warning in result.warnings:
        logger.warning("runner: %s", warning)
    return list(result.outputs)


RUNNERS: dict[str, str] = {
    "vgf": "etkit runner (VGF on scenario_runner, Vulkan)",
    "xnnpack": "executorch.runtime",
}


def _steps(actual: torch.Tensor, reference: torch.Tensor, entry: dict[str, Any]) -> dict[str, Any]:
    """How many output quantization steps apart two dequantized outputs are: max and a
    histogram (0, 1, 2, more)."""
    steps = ((actual.double() - reference.double()).abs() / entry["scale"]).round().long()
    histogram = {str(k): int((steps == k).sum()) for k in range(3)}
    histogram["more"] = int((steps > 2).sum())
    return {"max_steps": int(steps.max()), "steps_histogram": histogram}


def verify_program(
    pte: Path,
    model: torch.nn.Module,
    quantized_model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    io_params: dict[str, Any],
    target: str = "xnnpack",
    pictures: Path | None = None,
) -> dict[str, Any]:
    """Runs the written ``pte`` on integer inputs made from the example inputs through
    ``io_params`` (an XNNPACK program in ``executorch.runtime``; a VGF program, which that
    runtime cannot run, in ``etkit_exporter.runner`` with its VGF delegates on the Vulkan device
    through ``scenario_runner``), dequantizes its outputs and compares each with the float model
    and with the quantized PT2E model: max abs error and PSNR, and for integer outputs against
    the quantized model the steps apart (max and histogram). With ``pictures`` (a folder), each
    image-like output gets ``verify_output_K.png`` there: float model, program, error heatmap
    (``etkit_exporter.pictures``), named in its float-model comparison as ``picture``."""
    inputs = [
        program_input(x, entry)
        for x, entry in zip(example_inputs, io_params["inputs"], strict=True)
    ]
    raw = (
        _run_in_etkit_runner(pte, inputs)
        if target == "vgf"
        else _run_in_executorch_runtime(pte, inputs)
    )
    actual = [float_output(y, e) for y, e in zip(raw, io_params["outputs"], strict=True)]
    with torch.no_grad():
        references = {
            "float model": _outputs(model(*example_inputs)),
            "quantized PT2E model": _outputs(quantized_model(*example_inputs)),
        }
    comparisons = []
    for name, outputs in references.items():
        for index, (y, ref) in enumerate(zip(actual, outputs, strict=True)):
            y = y.contiguous().reshape(ref.shape)
            comparison = {
                "output": index,
                "reference": name,
                "max_abs_error": float((y - ref).abs().max()),
                "psnr_db": psnr(y, ref),
            }
            entry = io_params["outputs"][index]
            if name == "quantized PT2E model" and entry["scale"] is not None:
                comparison.update(_steps(y, ref, entry))
            if name == "float model" and pictures is not None and is_image_like(ref):
                picture = f"verify_output_{index}.png"
                db = comparison["psnr_db"]
                write_panel(
                    pictures / picture,
                    ref,
                    y,
                    f"output {index} vs the float model: PSNR "
                    + ("inf" if db is None else f"{db:.2f} dB")
                    + f", max abs error {comparison['max_abs_error']:.4g}",
                )
                comparison["picture"] = picture
            comparisons.append(comparison)
    return {"runner": RUNNERS.get(target, "executorch.runtime"), "comparisons": comparisons}
