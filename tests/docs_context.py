"""What the guides' Python examples take from their reader: ``tests/test_docs.py`` runs every
example of a page in order, in one namespace and working folder of the page's own, and before
an example named in ``CONTEXT`` adds what its prose assumes the reader has (a model, its
inputs, calibration samples, a written export), small: the demos at their own sizes, one or two
samples. What an example uses that neither it nor an earlier example of its page defines and
that is not the reader's (an import, a name of etkit) is the page's mistake: fix the page.

A context is a function of the page's working folder and of ``Pages`` (an earlier page's
examples, run once: the export the "Your own model" guide writes serves the "Run a program"
guide) returning the names to add. All of it is real: etkit's exports, models and runs;
nothing stands in for one."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F


class Pages(Protocol):
    def run(self, page: str, index: int) -> dict[str, Any]:
        """The page's namespace once its examples up to ``index`` have run."""
        ...

    def folder(self, page: str) -> Path:
        """The page's working folder."""
        ...


Context = Callable[[Path, Pages], dict[str, Any]]


def snorm8_integers(values: torch.Tensor) -> torch.Tensor:
    """A float image in [-1, 1] as an SNORM8 program input takes it (scale 1/127)."""
    return (values * 127).round().clamp(-127, 127).to(torch.int8)


class Warp(torch.nn.Module):
    """An RGBA image warped by a grid, both inputs."""

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, padding_mode="border", align_corners=False)


def _qat_guide(here: Path, pages: Pages) -> dict[str, Any]:
    """``model`` a size-agnostic network, ``example`` and ``frames`` (calibration) at the
    smallest crop, ``batches`` one batch of two crops, ``render_frames`` another size in the
    range (not 1080 x 1920: an export at that size takes minutes here)."""
    from etkit_exporter.export.demos import AnySizeFlowWarp, moving_textures

    torch.manual_seed(0)
    pairs = [(frame0, frame1) for frame0, frame1, _ in moving_textures(4, 64, 96)]
    return {
        "model": AnySizeFlowWarp().eval(),
        "example": pairs[0],
        "frames": pairs[:2],
        "batches": [(torch.cat((pairs[1][0], pairs[2][0])), torch.cat((pairs[1][1], pairs[2][1])))],
        "render_frames": moving_textures(1, 80, 112, seed=1)[0][:2],
    }


def _run_guide(here: Path, pages: Pages) -> dict[str, Any]:
    """The VGF export "Your own model" writes from Python, at the path the guide reads; a
    fixed-point model for the grid-sampler delegate (registered; not called: that program is
    one VGF, its sampler a compute segment); the demo's frames as integers."""
    from etkit_gridsampler import cpu, delegate_format

    written = pages.run("getting-started/your-model.md", 1)["result"]
    folder = pages.folder("getting-started/your-model.md") / written.pte_path.parent
    (here / "artifacts").mkdir(exist_ok=True)
    (here / "artifacts" / "flow-warp-vgf").symlink_to(folder)

    def my_fixed_point_model(blob: bytes, specs: Any, inputs: list[torch.Tensor]) -> torch.Tensor:
        sampler = delegate_format.decode(blob)
        image, grid = inputs[sampler.roles.image], inputs[sampler.roles.grid]
        return cpu.grid_sample(image, grid, sampler.op)

    frame0, frame1 = written.example_inputs
    return {
        "my_fixed_point_model": my_fixed_point_model,
        "frame0_q": snorm8_integers(frame0),
        "frame1_q": snorm8_integers(frame1),
    }


def _bundled_program(here: Path, pages: Pages) -> dict[str, Any]:
    """``model.bpte``: the flow-warp demo exported for XNNPACK with ``bundle=True``."""
    from etkit_exporter import export_model
    from etkit_exporter.export.demos import DEMOS

    model, inputs = DEMOS["flow-warp"]()
    export_model(model, inputs, artifacts_root=here / "xnnpack", target="xnnpack", bundle=True)
    shutil.copy(here / "xnnpack" / "model.bpte", here / "model.bpte")
    return {}


def _sampler_operands(here: Path, pages: Pages) -> dict[str, Any]:
    """An int8 image and an int16 grid, as the example's ``op`` quantizes them."""
    torch.manual_seed(0)
    return {
        "image": torch.randint(-127, 128, (1, 4, 32, 32), dtype=torch.int8),
        "grid": torch.randint(-32767, 32768, (1, 16, 16, 2), dtype=torch.int16),
    }


def _quantized_program(here: Path, pages: Pages) -> dict[str, Any]:
    """``program``: a quantized ``ExportedProgram`` with one grid sampler (``etkit_quant``)."""
    from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec

    from etkit_quant import BoundaryQuantizer, quantize, snorm8, snorm16

    torch.manual_seed(0)
    inputs = (torch.rand(1, 4, 16, 16) * 2 - 1, torch.rand(1, 16, 16, 2) * 2 - 1)
    base = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+int16"))
    base.set_global(get_symmetric_quantization_config())
    quantizer = BoundaryQuantizer(
        base, input_qspecs=(snorm8(), snorm16()), output_qspecs=(snorm8(),)
    )
    converted = quantize(Warp().eval(), inputs, quantizer)
    return {"program": torch.export.export(converted, inputs, strict=True)}


def _quantized_operands(here: Path, pages: Pages) -> dict[str, Any]:
    """The example's int8 image and int16 grid, and a float frame and grid."""
    torch.manual_seed(0)
    return {
        "image_q": torch.randint(-127, 128, (1, 4, 24, 24), dtype=torch.int8),
        "grid_q": torch.randint(-32767, 32768, (1, 12, 12, 2), dtype=torch.int16),
        "frame": torch.rand(1, 4, 24, 24) * 2 - 1,
        "grid": torch.rand(1, 12, 12, 2) * 2 - 1,
    }


def _two_sizes(here: Path, pages: Pages) -> dict[str, Any]:
    """The spatial-transformer demo (any size) at two small sizes for the guide's 256 and 1080
    lines; ``quantizer_copy`` a second quantizer configured as the page's ``quantizer``."""
    from etkit_exporter.export.demos import DEMOS
    from etkit_quant import BoundaryQuantizer, snorm8

    model, (x_256,) = DEMOS["stn"]()
    namespace = pages.run("libraries/quant-guide.md", 0)
    return {
        "model": model,
        "x_256": x_256,
        "x_1080": torch.rand(1, 4, 48, 64) * 2 - 1,
        "samples": [(x_256,), (torch.rand_like(x_256) * 2 - 1,)],
        "quantizer_copy": BoundaryQuantizer(
            namespace["base"], input_qspecs=(snorm8(),), output_qspecs=(snorm8(),)
        ),
    }


def _exporter_sequence(here: Path, pages: Pages) -> dict[str, Any]:
    """The exporter's state at that point: the captured flow-warp demo, its calibration, no
    user qspecs, a progress callback and a logger."""
    from etkit_exporter.export.demos import DEMOS

    model, example_inputs = DEMOS["flow-warp"]()
    exported = torch.export.export(model, example_inputs, strict=True)
    return {
        "example_inputs": example_inputs,
        "calibration": [example_inputs, tuple(torch.rand_like(x) * 2 - 1 for x in example_inputs)],
        "exported": exported,
        "graph": exported.module(check_guards=False),
        "progress": lambda done, total: None,
        "user_input_qspecs": [None, None],
        "user_output_qspecs": [None],
        "logger": logging.getLogger("example"),
    }


def _qat_loop(here: Path, pages: Pages) -> dict[str, Any]:
    """The flow-warp demo, its calibration, one training pair (frame 0 warped to frame 1)."""
    from etkit_exporter.export.demos import DEMOS, moving_textures

    model, example_inputs = DEMOS["flow-warp"]()
    frame0, frame1, _ = moving_textures(1)[0]
    return {
        "model": model,
        "example_inputs": example_inputs,
        "samples": [example_inputs],
        "data": [((frame0, frame1), frame1)],
        "loss_fn": F.l1_loss,
    }


CONTEXT: dict[str, Context] = {
    "how-to/qat.md#0": _qat_guide,
    "how-to/run.md#0": _run_guide,
    "how-to/run.md#1": _bundled_program,
    "libraries/gridsampler-guide.md#0": _sampler_operands,
    "libraries/gridsampler-guide.md#1": _quantized_program,
    "libraries/gridsampler-guide.md#4": _quantized_operands,
    "libraries/quant-guide.md#1": _two_sizes,
    "libraries/quant-guide.md#2": _exporter_sequence,
    "libraries/quant-guide.md#3": _qat_loop,
}
