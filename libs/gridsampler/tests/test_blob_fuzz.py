"""A seeded, bounded fuzzer of the delegate blob: about 2,600 mutants of valid blobs of both
format versions (2: fixed shapes; 3: bounds of dynamic dimensions) (boundary values of every
field, pairs of them, bit flips, truncations, extensions, random bodies, random valid blobs), most
with the checksum recomputed so that the field rules, not the CRC, judge them.

The C++ side runs in a subprocess (this file run as a script), so that a crash or a hang fails the
test instead of killing pytest. It requires:
- Python's ``decode`` and C++'s ``parse_delegate_blob`` accept the same mutants and refuse the
  others with the same message, a message of docs/delegate_format.md's table;
- every accepted mutant is within the spec (checked here against the raw bytes, independently of
  both readers) and is its own canonical encoding;
- the runtime's ``init`` (a ``.pte`` carrying the mutant) accepts exactly the valid blobs whose
  configuration is inside the contract (``plan.unsupported_reason``), and ``execute`` runs exactly
  those whose roles, dtypes and shapes fit the program's tensors, computing what ``cpu.grid_sample``
  computes for the blob's op. Version-2 mutants run in a program of fixed shapes, version-3
  mutants in the same program exported with dynamic dimensions (its blob is version 3, its
  memory planned at the bounds), called with the same tensors.
"""

from __future__ import annotations

import json
import math
import random
import re
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SEED = 20240916
BLOB_SIZE = 124
CRC_OFFSET = 120
DYNAMIC_BLOB_SIZE = 160  # version 3
WORKER_TIMEOUT_S = 180

# The program the init/execute half runs: int16 grid first, int8 image second (the tensors are
# fixed; the mutant blobs say what they expect).
GRID_SHAPE = (1, 5, 7, 2)
IMAGE_SHAPE = (1, 3, 6, 9)
OUTPUT_SHAPE = (1, 3, 5, 7)


def _program_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    grid_q = torch.randint(-34000, 34000, GRID_SHAPE, generator=generator)
    image_q = torch.randint(-128, 128, IMAGE_SHAPE, generator=generator, dtype=torch.int8)
    return grid_q.clamp(-32768, 32767).to(torch.int16), image_q


# ---------------------------------------------------------------------------------------------
# The C++ side: this file run as a script.


def _worker(mutants_path: str, pte_path: str, dynamic_pte_path: str, results_path: str) -> None:
    import ctypes

    from executorch.runtime import Runtime

    from etkit_gridsampler import runtime
    from etkit_gridsampler._library import native_library

    library = native_library()
    runtime.register()
    # The program of each blob size: its bytes and where its blob starts.
    ptes = {
        size: (data, data.find(b"ETGS"))
        for size, data in (
            (BLOB_SIZE, Path(pte_path).read_bytes()),
            (DYNAMIC_BLOB_SIZE, Path(dynamic_pte_path).read_bytes()),
        )
    }
    inputs = list(_program_inputs())
    data = Path(mutants_path).read_bytes()
    offset = 0
    with Path(results_path).open("w") as results:
        index = 0
        while offset < len(data):
            (length, run_init) = struct.unpack_from("<IB", data, offset)
            blob = data[offset + 5 : offset + 5 + length]
            offset += 5 + length
            error = ctypes.c_char_p()
            status = library.etkit_gridsampler_validate_blob(blob, len(blob), ctypes.byref(error))
            result: dict[str, Any] = {
                "i": index,
                "native": None if status == 0 else (error.value or b"").decode(),
            }
            if run_init:
                pte, start = ptes[len(blob)]
                program = Runtime.get().load_program(pte[:start] + blob + pte[start + len(blob) :])
                try:
                    method = program.load_method("forward")
                except RuntimeError:
                    result["init"] = False
                else:
                    result["init"] = True
                    try:
                        (output,) = method.execute(inputs)
                    except RuntimeError:
                        result["execute"] = None
                    else:
                        result["execute"] = [str(output.dtype), output.flatten().tolist()]
            results.write(json.dumps(result) + "\n")
            results.flush()  # what was done before a crash stays readable
            index += 1


if __name__ == "__main__":
    _worker(*sys.argv[1:5])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# The test.

import pytest  # noqa: E402  (the worker above needs none of this)

from etkit_gridsampler import GridSampleOp, QParams, cpu  # noqa: E402
from etkit_gridsampler.delegate_format import (  # noqa: E402
    ArgumentRoles,
    DelegateFormatError,
    decode,
    encode,
)
from etkit_gridsampler.plan import unsupported_reason  # noqa: E402

F32_MAX = float(torch.finfo(torch.float32).max)
SMALLEST_SCALE = 1.0000001044244144e-12  # the first float32 at or above 1e-12
LARGEST_SCALE = 999999995904.0  # the last float32 at or below 1e12

IMAGE_Q = QParams(1 / 127, 0, -127, 127, torch.int8)
GRID_Q = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
OUTPUT_Q = QParams(1 / 100, 3, -128, 127, torch.int8)
PROGRAM_OP = GridSampleOp("bilinear", "border", False, IMAGE_Q, GRID_Q, OUTPUT_Q)
PROGRAM_ROLES = ArgumentRoles(inputs=2, image=1, grid=0)


def _f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


# The dynamic program's bounds: H from 3 (its Dim's min), everything else dynamic from 1 (the
# partitioner records torch's default min so).
DYNAMIC_IMAGE = ((1, 3, 3, 1), (1, 3, 12, 12))
DYNAMIC_GRID = ((1, 1, 1, 2), (1, 10, 10, 2))


def _dynamic_seeds() -> list[bytes]:
    """Valid version-3 blobs; the first is the dynamic program's own."""
    int8_grid = QParams(1 / 127, 0, -127, 127, torch.int8)
    return [
        encode(
            PROGRAM_OP,
            DYNAMIC_IMAGE[1],
            DYNAMIC_GRID[1],
            roles=PROGRAM_ROLES,
            image_min_shape=DYNAMIC_IMAGE[0],
            grid_min_shape=DYNAMIC_GRID[0],
        ),
        encode(  # N dynamic too, the image's C as well
            GridSampleOp("nearest", "zeros", True, IMAGE_Q, int8_grid, OUTPUT_Q),
            (4, 8, 30, 40),
            (4, 10, 12, 2),
            roles=ArgumentRoles(2, 0, 1),
            image_min_shape=(1, 2, 30, 2),
            grid_min_shape=(1, 10, 1, 2),
        ),
        encode(  # one tensor for both roles
            GridSampleOp(),
            (3, 7, 9, 2),
            (3, 7, 9, 2),
            roles=ArgumentRoles(1, 0, 0),
            image_min_shape=(1, 7, 2, 2),
            grid_min_shape=(1, 7, 2, 2),
        ),
        encode(  # the program's shapes, only the grid's Wo dynamic
            GridSampleOp("bilinear", "reflection", False, IMAGE_Q, GRID_Q, OUTPUT_Q),
            IMAGE_SHAPE,
            (1, 5, 8, 2),
            roles=PROGRAM_ROLES,
            grid_min_shape=(1, 5, 6, 2),
        ),
    ]


def _seeds() -> list[bytes]:
    """Valid version-2 blobs the mutants start from; the first is the program's own."""
    int8_grid = QParams(1 / 127, 0, -127, 127, torch.int8)
    return [
        encode(PROGRAM_OP, IMAGE_SHAPE, GRID_SHAPE, roles=PROGRAM_ROLES),
        # the grid arrives as float32, quantized on entry (a fused quantize)
        encode(PROGRAM_OP, IMAGE_SHAPE, GRID_SHAPE, roles=PROGRAM_ROLES, quantizes_grid=True),
        encode(
            GridSampleOp("nearest", "reflection", True, IMAGE_Q, GRID_Q, None),
            IMAGE_SHAPE,
            GRID_SHAPE,
            roles=PROGRAM_ROLES,
        ),
        encode(GridSampleOp(), (2, 4, 30, 40), (2, 10, 12, 2), roles=ArgumentRoles(2, 0, 1)),
        encode(GridSampleOp(), (1, 5, 7, 2), (1, 5, 7, 2), roles=ArgumentRoles(1, 0, 0)),
        encode(
            GridSampleOp(
                "bilinear",
                "zeros",
                True,
                QParams(0.02, -3, -128, 127, torch.int8),
                int8_grid,
                QParams(0.03, 5, -128, 127, torch.int8),
            ),
            (3, 2, 4, 4),
            (3, 2, 2, 2),
            roles=ArgumentRoles(2, 0, 1),
        ),
    ]


INT32_BOUNDS = [
    -(2**31), -70000, -32769, -32768, -32767, -129, -128, -127, -1, 0, 1, 3,
    126, 127, 128, 200, 255, 256, 32767, 32768, 70000, 2**31 - 1,
]  # fmt: skip
SCALE_BOUNDS = [
    0.0, -0.0, -_f32(1 / 127), 5e-324, 1e-300, 1e-13, 1e-12, SMALLEST_SCALE,
    float(torch.nextafter(torch.tensor(SMALLEST_SCALE, dtype=torch.float32),
                          torch.tensor(0.0, dtype=torch.float32))),
    _f32(1 / 127), _f32(1 / 32767), 0.1, 1.0, 32.0, 1e6, LARGEST_SCALE,
    float(torch.nextafter(torch.tensor(LARGEST_SCALE, dtype=torch.float32),
                          torch.tensor(math.inf, dtype=torch.float32))),
    1e12, 1e300, sys.float_info.max, F32_MAX, math.inf, -math.inf, math.nan,
]  # fmt: skip
DIMENSION_BOUNDS = [-(2**31), -1, 0, 1, 2, 3, 65536, 2**24, 2**24 + 1, 2**31 - 1]


SHAPE_PAIRS = [
    ((1, 65536, 256, 1), (1, 256, 256, 2)),  # each fits, the output does not
    ((1, 1, 1, 1), (1, 46341, 46341, 2)),  # the grid does not fit
    ((1, 4, 4, 2), (1, 4, 4, 2)),  # image and grid could be one tensor
    ((2, 4, 4, 2), (2, 4, 4, 2)),
    ((1, 1, 1, 1), (1, 1, 1, 2)),  # the smallest
]


def _dynamic_fields() -> list[tuple[int, str, list[Any]]]:
    """(offset, struct format, boundary values) of every field only version 3 has."""
    fields: list[tuple[int, str, list[Any]]] = [
        (120, "<B", [0, 1, 2, 0x0C, 0x0D, 0x10, 0x60, 0x6C, 0x6F, 0x7F, 0x80, 0x8C, 0xFF]),
        (121, "<B", [0, 1, 255]),
        (122, "<H", [0, 1, 0xFFFF]),
    ]
    for lower in (124, 140):
        fields += [
            (lower + 4 * i, "<i", [*DIMENSION_BOUNDS, 4, 9, 10, 11, 12, 13]) for i in range(4)
        ]
    return fields


def _fields() -> list[tuple[int, str, list[Any]]]:
    """(offset, struct format, boundary values) of every field both versions have."""
    fields: list[tuple[int, str, list[Any]]] = [
        (4, "<H", [0, 1, 2, 3, 0xFFFF]),
        (6, "<H", [0, 120, 123, 124, 125, 0xFFFF]),
        (8, "<B", [0, 1, 2, 255]),
        (9, "<B", [0, 1, 2, 3, 255]),
        (10, "<B", [0, 1, 2, 255]),
        (11, "<B", [0, 1, 255]),
        (12, "<B", [0, 1, 2, 3, 255]),
        (13, "<B", [0, 1, 2, 255]),
        (14, "<B", [0, 1, 2, 255]),
        (15, "<B", [0, 1, 255]),
    ]
    for record in (16, 40, 64):
        fields += [
            (record, "<B", [0, 1, 2, 255]),
            (record + 1, "<B", [0, 1, 2, 3, 255]),
            (record + 2, "<H", [0, 1, 0xFFFF]),
            (record + 4, "<i", INT32_BOUNDS),
            (record + 8, "<i", INT32_BOUNDS),
            (record + 12, "<i", INT32_BOUNDS),
            (record + 16, "<d", SCALE_BOUNDS),
        ]
    for shape in (88, 104):
        fields += [(shape + 4 * i, "<i", DIMENSION_BOUNDS) for i in range(4)]
    return fields


def _with_crc(blob: bytearray) -> bytes:
    crc_offset = len(blob) - 4  # 120 (version 2) or 156 (version 3)
    struct.pack_into("<I", blob, crc_offset, zlib.crc32(bytes(blob[:crc_offset])))
    return bytes(blob)


def _random_valid(rng: random.Random, dynamic: bool = False) -> bytes:
    """A valid blob of the program's shapes (``dynamic``: random bounds around them, a version-3
    blob) and roles with random quantization."""

    def qparams(dtype: torch.dtype, low: int, high: int, scale: float) -> QParams:
        a, b = sorted((rng.randint(low, high), rng.randint(low, high)))
        return QParams(scale, rng.randint(a, b), a, b, dtype)

    image = qparams(torch.int8, -128, 127, rng.uniform(1e-3, 0.05))
    grid = qparams(torch.int16, -32768, 32767, rng.uniform(1e-6, 1e-4))
    output = qparams(torch.int8, -128, 127, rng.uniform(1e-3, 0.05))
    op = GridSampleOp(
        rng.choice(["bilinear", "nearest"]),
        rng.choice(["zeros", "border", "reflection"]),
        rng.random() < 0.5,
        image,
        grid,
        output,
    )
    if not dynamic:
        return encode(op, IMAGE_SHAPE, GRID_SHAPE, roles=PROGRAM_ROLES)
    # Random bounds around the program's sizes: mostly containing them, sometimes not.
    image_lower, image_upper, grid_lower, grid_upper = [], [], [], []
    for size, lowers, uppers in (
        *((s, image_lower, image_upper) for s in IMAGE_SHAPE),
        *((s, grid_lower, grid_upper) for s in GRID_SHAPE[:3]),
    ):
        if rng.random() < 0.5:
            lowers.append(size)
            uppers.append(size)
        else:
            lowers.append(max(1, size - rng.randint(0, 4) + (rng.random() < 0.1) * 5))
            uppers.append(size + rng.randint(1, 6) - (rng.random() < 0.1) * 5)
            uppers[-1] = max(uppers[-1], lowers[-1] + 1)
    image_lower[0] = grid_lower[0] = min(image_lower[0], grid_lower[0])  # rule 33: one N
    image_upper[0] = grid_upper[0] = max(image_upper[0], grid_upper[0], image_lower[0] + 1)
    grid_lower.append(2)
    grid_upper.append(2)
    return encode(
        op,
        tuple(image_upper),
        tuple(grid_upper),
        roles=PROGRAM_ROLES,
        image_min_shape=tuple(image_lower),
        grid_min_shape=tuple(grid_lower),
    )


def _mutants() -> list[bytes]:
    rng = random.Random(SEED)
    seeds = _seeds() + _dynamic_seeds()
    dynamic_seeds = _dynamic_seeds()
    fields = _fields()
    mutants: list[bytes] = list(seeds)

    def set_field(blob: bytes, offset: int, fmt: str, value: Any) -> bytearray:
        data = bytearray(blob)
        struct.pack_into(fmt, data, offset, value)
        return data

    # Every boundary value of every field, on the seeds in turn.
    count = 0
    for offset, fmt, values in fields:
        for value in values:
            mutants.append(_with_crc(set_field(seeds[count % len(seeds)], offset, fmt, value)))
            count += 1
    # The same for the fields of version 3, on its seeds.
    count = 0
    for offset, fmt, values in _dynamic_fields():
        for value in values:
            target = dynamic_seeds[count % len(dynamic_seeds)]
            mutants.append(_with_crc(set_field(target, offset, fmt, value)))
            count += 1
    # Records made absent or taken from another seed, and shapes that are valid one by one but
    # not together: the rules between fields (18, 19, 26, 27; 33, 34); every seed's grid arriving
    # as float32 (35: not a float grid, nor one tensor for both roles).
    for target in seeds:
        mutants.append(_with_crc(set_field(target, 15, "<B", 1)))
        for record in (16, 40, 64):
            mutants.append(_with_crc(set_field(target, record, "<24s", bytes(24))))
            for donor in seeds:
                if donor != target:
                    data = bytearray(target)
                    data[record : record + 24] = donor[record : record + 24]
                    mutants.append(_with_crc(data))
        for image_shape, grid_shape in SHAPE_PAIRS:
            data = bytearray(target)
            struct.pack_into("<4i4i", data, 88, *image_shape, *grid_shape)
            mutants.append(_with_crc(data))
    # Lower bounds taken from another version-3 seed (rules 31 to 34 between fields).
    for target in dynamic_seeds:
        for donor in dynamic_seeds:
            if donor != target:
                for offset in (120, 124, 140):
                    data = bytearray(target)
                    data[offset : offset + 16] = donor[offset : offset + 16]
                    mutants.append(_with_crc(data))
    # The N of the seed whose N is dynamic: each of image and grid given other valid bounds.
    for offset, lower in ((124, 2), (124, 3), (140, 2), (140, 3)):
        mutants.append(_with_crc(set_field(dynamic_seeds[1], offset, "<i", lower)))
    # Pairs of boundary values, where the rules interact (a range and its zero point, ...).
    all_fields = fields + _dynamic_fields()
    for _ in range(600):
        data = bytearray(rng.choice(seeds))
        for offset, fmt, values in rng.sample(fields if len(data) == BLOB_SIZE else all_fields, 2):
            struct.pack_into(fmt, data, offset, rng.choice(values))
        mutants.append(_with_crc(data))
    # Bit flips; one in ten keeps the old checksum.
    for _ in range(500):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            bit = rng.randrange((len(data) - 4) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
        mutants.append(bytes(data) if rng.random() < 0.1 else _with_crc(data))
    # Truncations (every length up to the header and beyond) and extensions.
    for length in list(range(16)) + [rng.randrange(16, BLOB_SIZE) for _ in range(60)]:
        mutants.append(rng.choice(seeds)[:length])
    for _ in range(30):
        mutants.append(rng.choice(dynamic_seeds)[: rng.randrange(BLOB_SIZE, DYNAMIC_BLOB_SIZE)])
    for _ in range(60):
        extra = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        data = bytearray(rng.choice(seeds) + extra)
        if rng.random() < 0.5:
            struct.pack_into("<H", data, 6, len(data))  # a size field that agrees
        mutants.append(bytes(data))
    # Random bodies behind a valid header.
    for _ in range(150):
        seed = rng.choice(seeds)
        data = bytearray(rng.randbytes(len(seed)))
        data[:8] = seed[:8]
        mutants.append(_with_crc(data))
    # Random valid blobs: the readers must accept them, the runtime run them.
    for _ in range(120):
        mutants.append(_random_valid(rng))
    for _ in range(150):
        mutants.append(_random_valid(rng, dynamic=True))
    return mutants


# The messages of docs/delegate_format.md's table, as patterns; a refusal that matches none is an
# undocumented message.
_RECORD = r"(image|grid|output) quantization record: "
_SHAPE = r"\[-?\d+, -?\d+, -?\d+, -?\d+\]"
RULE_PATTERNS: dict[str, str] = {
    "1": r"truncated: \d+ bytes, shorter than the 8-byte header",
    "2": r"bad magic: not an etkit grid-sampler blob",
    "3": r"format version \d+ is newer than this reader's 3: update etkit-gridsampler",
    "4": r"format version [01] is no longer read \(it did not record which argument is the "
    r"image\): export the program again with this etkit-gridsampler",
    "5": r"size field \d+, expected (124 for format version 2|160 for format version 3)",
    "6": r"truncated: \d+ bytes, expected (124|160)"
    r"|\d+ bytes, expected (124|160) \(extra bytes after the blob\)",
    "7": r"checksum mismatch: the blob is corrupt",
    "8": r"mode code \d+, must be 0 \(bilinear\) or 1 \(nearest\)",
    "9": r"padding code \d+, must be 0 \(zeros\), 1 \(border\) or 2 \(reflection\)",
    "10": r"align_corners \d+, must be 0 or 1",
    "11": r"reserved byte 11 is \d+, must be 0",
    "12": r"input count \d+, must be 1 \(image and grid are one tensor\) or 2",
    "13": r"image argument index \d+, must be below the input count [12]",
    "14": r"grid argument index \d+, must be below the input count [12]",
    "15": r"image and grid argument indices are both [01]; with 2 inputs they must differ",
    "16": r"grid arrival code \d+, must be 0 \(as its record says\) or 1 \(float32, quantized on "
    r"entry\)",
    "17a": _RECORD + r"present flag \d+, must be 0 \(float32\) or 1 \(quantized\)",
    "17b": _RECORD + r"absent \(float32\) but not all zero",
    "17c": _RECORD + r"dtype code \d+, must be 1 \(int8\)( or 2 \(int16\))?",
    "17d": _RECORD + r"reserved bytes are not zero",
    "17e": _RECORD + r"quant_min -?\d+ outside int(8|16)'s range \[-?\d+, \d+\]",
    "17f": _RECORD + r"quant_max -?\d+ outside int(8|16)'s range \[-?\d+, \d+\]",
    "17g": _RECORD + r"quant_min -?\d+ greater than quant_max -?\d+",
    "17h": _RECORD + r"zero point -?\d+ outside \[quant_min, quant_max\] = \[-?\d+, -?\d+\]",
    "17i": _RECORD + r"scale is not finite",
    "17j": _RECORD + r"scale \S+ outside \[1e-12, 1e\+12\]",
    "17k": _RECORD + r"scale \S+ is not a float32 value",
    "18": r"image and grid must both be quantized or both float32",
    "19": r"a quantized output needs a quantized image and grid",
    "20": r"image shape " + _SHAPE + r": every dimension must be in \[1, 16777216\]",
    "21": r"image shape " + _SHAPE + r": more than 2147483647 elements",
    "22": r"grid shape " + _SHAPE + r": every dimension must be in \[1, 16777216\]",
    "23": r"grid shape " + _SHAPE + r": last dimension must be 2",
    "24": r"grid shape " + _SHAPE + r": more than 2147483647 elements",
    "25": r"grid N -?\d+ differs from the image's N -?\d+",
    "26": r"output shape " + _SHAPE + r": more than 2147483647 elements",
    "27": r"image and grid are one tensor \(input count 1\) but the blob gives them different "
    r"dtypes or shapes",
    "28": r"dynamic dimension flags 0x[89a-f][0-9a-f]: bit 7 must be 0 \(the grid's last "
    r"dimension is always 2\)",
    "29": r"reserved bytes 121 to 123 are not zero",
    "30": r"format version 3 with no dynamic dimension: fixed shapes are written as format "
    r"version 2",
    "31": r"image (N|C|H|W) is (fixed at -?\d+ but its lower bound is -?\d+|dynamic with bounds "
    r"\[-?\d+, -?\d+\]: the lower bound must be at least 1 and below the upper bound)",
    "32": r"grid (N|Ho|Wo|last dimension) is (fixed at -?\d+ but its lower bound is -?\d+|dynamic "
    r"with bounds \[-?\d+, -?\d+\]: the lower bound must be at least 1 and below the upper bound)",
    "33": r"grid N bounds \[-?\d+, -?\d+\] differ from the image's N bounds \[-?\d+, -?\d+\]",
    "34": r"image and grid are one tensor \(input count 1\) but the blob gives them different "
    r"bounds",
    "35": r"a grid that arrives as float32 to be quantized \(grid arrival code 1\) needs a "
    r"quantized grid record and an input of its own \(input count 2\)",
}


def _rule_of(message: str) -> str | None:
    text = message.removeprefix("grid-sampler delegate blob: ")
    for rule, pattern in RULE_PATTERNS.items():
        if re.fullmatch(pattern, text):
            return rule
    return None


_DTYPE_RANGES = {1: (-128, 127), 2: (-32768, 32767)}
_ROLE_DTYPES = {16: (1,), 40: (1, 2), 64: (1,)}


def _assert_within_spec(blob: bytes) -> None:
    """The rules of docs/delegate_format.md, restated on the raw bytes."""
    assert len(blob) in (BLOB_SIZE, DYNAMIC_BLOB_SIZE)
    magic, version, size = struct.unpack_from("<4sHH", blob)
    assert (magic, version, size) == (b"ETGS", 2 if len(blob) == BLOB_SIZE else 3, len(blob))
    crc_offset = len(blob) - 4
    assert struct.unpack_from("<I", blob, crc_offset)[0] == zlib.crc32(blob[:crc_offset])
    mode, padding, align, reserved11, inputs, image, grid, arrival = blob[8:16]
    assert mode <= 1 and padding <= 2 and align <= 1 and reserved11 == 0 and arrival <= 1
    assert inputs in (1, 2) and image < inputs and grid < inputs
    assert inputs == 1 or image != grid
    tensor_dtypes = {}
    for offset, allowed in _ROLE_DTYPES.items():
        present, dtype, reserved, zero_point, low, high, scale = struct.unpack_from(
            "<BBHiiid", blob, offset
        )
        assert present in (0, 1)
        if present == 0:
            assert blob[offset : offset + 24] == bytes(24)
            tensor_dtypes[offset] = 0
            continue
        assert dtype in allowed and reserved == 0
        dtype_low, dtype_high = _DTYPE_RANGES[dtype]
        assert dtype_low <= low <= zero_point <= high <= dtype_high
        assert math.isfinite(scale) and 1e-12 <= scale <= 1e12
        assert struct.unpack("<f", struct.pack("<f", scale))[0] == scale
        tensor_dtypes[offset] = dtype
    assert (tensor_dtypes[16] == 0) == (tensor_dtypes[40] == 0)
    assert tensor_dtypes[64] == 0 or tensor_dtypes[16] != 0
    image_shape = struct.unpack_from("<4i", blob, 88)
    grid_shape = struct.unpack_from("<4i", blob, 104)
    assert all(1 <= d <= 2**24 for d in (*image_shape, *grid_shape))
    assert grid_shape[3] == 2 and grid_shape[0] == image_shape[0]
    output_shape = (*image_shape[:2], *grid_shape[1:3])
    for shape in (image_shape, grid_shape, output_shape):
        assert math.prod(shape) <= 2**31 - 1
    if inputs == 1:
        assert tensor_dtypes[16] == tensor_dtypes[40] and image_shape == grid_shape
    if version == 3:
        _assert_bounds_within_spec(blob, inputs, image_shape, grid_shape)
    if arrival == 1:
        assert tensor_dtypes[40] != 0 and inputs == 2


def _assert_bounds_within_spec(
    blob: bytes, inputs: int, image_shape: tuple[int, ...], grid_shape: tuple[int, ...]
) -> None:
    flags = blob[120]
    assert flags != 0 and not flags & 0x80 and blob[121:124] == bytes(3)
    image_lower, grid_lower = _lower_bounds(blob)
    for i, (lower, upper) in enumerate(zip(image_lower, image_shape, strict=True)):
        assert (1 <= lower < upper) if flags >> i & 1 else lower == upper
    for i, (lower, upper) in enumerate(zip(grid_lower, grid_shape, strict=True)):
        assert (1 <= lower < upper) if i < 3 and flags >> (4 + i) & 1 else lower == upper
    assert grid_lower[0] == image_lower[0]
    if inputs == 1:
        assert image_lower == grid_lower


def _lower_bounds(blob: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The lower bounds of a version-3 blob, read from its bytes; a version-2 blob's shapes."""
    if len(blob) == BLOB_SIZE:
        return _shapes(blob)
    return struct.unpack_from("<4i", blob, 124), struct.unpack_from("<4i", blob, 140)


@dataclass(frozen=True)
class _Expected:
    message: str | None  # Python's refusal, None when it accepts
    init: bool | None  # None: not run through a program
    execute: bool | None


def _torch_dtype(qparams: QParams | None) -> torch.dtype:
    return torch.float32 if qparams is None else qparams.dtype


def _expected(blob: bytes, run_init: bool) -> tuple[_Expected, GridSampleOp | None]:
    try:
        decoded = decode(blob)
    except DelegateFormatError as error:
        return _Expected(str(error), False if run_init else None, None), None
    if not run_init:
        return _Expected(None, None, None), decoded.op
    op = decoded.op
    height, width = decoded.image_shape[2], decoded.image_shape[3]
    init = op.is_float or unsupported_reason(op, height, width) is None
    # Both programs pass (grid int16 GRID_SHAPE, image int8 IMAGE_SHAPE) and have an int8
    # output (OUTPUT_SHAPE; the dynamic program's planned at its bounds, resized to it).
    arguments = [(torch.int16, GRID_SHAPE), (torch.int8, IMAGE_SHAPE)]
    roles = decoded.roles

    def fits(
        argument: tuple[torch.dtype, tuple[int, ...]], dtype: torch.dtype, bounds: Any
    ) -> bool:
        return argument[0] == dtype and all(
            lo <= s <= hi for s, (lo, hi) in zip(argument[1], bounds, strict=True)
        )

    execute = (
        init
        and roles.inputs == 2
        and fits(arguments[roles.image], _torch_dtype(op.image), decoded.image_bounds())
        and fits(arguments[roles.grid], decoded.grid_arrival_dtype, decoded.grid_bounds())
        and arguments[roles.image][1][0] == arguments[roles.grid][1][0]
        and _torch_dtype(op.output) == torch.int8
    )
    return _Expected(None, init, execute if init else None), op


def _build_program(path: Path, dynamic: bool = False) -> None:
    """The program the worker runs the mutants in: an int16 grid and an int8 image in, the grid
    first, one grid-sampler delegate; ``dynamic``: exported with dynamic H and W of the image
    and Ho and Wo of the grid (``DYNAMIC_IMAGE``, ``DYNAMIC_GRID``; a version-3 blob)."""
    import torch.nn.functional as F
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import Dim

    from etkit_gridsampler import GridSamplerPartitioner

    def dq(q: torch.Tensor, p: QParams) -> torch.Tensor:
        result: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(
            q, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
        )
        return result

    class GridFirst(torch.nn.Module):
        def forward(self, grid_q: torch.Tensor, image_q: torch.Tensor) -> torch.Tensor:
            grid = dq(grid_q, GRID_Q)
            image = dq(image_q, IMAGE_Q)
            out = F.grid_sample(image, grid, padding_mode="border", align_corners=False)
            p = OUTPUT_Q
            result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(
                out, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
            )
            return result

    dynamic_shapes = (
        (
            {1: Dim("ho", max=10), 2: Dim("wo", max=10)},
            {2: Dim("h", min=3, max=12), 3: Dim("w", max=12)},
        )
        if dynamic
        else None
    )
    program = to_edge_transform_and_lower(
        torch.export.export(
            GridFirst(), _program_inputs(), dynamic_shapes=dynamic_shapes, strict=True
        ),
        partitioner=[GridSamplerPartitioner()],
    )
    path.write_bytes(program.to_executorch().buffer)


def test_blob_fuzz_python_and_cpp_agree(tmp_path: Path) -> None:
    pte, dynamic_pte = tmp_path / "program.pte", tmp_path / "dynamic.pte"
    _build_program(pte)
    _build_program(dynamic_pte, dynamic=True)
    # the worker swaps mutants in for these blobs
    program = pte.read_bytes()
    assert program[program.find(b"ETGS") :][:BLOB_SIZE] == _seeds()[0]
    program = dynamic_pte.read_bytes()
    assert program[program.find(b"ETGS") :][:DYNAMIC_BLOB_SIZE] == _dynamic_seeds()[0]

    mutants = _mutants()
    assert 2000 <= len(mutants) <= 3200
    rng = random.Random(SEED + 1)
    expected: list[_Expected] = []
    ops: list[GridSampleOp | None] = []
    stream = bytearray()
    for blob in mutants:
        # Every valid full-size mutant runs through a program, and a sample of the refused ones
        # (init's refusal of those is the same parser).
        valid = True
        try:
            decode(blob)
        except DelegateFormatError:
            valid = False
        run_init = len(blob) in (BLOB_SIZE, DYNAMIC_BLOB_SIZE) and (valid or rng.random() < 0.05)
        want, op = _expected(blob, run_init)
        expected.append(want)
        ops.append(op)
        stream += struct.pack("<IB", len(blob), run_init) + blob
    mutants_path = tmp_path / "mutants.bin"
    mutants_path.write_bytes(bytes(stream))
    results_path, log_path = tmp_path / "results.jsonl", tmp_path / "worker.log"

    with log_path.open("w") as log:
        try:
            completed = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    *map(str, (mutants_path, pte, dynamic_pte, results_path)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=WORKER_TIMEOUT_S,
                check=False,
            )
            status: int | str = completed.returncode
        except subprocess.TimeoutExpired:
            status = f"no answer within {WORKER_TIMEOUT_S} s (a hang)"
    lines = results_path.read_text().splitlines() if results_path.exists() else []
    if status != 0 or len(lines) != len(mutants):
        index = len(lines)
        culprit = mutants[index].hex() if index < len(mutants) else "none"
        tail = log_path.read_text()[-2000:]
        pytest.fail(
            f"the C++ side stopped ({status}) after {index} of {len(mutants)} mutants; the next "
            f"mutant is {culprit}\n{tail}"
        )

    disagreements: list[str] = []
    undocumented: set[str] = set()
    rules_hit: set[str] = set()
    accepted = executed = 0
    executed_by_version = {2: 0, 3: 0}
    grid_q, image_q = _program_inputs()
    for index, (blob, line) in enumerate(zip(mutants, lines, strict=True)):
        result = json.loads(line)
        want, op = expected[index], ops[index]
        where = f"mutant {index} ({blob.hex()})"
        if result["native"] != want.message:
            disagreements.append(f"{where}: Python {want.message!r}, C++ {result['native']!r}")
            continue
        if want.message is None:
            accepted += 1
            _assert_within_spec(blob)
            assert op is not None
            image_lower, grid_lower = _lower_bounds(blob)
            again = encode(
                op,
                *_shapes(blob),
                roles=decode(blob).roles,
                image_min_shape=image_lower,
                grid_min_shape=grid_lower,
                quantizes_grid=decode(blob).quantizes_grid,
            )
            assert again == blob, where
        else:
            rule = _rule_of(want.message)
            if rule is None:
                undocumented.add(want.message)
            else:
                rules_hit.add(rule)
        if want.init is not None and result.get("init") != want.init:
            disagreements.append(f"{where}: init expected {want.init}, got {result.get('init')}")
            continue
        if want.init:
            ran = result.get("execute") is not None
            if ran != want.execute:
                disagreements.append(f"{where}: execute expected {want.execute}, ran: {ran}")
            elif ran:
                assert op is not None
                executed += 1
                executed_by_version[2 if len(blob) == BLOB_SIZE else 3] += 1
                dtype, values = result["execute"]
                reference = cpu.grid_sample(image_q, grid_q, op)
                if dtype != str(reference.dtype) or values != reference.flatten().tolist():
                    disagreements.append(f"{where}: the runtime's output differs from the CPU's")
    assert not disagreements, "\n".join(disagreements[:20])
    assert not undocumented, sorted(undocumented)[:20]
    # The mutants reach every rule, and enough of them are valid to exercise init and execute.
    all_rules = set(RULE_PATTERNS)
    assert rules_hit == all_rules, sorted(all_rules - rules_hit)
    assert accepted >= 300 and executed >= 200, (accepted, executed)
    assert min(executed_by_version.values()) >= 80, executed_by_version


def _shapes(blob: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return struct.unpack_from("<4i", blob, 88), struct.unpack_from("<4i", blob, 104)
