"""Throughput of etkit-gridsampler's Vulkan kernel against a plain float32 bilinear shader.

Run on demand (not in CI): .venv/bin/python bench/vulkan_bench.py [--repeats N] [--sizes HxW ...]

Work: a 4-channel image (540x960 and 1080x1920), a smooth flow grid near identity, bilinear,
border padding, align_corners=False. etkit: its integer kernel (shaders/grid_sample.comp) on an
int8 channels-last image, an int16 SNORM16 grid and an int8 SNORM8 output, in the pipeline
specialized for that configuration (as ``vulkan.grid_sample`` runs it) and, for reference,
unspecialized (the SPIR-V as a scenario would run it without its specialization constants). The
anchor: bench/float_grid_sample.comp, the same sampling on float32 RGBA pixels and a float32 grid
(PyTorch's semantics), with the same dispatch shape. Each runs on the first Vulkan device (lavapipe
on a machine without a GPU) with its buffers, descriptor set and command buffer prepared once:
"kernel" times the dispatch alone, "with transfers" adds copying the inputs into the device's
buffers and the output back. `vulkan.grid_sample` is timed too, as a caller sees it (buffers
allocated and tensors converted on every call). All figures come from one run, the calls taking
turns round after round (the machine is shared and its speed drifts); Mpix/s counts output pixels.
"""

from __future__ import annotations

import argparse
import math
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from bench_common import measure, smooth_flow_grid

from etkit_gridsampler import GridSampleOp, QParams, cpu, vulkan
from etkit_gridsampler._vulkan_compute import BoundDispatch, compile_glsl, default_device

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
OP = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)
ANCHOR_SHADER = Path(__file__).with_name("float_grid_sample.comp")
ANCHOR_WORKGROUP = 64


def words(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``data``'s bytes as 32-bit words, zero-padded (storage buffers hold whole words)."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    padded = np.zeros(math.ceil(max(raw.size, 4) / 4) * 4, np.uint8)
    padded[: raw.size] = raw
    return padded.view(np.uint32)


class Kernel:
    """A dispatch prepared once: ``inputs`` uploaded to bindings 0, 1 and 3, the output at
    binding 2 read back as ``count`` elements of ``dtype``."""

    def __init__(
        self,
        spirv: bytes,
        inputs: dict[int, np.ndarray[Any, Any]],
        output_words: int,
        group_counts: tuple[int, int, int],
        dtype: type[np.generic],
        count: int,
        specialization: list[tuple[int, int]] | None = None,
    ) -> None:
        sizes = [inputs[0].nbytes, inputs[1].nbytes, 4 * output_words, inputs[3].nbytes]
        self.bound: BoundDispatch = default_device().prepare(
            spirv, sizes, group_counts, specialization=specialization or []
        )
        self.inputs, self.dtype, self.count = inputs, dtype, count
        self.upload()

    def upload(self) -> None:
        for index, array in self.inputs.items():
            self.bound.write(index, array)

    def download(self) -> np.ndarray[Any, Any]:
        return self.bound.read(2, self.dtype, self.count)

    def with_transfers(self) -> np.ndarray[Any, Any]:
        self.upload()
        self.bound.dispatch()
        return self.download()


class Case:
    """One measured call; `every`: it runs in one round of that many (slow ones)."""

    def __init__(self, run: Callable[[], object], every: int = 1) -> None:
        self.run, self.every = run, every
        self.times: list[float] = []

    def call(self) -> float:
        start = time.perf_counter()
        self.run()
        return time.perf_counter() - start


def run_size(height: int, width: int, repeats: int) -> None:
    generator = torch.Generator().manual_seed(0)
    image_f = torch.rand(1, 4, height, width, generator=generator) * 2 - 1
    grid_f = smooth_flow_grid(height, width)
    image_q = torch.clamp(torch.round(image_f * 127), -127, 127).to(torch.int8)
    image_q = image_q.contiguous(memory_format=torch.channels_last)
    grid_q = torch.clamp(torch.round(grid_f * 32767), -32767, 32767).to(torch.int16)
    pixels = height * width

    # etkit's integer kernel, as vulkan.grid_sample dispatches it
    description = vulkan.dispatch(tuple(image_q.shape), tuple(grid_q.shape), OP, channels_last=True)
    int_inputs = {
        0: words(image_q.permute(0, 2, 3, 1).numpy()),
        1: words(grid_q.numpy()),
        3: words(np.frombuffer(description.params_bytes(), np.uint8)),
    }
    constants = [(cid, value) for cid, _, value in description.specialization_constants]

    def int_kernel(specialization: list[tuple[int, int]] | None) -> Kernel:
        return Kernel(
            vulkan.spirv(),
            int_inputs,
            pixels,  # one word (four int8 channels) a pixel
            description.group_counts,
            np.int8,
            4 * pixels,
            specialization,
        )

    etkit, generic = int_kernel(constants), int_kernel(None)

    # the float32 anchor
    groups = math.ceil(pixels / ANCHOR_WORKGROUP)
    groups_x = min(groups, 65535)
    groups_y = math.ceil(groups / groups_x)
    anchor = Kernel(
        compile_glsl(ANCHOR_SHADER.read_text()),
        {
            0: image_f.permute(0, 2, 3, 1).contiguous().numpy(),
            1: grid_f.contiguous().numpy(),
            3: np.frombuffer(
                struct.pack("<4i", height, width, pixels, groups_x * ANCHOR_WORKGROUP), np.uint8
            ).copy(),
        },
        4 * pixels,
        (groups_x, groups_y, 1),
        np.float32,
        4 * pixels,
    )

    # both compute what they should
    etkit.bound.dispatch()
    generic.bound.dispatch()
    expected = cpu.grid_sample(image_q, grid_q, OP).permute(0, 2, 3, 1).reshape(-1).numpy()
    assert np.array_equal(etkit.download(), expected), "etkit's kernel differs from the CPU's"
    assert np.array_equal(generic.download(), expected), "the unspecialized kernel differs"
    anchor.bound.dispatch()
    ideal = F.grid_sample(image_f, grid_f, padding_mode="border", align_corners=False)
    anchor_error = np.abs(anchor.download() - ideal.permute(0, 2, 3, 1).reshape(-1).numpy()).max()
    assert anchor_error < 1e-3, f"the float32 anchor is {anchor_error} off PyTorch"

    cases = {
        "etkit int8 shader, kernel": Case(etkit.bound.dispatch),
        "float32 anchor shader, kernel": Case(anchor.bound.dispatch),
        "etkit int8 shader, with transfers": Case(etkit.with_transfers),
        "float32 anchor shader, with transfers": Case(anchor.with_transfers),
        "etkit int8 shader unspecialized, kernel": Case(generic.bound.dispatch, every=3),
        "etkit vulkan.grid_sample() call": Case(
            lambda: vulkan.grid_sample(image_q, grid_q, OP), every=3
        ),
    }
    results = measure(cases, repeats, warmups=3)
    for kernel in (etkit, generic, anchor):
        kernel.bound.close()
    print(f"\n1x4x{height}x{width}, bilinear, border, smooth flow near identity")
    for name, value in results.items():
        print(f"  {name:<42} {pixels / value / 1e6:8.1f} Mpix/s  {value * 1e3:8.2f} ms")
    for what in ("kernel", "with transfers"):
        ratio = results[f"float32 anchor shader, {what}"] / results[f"etkit int8 shader, {what}"]
        print(f"  int/float throughput, {what + ':':<26} {ratio:8.2f}")


def parse_size(text: str) -> tuple[int, int]:
    height, _, width = text.partition("x")
    return int(height), int(width)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", default=[(540, 960), (1080, 1920)], metavar="HxW"
    )
    args = parser.parse_args()
    info = vulkan.device_info()
    print(
        f"{info.name} ({info.driver_name} {info.driver_info}); median of {args.repeats} rounds "
        "(unspecialized and vulkan.grid_sample: every third); Mpix/s = output pixels/s"
    )
    for height, width in args.sizes:
        run_size(height, width, args.repeats)


if __name__ == "__main__":
    main()
