"""Two builds of etkit-gridsampler's native library, side by side in one run: the integer CPU
kernel of each, per case and instruction set, and their ratio (for a change to the C++ kernels:
"no case slower than the noise").

Run on demand (not in CI), with two built libraries (a CMake build folder each, e.g. the old
sources from `git archive HEAD libs/gridsampler` built into /tmp/simd_old):

    .venv/bin/python bench/kernel_ab_bench.py --old /tmp/simd_old/_native*.so \
        --new libs/gridsampler/build/cp311-cp311-linux_x86_64/_native*.so [--repeats N]

The libraries are loaded into this process with RTLD_LOCAL (each binds its own symbols), called
through the C API `etkit_gridsampler_grid_sample_q`, one thread, taking turns call after call (in
order, then in reverse order, round after round) so that all see the same machine; each figure is
the median of the rounds (and the fastest round, less disturbed by other processes on a shared
machine). A third library, a byte copy of --old, runs as a control: its distance from --old is the
run-to-run noise of that case ("noise", "min noise"). With --layout-control, a rebuild of the old
sources whose code lies at other addresses runs too: its distance from --old (fastest rounds) is
what code placement alone moves ("layout noise": loops crossing other fetch boundaries). Every
case also checks that the old and the new build give the same bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_common import lookup_grid, smooth_flow_grid

MODES = {"bilinear": 0, "nearest": 1}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3, "neon": 4}


class CQParams(ctypes.Structure):
    """``EtkitQParams`` of native_api.h."""

    _fields_ = [
        ("scale", ctypes.c_double),
        ("zero_point", ctypes.c_int32),
        ("quant_min", ctypes.c_int32),
        ("quant_max", ctypes.c_int32),
    ]


SNORM8 = CQParams(1 / 127, 0, -127, 127)
SNORM16 = CQParams(1 / 32767, 0, -32767, 32767)
SNORM8_GRID = CQParams(1 / 127, 0, -127, 127)
OUTPUT_3 = CQParams(3 / 127, 1, -128, 127)  # ratio 1/3: the 64-bit requantization


def load(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    i64p = ctypes.POINTER(ctypes.c_int64)
    qp = ctypes.POINTER(CQParams)
    library.etkit_gridsampler_grid_sample_q.restype = ctypes.c_int
    library.etkit_gridsampler_grid_sample_q.argtypes = [
        ctypes.c_void_p, i64p, i64p,
        ctypes.c_void_p, ctypes.c_int, i64p, i64p,
        ctypes.c_void_p, i64p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int,
        qp, qp, qp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
    ]  # fmt: skip
    library.etkit_gridsampler_cpu_supports.restype = ctypes.c_int
    library.etkit_gridsampler_cpu_supports.argtypes = [ctypes.c_int]
    return library


def int64s(values: tuple[int, ...] | torch.Size) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    channels: int
    height: int
    width: int
    mode: str = "bilinear"
    padding: str = "border"
    align_corners: bool = False
    nchw: bool = False
    lookup: bool = False  # 9 x 9 samples per image around a point (a correlation lookup)
    int8_grid: bool = False
    float_output: bool = False
    output: CQParams = SNORM8


WORKLOADS = [
    Workload("1080p RGBA bilinear", 1, 4, 1080, 1920),
    Workload("1080p RGBA bilinear, zeros, int8 grid", 1, 4, 1080, 1920, "bilinear", "zeros",
             int8_grid=True),
    Workload("1080p RGBA bilinear, float out", 1, 4, 1080, 1920, float_output=True),
    Workload("1080p RGBA bilinear, ratio 1/3", 1, 4, 1080, 1920, output=OUTPUT_3),
    Workload("1080p RGBA nearest", 1, 4, 1080, 1920, mode="nearest"),
    Workload("1080p RGB bilinear", 1, 3, 1080, 1920),
    Workload("1080p RGB nearest", 1, 3, 1080, 1920, mode="nearest"),
    Workload("1080p RGBA bilinear, NCHW", 1, 4, 1080, 1920, nchw=True),
    Workload("1080p RGBA nearest, NCHW", 1, 4, 1080, 1920, mode="nearest", nchw=True),
    Workload("1080p 1 channel bilinear, reflection", 1, 1, 1080, 1920, "bilinear", "reflection"),
    Workload("correlation lookup, 1 channel", 2852, 1, 46, 62, "bilinear", "zeros", True,
             lookup=True),
    Workload("correlation lookup, nearest", 2852, 1, 46, 62, "nearest", "zeros", True,
             lookup=True),
    Workload("540p 2 channels bilinear", 1, 2, 540, 960),
    Workload("540p 2 channels nearest", 1, 2, 540, 960, mode="nearest"),
    Workload("540p 5 channels bilinear", 1, 5, 540, 960),
    Workload("540p 8 channels bilinear", 1, 8, 540, 960),
    Workload("540p 8 channels nearest", 1, 8, 540, 960, mode="nearest"),
    Workload("540p 16 channels bilinear", 1, 16, 540, 960),
    Workload("540p 16 channels nearest", 1, 16, 540, 960, mode="nearest"),
]  # fmt: skip


def inputs(w: Workload) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(
        -127, 128, (w.batch, w.channels, w.height, w.width), dtype=torch.int8, generator=generator
    )
    if not w.nchw and w.channels > 1:
        image = image.contiguous(memory_format=torch.channels_last)
    if w.lookup:
        grid = lookup_grid(w.batch, w.height, w.width, generator)
    else:
        grid = smooth_flow_grid(w.height, w.width).expand(w.batch, -1, -1, -1)
    if w.padding == "reflection":
        grid = grid * 1.3
    limit = 127 if w.int8_grid else 32767
    grid = torch.clamp(torch.round(grid * limit), -limit, limit)
    grid = grid.to(torch.int8 if w.int8_grid else torch.int16).contiguous()
    output = torch.empty(
        (w.batch, w.channels, grid.shape[1], grid.shape[2]),
        dtype=torch.float32 if w.float_output else torch.int8,
        memory_format=torch.channels_last if image.stride()[1] == 1 and w.channels > 1
        else torch.contiguous_format,
    )  # fmt: skip
    return image, grid, output


def caller(library: ctypes.CDLL, w: Workload, isa: str) -> tuple[Callable[[], None], torch.Tensor]:
    image, grid, output = inputs(w)
    grid_q = SNORM8_GRID if w.int8_grid else SNORM16
    args = (
        image.data_ptr(), int64s(image.shape), int64s(image.stride()),
        grid.data_ptr(), int(w.int8_grid), int64s(grid.shape), int64s(grid.stride()),
        output.data_ptr(), int64s(output.stride()),
        MODES[w.mode], PADDINGS[w.padding], int(w.align_corners),
        ctypes.byref(SNORM8), ctypes.byref(grid_q),
        None if w.float_output else ctypes.byref(w.output),
        1, ISAS[isa],
    )  # fmt: skip
    error = ctypes.c_char_p()
    error_ref = ctypes.byref(error)

    def run() -> None:
        status = library.etkit_gridsampler_grid_sample_q(*args, error_ref)
        if status != 0:
            raise RuntimeError(f"{w.name}: {error.value!r}")

    run.inputs = (image, grid)  # type: ignore[attr-defined]  (kept alive with the call)
    return run, output


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument(
        "--layout-control",
        type=Path,
        help="a second build of the --old sources whose functions lie at other addresses (for "
        "example with one more source file listed first): its distance from --old is the noise "
        "of code placement, which any rebuild moves",
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--case", action="append", help="run only cases whose name contains this")
    parser.add_argument("--isa", action="append", help="only these instruction sets")
    parser.add_argument(
        "--executorch-lib",
        type=Path,
        help="load this libexecutorch.so (which both link to) in place of importing "
        "executorch.runtime: for a quiet machine without the executorch wheel",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.executorch_lib:
        ctypes.CDLL(str(args.executorch_lib), mode=os.RTLD_GLOBAL)
    else:
        import executorch.runtime  # noqa: F401  (loads libexecutorch.so, which both link to)

    with tempfile.TemporaryDirectory() as folder:
        control_path = Path(folder) / "control.so"
        shutil.copyfile(args.old, control_path)
        libraries = {"old": load(args.old), "new": load(args.new), "control": load(control_path)}
        if args.layout_control:
            libraries["layout"] = load(args.layout_control)
        old = libraries["old"]
        isas = [
            isa
            for isa in ("scalar", "avx2", "avx512", "neon")
            if old.etkit_gridsampler_cpu_supports(ISAS[isa]) and (not args.isa or isa in args.isa)
        ]
        print(
            f"{'case':44} {'isa':7} {'old ms':>8} {'new ms':>8} {'new/old':>8} {'noise':>6} "
            f"{'min new/old':>11} {'min noise':>9}"
            + (" layout noise" if args.layout_control else "")
        )
        for w in WORKLOADS:
            if args.case and not any(part in w.name for part in args.case):
                continue
            for isa in isas:
                if isa == "scalar" and not w.lookup and w.height > 600:
                    continue  # the scalar kernel is no vector case: one small figure suffices
                runs, outputs = {}, {}
                for name, library in libraries.items():
                    runs[name], outputs[name] = caller(library, w, isa)
                for run in runs.values():  # warm-up
                    run()
                    run()
                old_bytes, new_bytes = (
                    outputs[name].contiguous().flatten().view(torch.uint8)
                    for name in ("old", "new")
                )
                if not torch.equal(old_bytes, new_bytes):
                    raise SystemExit(f"{w.name}, {isa}: the two builds' outputs differ")
                times: dict[str, list[float]] = {name: [] for name in runs}
                order = list(runs)
                for round_index in range(args.repeats):
                    for name in order if round_index % 2 == 0 else order[::-1]:
                        start = time.perf_counter()
                        runs[name]()
                        times[name].append(time.perf_counter() - start)
                median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                best = {name: min(t) for name, t in times.items()}
                ratio = median["new"] / median["old"]
                noise = abs(median["control"] / median["old"] - 1)
                best_ratio = best["new"] / best["old"]
                best_noise = abs(best["control"] / best["old"] - 1)
                layout = (
                    f" {abs(best['layout'] / best['old'] - 1):12.3f}" if "layout" in best else ""
                )
                print(
                    f"{w.name:44} {isa:7} {median['old']:8.2f} {median['new']:8.2f} "
                    f"{ratio:8.3f} {noise:6.3f} {best_ratio:11.3f} {best_noise:9.3f}{layout}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
