"""Executed AArch64 instructions per output pixel of etkit-gridsampler's integer kernel: the scalar
kernel against the NEON kernel, counted under qemu-user (no Arm machine needed).

Run on demand (not in CI): .venv/bin/python bench/neon_insn_count.py [--case NAME]
Needs g++-aarch64-linux-gnu and qemu-user (scripts/setup.sh installs them).

Method. The test driver (libs/gridsampler/tests/native/quantized_driver.cpp) is built for AArch64
as test_neon_qemu.py builds it, but with -O3 as CMakeLists.txt builds the library, and run under
`qemu-aarch64 -singlestep -d exec,nochain`: one translated block per guest instruction, and a
"Trace" line logged before each block executes, so the lines count the instructions the program
executed. Each case runs twice per instruction set, with R and 3R output rows (or batch
elements) of the same image; the difference of the two counts over the difference of the output
pixels is the count per output pixel, free of the process start, reading the inputs and the
per-call set-up. Instruction counts are not cycles: they ignore the latency and throughput of each
instruction, memory and caches (qemu models none of them), so the ratio is an upper bound on the
speed-up an Arm core would show where the kernel is compute-bound. Wall time under emulation
means nothing (NEON instructions are emulated by helper calls) and is not reported.

Cases: those of bench/gridsampler_bench.py (1080p RGBA bilinear with a smooth flow near identity
and border padding, the same with nearest sampling, RGB, RGBA stored NCHW, a RAFT-style
correlation lookup, 540p feature maps of 8 and 16 channels) and a 540p map of 5 channels (the
layout whose taps the NEON kernel reads one by one); and nearest sampling in every kind of its
second pass: planar, 2, 3, 4, 8, 16 and 5 channels (the last any layout's pass); step 5 of
nearest is a table of the 256 byte values, or a copy where the output's quantization is the
image's ("bytes copied": SNORM8 clamps -128). int8 images, int16 SNORM16 grids, int8 outputs
(SNORM8 but where said).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs" / "gridsampler" / "tests"))

import neon_qemu  # noqa: E402  (the test helper that builds and speaks to the driver)
from gridsampler_bench import lookup_grid, smooth_flow_grid  # noqa: E402  (the same grids)

from etkit_gridsampler import GridSampleOp, QParams, cpu  # noqa: E402

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
SNORM16 = QParams(1 / 32767, 0, -32767, 32767, torch.int16)


@dataclass(frozen=True)
class Workload:
    name: str
    channels: int
    height: int
    width: int
    mode: str = "bilinear"
    nchw: bool = False
    lookup: bool = False  # 9 x 9 samples around a point per 46 x 62 one-channel map
    output_min: int = -127  # SNORM8 clamps an image's -128; with -128, nearest copies the bytes


WORKLOADS = [
    Workload("1080p RGBA bilinear", 4, 1080, 1920),
    Workload("1080p RGBA nearest", 4, 1080, 1920, mode="nearest"),
    Workload("1080p RGB bilinear", 3, 1080, 1920),
    Workload("1080p RGBA bilinear, NCHW", 4, 1080, 1920, nchw=True),
    Workload("correlation lookup, 1 channel", 1, 46, 62, lookup=True),
    Workload("540p 8 channels bilinear", 8, 540, 960),
    Workload("540p 16 channels bilinear", 16, 540, 960),
    Workload("540p 5 channels bilinear", 5, 540, 960),
    Workload("1080p RGBA nearest, bytes copied", 4, 1080, 1920, "nearest", output_min=-128),
    Workload("1080p RGBA nearest, NCHW", 4, 1080, 1920, mode="nearest", nchw=True),
    Workload("1080p RGB nearest", 3, 1080, 1920, mode="nearest"),
    Workload("540p 2 channels nearest", 2, 540, 960, mode="nearest"),
    Workload("540p 8 channels nearest", 8, 540, 960, mode="nearest"),
    Workload("540p 16 channels nearest", 16, 540, 960, mode="nearest"),
    Workload("540p 16 channels nearest, bytes copied", 16, 540, 960, "nearest", output_min=-128),
    Workload("540p 5 channels nearest", 5, 540, 960, mode="nearest"),
]


def quantize_grid(grid: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(grid * 32767), -32767, 32767).to(torch.int16).contiguous()


def cases(w: Workload, size: int) -> list[neon_qemu.Case]:
    """The scalar and the NEON case of `w` with `size` output rows (lookups: batch elements)."""
    generator = torch.Generator().manual_seed(0)
    if w.lookup:
        image = torch.randint(-128, 128, (size, 1, w.height, w.width), dtype=torch.int8,
                              generator=generator)  # fmt: skip
        grid = quantize_grid(lookup_grid(size, w.height, w.width, generator))
        op = GridSampleOp("bilinear", "zeros", True, SNORM8, SNORM16, SNORM8)
    else:
        image = torch.randint(-128, 128, (1, w.channels, w.height, w.width), dtype=torch.int8,
                              generator=generator)  # fmt: skip
        if not w.nchw:
            image = image.contiguous(memory_format=torch.channels_last)
        grid = quantize_grid(smooth_flow_grid(w.height, w.width)[:, :size])
        output = QParams(1 / 127, 0, w.output_min, 127, torch.int8)
        op = GridSampleOp(w.mode, "border", False, SNORM8, SNORM16, output)  # type: ignore[arg-type]
    expected = cpu.grid_sample(image, grid, op, isa="scalar")
    return [
        neon_qemu.Case(image, grid, op, expected.stride(), isa=isa) for isa in ("scalar", "neon")
    ]


def count_instructions(binary: Path, case: neon_qemu.Case) -> tuple[int, neon_qemu.Result]:
    """Runs one case under qemu with the exec trace; returns the instructions it executed."""
    process = subprocess.Popen(
        [neon_qemu.QEMU, "-singlestep", "-d", "exec,nochain", str(binary)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin and process.stdout and process.stderr
    count = 0

    def count_trace() -> None:
        nonlocal count
        stream, tail = process.stderr, b""
        assert stream is not None
        while chunk := stream.read(1 << 22):
            text = tail + chunk
            cut = text.rfind(b"\n") + 1
            count += text[:cut].count(b"Trace ")
            tail = text[cut:]
        count += tail.count(b"Trace ")

    reply: list[bytes] = []
    readers = [
        threading.Thread(target=count_trace),
        threading.Thread(target=lambda: reply.append(process.stdout.read())),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    process.stdin.write(neon_qemu.encode([case]))
    process.stdin.close()
    for reader in readers:
        reader.join()
    if process.wait() != 0:
        raise neon_qemu.DriverError(f"the driver exited with status {process.returncode}")
    return count, neon_qemu.decode(reply[0], [case])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help="run only the workloads whose name contains this")
    args = parser.parse_args()
    workloads = [w for w in WORKLOADS if args.case is None or args.case in w.name]
    print(
        "executed AArch64 instructions per output pixel (qemu-aarch64 -singlestep -d exec,nochain,"
        " one trace line per instruction; the difference of runs with R and 3R output rows, "
        "divided by the difference of their pixels); the driver built with aarch64-linux-gnu-g++ "
        "-O3 -static (the library's optimization level)"
    )
    print("| case | pixels counted | scalar | NEON | scalar / NEON |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        binary = neon_qemu.build_driver(Path(directory), optimization="-O3")
        for w in workloads:
            small = 16 if w.lookup else 2
            per_pixel: dict[str, float] = {}
            outputs: dict[str, list[torch.Tensor]] = {}
            pixels = 0
            for isa_index, isa in enumerate(("scalar", "neon")):
                counts, sizes = [], []
                outputs[isa] = []
                for size in (small, 3 * small):
                    case = cases(w, size)[isa_index]
                    count, result = count_instructions(binary, case)
                    neon_pixels = result.counters["pixels"]
                    assert neon_pixels == (0 if isa == "scalar" else result.output[:, 0].numel())
                    counts.append(count)
                    outputs[isa].append(result.output)
                    sizes.append(result.output[:, 0].numel())
                pixels = sizes[1] - sizes[0]
                per_pixel[isa] = (counts[1] - counts[0]) / pixels
            for scalar, neon in zip(outputs["scalar"], outputs["neon"], strict=True):
                assert torch.equal(scalar, neon), f"{w.name}: NEON differs from scalar"
            print(
                f"| {w.name} | {pixels} | {per_pixel['scalar']:.2f} | {per_pixel['neon']:.2f} | "
                f"{per_pixel['scalar'] / per_pixel['neon']:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
