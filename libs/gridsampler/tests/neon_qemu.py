"""The integer kernel built for AArch64 and run under qemu-user: builds native/quantized_driver.cpp
with the library's quantized.cpp and quantized_neon.cpp by Debian's cross compiler, and speaks its
protocol (the driver's header comment). Used by test_neon_qemu.py and bench/neon_insn_count.py;
on pytest's pythonpath."""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from etkit_gridsampler import GridSampleOp, QParams
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES

TESTS = Path(__file__).resolve().parent


def _sources_root() -> Path:
    """The folder holding the library's csrc/ and CMakeLists.txt: the checkout these tests sit in,
    else the copy the installed package ships (etkit_gridsampler/_sources), so that the tests run
    against an installed wheel from a copied tests folder."""
    if (TESTS.parent / "CMakeLists.txt").is_file() and (TESTS.parent / "csrc").is_dir():
        return TESTS.parent
    spec = importlib.util.find_spec("etkit_gridsampler")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "_sources" / "CMakeLists.txt").is_file():
            return Path(location) / "_sources"
    raise FileNotFoundError(
        "the grid sampler's C++ sources: neither a checkout beside these tests nor an installed "
        "etkit_gridsampler with _sources/ (install the wheel that scripts/build-wheels.sh builds)"
    )


LIBRARY = _sources_root()
SOURCES = (
    TESTS / "native" / "quantized_driver.cpp",
    LIBRARY / "csrc" / "quantized.cpp",
    LIBRARY / "csrc" / "quantized_neon.cpp",
)
COMPILER = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
NM = "aarch64-linux-gnu-nm"  # binutils-aarch64-linux-gnu, which the compiler's package pulls in
# The Debian packages that provide them (scripts/setup.sh installs both).
PACKAGES = {COMPILER: "g++-aarch64-linux-gnu", QEMU: "qemu-user"}
ISA_CODES = {"auto": 0, "scalar": 1, "neon": 4}
# quantized_neon.h's NeonCounter, in order
COUNTERS = ("pixels", "integer", "nearest", "exact", "table", "edge")


class ToolchainMissingError(RuntimeError):
    """The AArch64 cross compiler or qemu-user is not installed."""


class DriverError(RuntimeError):
    """The driver failed to build, crashed, or refused a case."""


def missing_tools() -> list[str]:
    """The tools (of COMPILER and QEMU) that are not on PATH."""
    return [tool for tool in (COMPILER, QEMU) if shutil.which(tool) is None]


def build_driver(directory: Path, optimization: str = "-O2") -> Path:
    """Compiles the driver, statically linked for AArch64, into ``directory``; returns its path.
    Raises ToolchainMissingError naming the packages to install, DriverError with the compiler's
    messages."""
    missing = missing_tools()
    if missing:
        packages = " ".join(PACKAGES[tool] for tool in missing)
        raise ToolchainMissingError(
            f"{', '.join(missing)} not found: the NEON kernel is built for AArch64 and run under "
            f"qemu-user. Install them (Debian: apt-get install {packages}; scripts/setup.sh does)"
        )
    binary = directory / "quantized_driver"
    command = [
        COMPILER, "-std=c++17", optimization, "-Wall", "-Wextra", "-Werror", "-static",
        "-I", str(LIBRARY / "csrc"), *map(str, SOURCES), "-o", str(binary),
    ]  # fmt: skip
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise DriverError(f"{' '.join(command)} failed:\n{built.stderr}")
    return binary


def library_sources() -> list[Path]:
    """The C++ sources CMakeLists.txt builds the native library from."""
    cmake = (LIBRARY / "CMakeLists.txt").read_text()
    block = cmake[cmake.index("Python_add_library(_native") :]
    block = block[: block.index(")")]
    return [LIBRARY / name for name in re.findall(r"csrc/\S+\.cpp", block)]


def build_library(directory: Path) -> tuple[Path, dict[str, Path]]:
    """Compiles every source of the native library for AArch64 (-O0, against the executorch
    wheel's headers and this Python's) and links them into one shared object; returns it and the
    objects by source name. Raises as build_driver does."""
    missing = missing_tools()
    if missing:
        raise ToolchainMissingError(f"{', '.join(missing)} not found (see build_driver)")
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise DriverError("the executorch wheel is not installed: its headers are needed")
    executorch = Path(next(iter(spec.submodule_search_locations)))
    includes = [
        executorch / "include",
        executorch / "include" / "executorch" / "runtime" / "core" / "portable_type" / "c10",
        Path(sysconfig.get_paths()["include"]),
    ]
    objects: dict[str, Path] = {}
    for source in library_sources():
        objects[source.stem] = directory / f"{source.stem}.o"
        command = [
            COMPILER, "-std=c++17", "-O0", "-fPIC", "-Wall", "-Wextra", "-c",
            "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
            *(f"-isystem{include}" for include in includes), str(source),
            "-o", str(objects[source.stem]),
        ]  # fmt: skip
        built = subprocess.run(command, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise DriverError(f"{' '.join(command)} failed:\n{built.stderr}")
    library = directory / "_native_aarch64.so"
    command = [COMPILER, "-shared", *map(str, objects.values()), "-o", str(library)]
    linked = subprocess.run(command, capture_output=True, text=True, check=False)
    if linked.returncode != 0:
        raise DriverError(f"{' '.join(command)} failed:\n{linked.stderr}")
    return library, objects


def symbols(binary: Path, undefined: bool) -> list[str]:
    """The (demangled) symbols ``binary`` defines, or those it leaves undefined."""
    option = "--undefined-only" if undefined else "--defined-only"
    listed = subprocess.run(
        [NM, "-C", option, str(binary)], capture_output=True, text=True, check=True
    )
    # "address type name" (defined) or "type name" (undefined)
    entry = re.compile(r"^\s*(?:[0-9a-fA-F]+\s+)?[A-Za-z?]\s+(.*)$")
    return [m.group(1) for line in listed.stdout.splitlines() if (m := entry.match(line))]


@dataclass(frozen=True)
class Case:
    """One call of the kernel: ``image`` (int8) sampled at ``grid`` as ``op`` says, with the
    instruction set ``isa`` ("scalar", "neon" or "auto"), ``rows_per_call`` output rows per kernel
    call (0: all), into an output with ``output_strides`` (the layout cpu.grid_sample gives)."""

    image: torch.Tensor
    grid: torch.Tensor
    op: GridSampleOp
    output_strides: tuple[int, ...]
    isa: str = "neon"
    rows_per_call: int = 0


@dataclass(frozen=True)
class Result:
    """The driver's output (sizes and strides as the case asked) and the NEON counters the case
    added (COUNTERS; all 0 when the NEON kernel did not run)."""

    output: torch.Tensor
    counters: dict[str, int]


def _qparams(q: QParams | None) -> bytes:
    if q is None:
        return struct.pack("<diii", 1.0, 0, 0, 0)
    return struct.pack("<diii", q.scale, q.zero_point, q.quant_min, q.quant_max)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes from element 0 to the last element the tensor's strides reach."""
    reach = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    flat = tensor.as_strided((reach + 1,), (1,))
    return flat.contiguous().numpy().tobytes()


def _sizes_strides(sizes: Sequence[int], strides: Sequence[int]) -> bytes:
    return struct.pack("<4q", *sizes) + struct.pack("<4q", *strides)


def encode(cases: Sequence[Case]) -> bytes:
    """The driver's input for ``cases``: each distinct image and grid tensor once."""
    ids: dict[int, int] = {}
    chunks: list[bytes] = []

    def tensor_id(tensor: torch.Tensor) -> int:
        key = id(tensor)
        if key not in ids:
            ids[key] = len(ids)
            data = _tensor_bytes(tensor)
            chunks.append(b"T" + struct.pack("<IQ", ids[key], len(data)) + data)
        return ids[key]

    for case in cases:
        op = case.op
        if case.image.dtype != torch.int8 or case.grid.dtype not in (torch.int8, torch.int16):
            raise ValueError("the driver samples int8 images at int16 or int8 grids")
        if op.image is None or op.grid is None:
            raise ValueError(
                f"the driver runs the integer kernel: {op} has no image or grid QParams"
            )
        image, grid = tensor_id(case.image), tensor_id(case.grid)
        fields = (
            MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
            int(case.grid.dtype == torch.int8), int(op.output is None), ISA_CODES[case.isa],
            case.rows_per_call,
        )  # fmt: skip
        chunks.append(
            b"C"
            + struct.pack("<7i", *fields)
            + _qparams(op.image)
            + _qparams(op.grid)
            + _qparams(op.output)
            + struct.pack("<I", image)
            + _sizes_strides(case.image.shape, case.image.stride())
            + struct.pack("<I", grid)
            + _sizes_strides(case.grid.shape, case.grid.stride())
            + struct.pack("<4q", *case.output_strides)
        )
    return b"".join(chunks)


def decode(reply: bytes, cases: Sequence[Case]) -> list[Result]:
    """The driver's replies to ``cases``; DriverError for a refused case."""
    results: list[Result] = []
    at = 0

    def take(size: int) -> bytes:
        nonlocal at
        if at + size > len(reply):
            raise DriverError(f"the driver's reply ends early ({len(reply)} bytes)")
        chunk = reply[at : at + size]
        at += size
        return chunk

    for index, case in enumerate(cases):
        (status,) = struct.unpack("<i", take(4))
        if status != 0:
            (length,) = struct.unpack("<I", take(4))
            message = take(length).decode()
            raise DriverError(f"case {index} ({case.op}) refused: {message}")
        (size,) = struct.unpack("<Q", take(8))
        data = bytearray(take(size))
        dtype = torch.float32 if case.op.output is None else torch.int8
        flat = torch.frombuffer(data, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        sizes = (*case.image.shape[:2], *case.grid.shape[1:3])
        output = flat.as_strided(sizes, case.output_strides)
        (count,) = struct.unpack("<I", take(4))
        values = struct.unpack(f"<{count}Q", take(8 * count))
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(zip(COUNTERS, values, strict=False))
        results.append(Result(output, counters))
    if at != len(reply):
        raise DriverError(f"the driver's reply has {len(reply) - at} bytes past the last case")
    return results


def run(binary: Path, cases: Sequence[Case], qemu_options: Sequence[str] = ()) -> list[Result]:
    """Runs ``cases`` in one driver process under qemu-aarch64 (with ``qemu_options``)."""
    return decode(_run_driver(binary, encode(cases), qemu_options), cases)


def probe(binary: Path, tensor: torch.Tensor, past_end: int) -> int:
    """The byte ``past_end`` bytes past the last of ``tensor`` as the driver places it (1: on the
    unreadable page that follows it, which crashes the driver: DriverError)."""
    data = _tensor_bytes(tensor)
    message = (
        b"T" + struct.pack("<IQ", 0, len(data)) + data + b"R" + struct.pack("<Iq", 0, past_end)
    )
    reply = _run_driver(binary, message, ())
    status, value = struct.unpack("<ib", reply)
    assert status == 0
    return int(value)


def _run_driver(binary: Path, message: bytes, qemu_options: Sequence[str]) -> bytes:
    done = subprocess.run(
        [QEMU, *qemu_options, str(binary)], input=message, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise DriverError(
            f"the driver exited with status {done.returncode} (a negative status is a signal: "
            f"-11, SIGSEGV, a read outside the image): "
            f"{done.stderr.decode(errors='replace')[-2000:]}"
        )
    return done.stdout
