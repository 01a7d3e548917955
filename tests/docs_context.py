"""What the guides' Python examples take from their reader: ``tests/test_docs.py`` runs every
example of a page in order, in one namespace and working folder of the page's own, and before
an example named in ``CONTEXT`` adds what its prose assumes the reader has (a model, its
inputs, calibration samples, a written export), small: the demos at their own sizes, one or two
samples. What an example uses that neither it nor an earlier example of its page defines and
that is not the reader's (an import, a name of etkit) is the page's mistake: fix the page.

A page is a page of the site: its examples include those of the files it pulls in with
``--8<--`` (the libraries' READMEs, the exporter's ``docs/``). A context is a function of the
page's working folder and of ``Pages`` (an earlier page's examples, run once) returning the
names to add. The slow parts are made once and shared: the VGF export the "Your own model"
guide writes serves the "Run a program" and scenario pages, one verified XNNPACK export the
"Run a program", "Inspecting in detail" and Model Explorer pages. All of it is real: etkit's
exports, models and runs; nothing stands in for one."""

from __future__ import annotations

import json
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


def xnnpack_export(pages: Pages) -> Path:
    """The flow-warp demo exported for XNNPACK with ``bundle=True`` (so verified: the Model
    Explorer data files are written), once: the folder, in the "Run a program" guide's."""
    from etkit_exporter import export_model
    from etkit_exporter.export.demos import DEMOS

    folder = pages.folder("how-to/run.md") / "xnnpack"
    if not (folder / "model.bpte").is_file():
        model, inputs = DEMOS["flow-warp"]()
        export_model(model, inputs, artifacts_root=folder, target="xnnpack", bundle=True)
    return folder


def _bundled_program(here: Path, pages: Pages) -> dict[str, Any]:
    """``model.bpte``: the flow-warp demo exported for XNNPACK with ``bundle=True``."""
    shutil.copy(xnnpack_export(pages) / "model.bpte", here / "model.bpte")
    return {}


def _sampler_operands(here: Path, pages: Pages) -> dict[str, Any]:
    """An int8 image and an int16 grid, as the example's ``op`` quantizes them."""
    torch.manual_seed(0)
    return {
        "image": torch.randint(-127, 128, (1, 4, 32, 32), dtype=torch.int8),
        "grid": torch.randint(-32767, 32768, (1, 16, 16, 2), dtype=torch.int16),
    }


class ConvWarp(torch.nn.Module):
    """An image (RGB: 3 channels) warped by a grid, both inputs, then a convolution: a program
    with work for VGF around its grid sampler."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return self.conv(F.grid_sample(image, grid, padding_mode="border", align_corners=False))


def image_and_grid(channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16 x 16 image of ``channels`` channels in [-1, 1] and a 16 x 16 grid."""
    torch.manual_seed(0)
    return torch.rand(1, channels, 16, 16) * 2 - 1, torch.rand(1, 16, 16, 2) * 2 - 1


def quantized_for_vgf(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> torch.export.ExportedProgram:
    """``model`` (an image and a grid in, an image out) quantized as the exporter does for VGF
    (``etkit_quant``: int8 SNORM images, an int16 SNORM grid) and exported again."""
    from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec

    from etkit_quant import BoundaryQuantizer, quantize, snorm8, snorm16

    base = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+int16"))
    base.set_global(get_symmetric_quantization_config())
    quantizer = BoundaryQuantizer(
        base, input_qspecs=(snorm8(), snorm16()), output_qspecs=(snorm8(),)
    )
    converted = quantize(model, inputs, quantizer)
    return torch.export.export(converted, inputs, strict=True)


def _quantized_program(here: Path, pages: Pages) -> dict[str, Any]:
    """``program``: a quantized ``ExportedProgram`` with one grid sampler (``etkit_quant``)."""
    return {"program": quantized_for_vgf(Warp().eval(), image_and_grid(channels=4))}


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


def _rgb_model(here: Path, pages: Pages) -> dict[str, Any]:
    """``model``: an RGB image warped by a grid, then a convolution; ``inputs``."""
    return {"model": ConvWarp().eval(), "inputs": image_and_grid()}


def _padded_program(here: Path, pages: Pages) -> dict[str, Any]:
    """``program``: the page's padded ``graph`` quantized and exported again, "as usual"."""
    namespace = pages.run("libraries/layout.md", 0)
    return {"program": quantized_for_vgf(namespace["graph"], namespace["inputs"])}


def _partition_readme(here: Path, pages: Pages) -> dict[str, Any]:
    """``quantized_program``: a quantized grid sampler and convolution."""
    return {"quantized_program": quantized_for_vgf(ConvWarp().eval(), image_and_grid())}


def _quant_readme(here: Path, pages: Pages) -> dict[str, Any]:
    """``base`` a VGF quantizer, ``model`` the spatial-transformer demo (an image in, an image
    out), ``example_inputs``, ``samples`` two calibration samples."""
    from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec

    from etkit_exporter.export.demos import DEMOS

    model, example_inputs = DEMOS["stn"]()
    base = VgfQuantizer(VgfCompileSpec())
    base.set_global(get_symmetric_quantization_config())
    return {
        "base": base,
        "model": model,
        "example_inputs": example_inputs,
        "samples": [example_inputs, tuple(torch.rand_like(x) * 2 - 1 for x in example_inputs)],
    }


def _etdump(here: Path, pages: Pages) -> dict[str, Any]:
    """What the page's ``etkit run ... --etdump run.etdp`` wrote: the flow-warp demo's XNNPACK
    export as ``artifacts/flow-warp-xnnpack``, its frames as ``f0.npy`` and ``f1.npy``, and
    that command run (``etkit``'s own entry point, in the page's folder)."""
    import numpy as np

    from etkit_exporter.cli.main import main
    from etkit_exporter.export.demos import DEMOS

    (here / "artifacts").mkdir(exist_ok=True)
    (here / "artifacts" / "flow-warp-xnnpack").symlink_to(xnnpack_export(pages))
    _, (frame0, frame1) = DEMOS["flow-warp"]()
    np.save(here / "f0.npy", frame0.numpy())
    np.save(here / "f1.npy", frame1.numpy())
    command = "run artifacts/flow-warp-xnnpack/model.pte --input f0.npy --input f1.npy"
    assert main([*command.split(), "--etdump", "run.etdp"]) == 0
    return {}


def _verified_export(here: Path, pages: Pages) -> dict[str, Any]:
    """``artifacts/flow-warp``: a verified export of the flow-warp demo (its Model Explorer data
    files written): the XNNPACK one of "Run a program" (the example reads paths only)."""
    (here / "artifacts").mkdir(exist_ok=True)
    (here / "artifacts" / "flow-warp").symlink_to(xnnpack_export(pages))
    return {}


def _scenario_export(here: Path, pages: Pages) -> dict[str, Any]:
    """``artifacts/flow-warp``: the VGF export "Your own model" writes from Python, copied, with
    the ``scenario/`` that ``export_model(..., scenario=True)`` writes (its writer, on the
    example inputs in the program's IO types; left out: the export's own check of the
    scenario against the program, which runs both, seconds); ``frame0_q``, ``frame1_q`` those
    inputs."""
    from etkit_exporter.core.io_params import program_input
    from etkit_exporter.vgf.scenario_writer import write_scenario

    written = pages.run("getting-started/your-model.md", 1)["result"]
    export = here / "artifacts" / "flow-warp"
    shutil.copytree(pages.folder("getting-started/your-model.md") / written.pte_path.parent, export)
    io_params = json.loads((export / "io_quant_params.json").read_text())
    frame0_q, frame1_q = (
        program_input(x, entry)
        for x, entry in zip(written.example_inputs, io_params["inputs"], strict=True)
    )
    write_scenario(export / "scenario", export / "model.pte", [frame0_q, frame1_q], io_params)
    return {"frame0_q": frame0_q, "frame1_q": frame1_q}


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
    "libraries/layout.md#0": _rgb_model,
    "libraries/layout.md#1": _padded_program,
    "libraries/partition.md#0": _partition_readme,
    "libraries/quant.md#0": _quant_readme,
    "how-to/inspect-details.md#0": _etdump,
    "how-to/model-explorer.md#0": _verified_export,
    "how-to/scenario.md#0": _scenario_export,
}
