"""The grid-sampler delegate blob: what ``GridSamplerBackend.preprocess`` writes into a ``.pte``
and the C++ backend reads at ``init``.

docs/delegate_format.md is its one definition (layout, validity rules in order, messages);
``decode`` implements those rules as csrc/delegate_format.cpp does, message for message, and
``encode`` writes the canonical blob and checks it with ``decode``.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import Final

import torch

from etkit_gridsampler.op import (
    MODE_CODES,
    MODE_NAMES,
    PADDING_CODES,
    PADDING_NAMES,
    GridSampleOp,
    QParams,
)

MAGIC: Final = b"ETGS"
FORMAT_VERSION: Final = 2
BLOB_SIZE: Final = 124
CRC_OFFSET: Final = BLOB_SIZE - 4

MAX_DIMENSION: Final = 1 << 24
MAX_ELEMENTS: Final = (1 << 31) - 1
MIN_SCALE: Final = 1e-12
MAX_SCALE: Final = 1e12

IMAGE_RECORD_OFFSET: Final = 16
GRID_RECORD_OFFSET: Final = 40
OUTPUT_RECORD_OFFSET: Final = 64
IMAGE_SHAPE_OFFSET: Final = 88
GRID_SHAPE_OFFSET: Final = 104

_PREFIX: Final = "grid-sampler delegate blob: "
_HEADER = struct.Struct("<4sHHBBBBBBBB")  # 16 bytes: through the argument roles
_QPARAMS = struct.Struct("<BBHiiid")
_SHAPE = struct.Struct("<4i")
_DTYPE_CODES: Final[dict[torch.dtype, int]] = {torch.int8: 1, torch.int16: 2}
_CODE_DTYPES: Final = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_DTYPE_RANGES: Final[dict[int, tuple[str, int, int]]] = {
    1: ("int8", -128, 127),
    2: ("int16", -32768, 32767),
}
# Rule 17c: the dtype codes each role may have.
_ROLE_DTYPES: Final[dict[str, tuple[tuple[int, ...], str]]] = {
    "image": ((1,), "1 (int8)"),
    "grid": ((1, 2), "1 (int8) or 2 (int16)"),
    "output": ((1,), "1 (int8)"),
}


class DelegateFormatError(ValueError):
    """A blob that is not a valid grid-sampler delegate blob."""


@dataclass(frozen=True)
class ArgumentRoles:
    """Which runtime argument of the delegate is the image and which the grid: ``inputs`` is
    how many tensors the delegate receives (1 when one tensor is both), ``image`` and ``grid``
    index them."""

    inputs: int
    image: int
    grid: int


@dataclass(frozen=True)
class DelegateBlob:
    """The decoded content of a delegate blob."""

    op: GridSampleOp
    image_shape: tuple[int, int, int, int]
    grid_shape: tuple[int, int, int, int]
    roles: ArgumentRoles


def _pack_qparams(qparams: QParams | None) -> bytes:
    if qparams is None:
        return bytes(_QPARAMS.size)
    if qparams.dtype not in _DTYPE_CODES:
        raise DelegateFormatError(
            f"{_PREFIX}{qparams.dtype} has no dtype code; the blob holds int8 and int16"
        )
    return _QPARAMS.pack(
        1,
        _DTYPE_CODES[qparams.dtype],
        0,
        qparams.zero_point,
        qparams.quant_min,
        qparams.quant_max,
        qparams.scale,
    )


def encode(
    op: GridSampleOp,
    image_shape: tuple[int, ...] | torch.Size,
    grid_shape: tuple[int, ...] | torch.Size,
    *,
    roles: ArgumentRoles,
) -> bytes:
    """The blob for ``op`` on an image of ``image_shape`` and a grid of ``grid_shape``, which
    the delegate receives as the arguments ``roles`` names. Raises ``DelegateFormatError`` (a
    ``ValueError``) when the result would break a rule of docs/delegate_format.md."""
    if len(image_shape) != 4 or len(grid_shape) != 4 or grid_shape[3] != 2:
        raise DelegateFormatError(
            f"{_PREFIX}expected an N x C x H x W image and an N x Ho x Wo x 2 grid, got "
            f"{tuple(image_shape)} and {tuple(grid_shape)}"
        )
    for value in (*image_shape, *grid_shape):
        if not -(1 << 31) <= value < (1 << 31):
            raise DelegateFormatError(
                f"{_PREFIX}shapes {tuple(image_shape)} and {tuple(grid_shape)} do not fit int32"
            )
    for value in (roles.inputs, roles.image, roles.grid):
        if not 0 <= value <= 255:
            raise DelegateFormatError(f"{_PREFIX}argument roles {roles} do not fit a byte each")
    body = (
        _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            BLOB_SIZE,
            MODE_CODES[op.mode],
            PADDING_CODES[op.padding_mode],
            int(op.align_corners),
            0,
            roles.inputs,
            roles.image,
            roles.grid,
            0,
        )
        + _pack_qparams(op.image)
        + _pack_qparams(op.grid)
        + _pack_qparams(op.output)
        + _SHAPE.pack(*image_shape)
        + _SHAPE.pack(*grid_shape)
    )
    blob = body + struct.pack("<I", zlib.crc32(body))
    decode(blob)  # the writer holds itself to the reader's rules
    return blob


def _fail(message: str) -> DelegateFormatError:
    return DelegateFormatError(_PREFIX + message)


def _is_float32(value: float) -> bool:
    return float(struct.unpack("<f", struct.pack("<f", value))[0]) == value


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _elements_exceed(shape: tuple[int, ...]) -> bool:
    count = 1
    for dimension in shape:
        count *= dimension
    return count > MAX_ELEMENTS


def _check_record(data: bytes, offset: int, role: str) -> QParams | None:
    """Rules 17a to 17k."""
    what = f"{role} quantization record: "
    present, dtype, reserved, zero_point, quant_min, quant_max, scale = _QPARAMS.unpack_from(
        data, offset
    )
    if present > 1:
        raise _fail(f"{what}present flag {present}, must be 0 (float32) or 1 (quantized)")
    if present == 0:
        if any(data[offset + 1 : offset + _QPARAMS.size]):
            raise _fail(f"{what}absent (float32) but not all zero")
        return None
    allowed, allowed_text = _ROLE_DTYPES[role]
    if dtype not in allowed:
        raise _fail(f"{what}dtype code {dtype}, must be {allowed_text}")
    if reserved != 0:
        raise _fail(f"{what}reserved bytes are not zero")
    name, low, high = _DTYPE_RANGES[dtype]
    if not low <= quant_min <= high:
        raise _fail(f"{what}quant_min {quant_min} outside {name}'s range [{low}, {high}]")
    if not low <= quant_max <= high:
        raise _fail(f"{what}quant_max {quant_max} outside {name}'s range [{low}, {high}]")
    if quant_min > quant_max:
        raise _fail(f"{what}quant_min {quant_min} greater than quant_max {quant_max}")
    if not quant_min <= zero_point <= quant_max:
        raise _fail(
            f"{what}zero point {zero_point} outside [quant_min, quant_max] = "
            f"[{quant_min}, {quant_max}]"
        )
    if not math.isfinite(scale):
        raise _fail(f"{what}scale is not finite")
    if not MIN_SCALE <= scale <= MAX_SCALE:
        raise _fail(f"{what}scale {scale:g} outside [1e-12, 1e+12]")
    if not _is_float32(scale):
        raise _fail(f"{what}scale {scale:.17g} is not a float32 value")
    return QParams(scale, zero_point, quant_min, quant_max, _CODE_DTYPES[dtype])


def decode(data: bytes) -> DelegateBlob:
    """Reads a blob back, with the rules of docs/delegate_format.md in their order, as the C++
    runtime does. Raises ``DelegateFormatError`` with the message of the first rule broken."""
    data = bytes(data)
    length = len(data)
    if length < 8:  # rule 1
        raise _fail(f"truncated: {length} bytes, shorter than the 8-byte header")
    magic, version, size = struct.unpack_from("<4sHH", data)
    if magic != MAGIC:  # rule 2
        raise _fail("bad magic: not an etkit grid-sampler blob")
    if version > FORMAT_VERSION:  # rule 3
        raise _fail(
            f"format version {version} is newer than this reader's {FORMAT_VERSION}: "
            "update etkit-gridsampler"
        )
    if version < FORMAT_VERSION:  # rule 4
        raise _fail(
            f"format version {version} is no longer read (it did not record which argument is "
            "the image): export the program again with this etkit-gridsampler"
        )
    if size != BLOB_SIZE:  # rule 5
        raise _fail(f"size field {size}, expected {BLOB_SIZE} for format version 2")
    if length < BLOB_SIZE:  # rule 6
        raise _fail(f"truncated: {length} bytes, expected {BLOB_SIZE}")
    if length > BLOB_SIZE:
        raise _fail(f"{length} bytes, expected {BLOB_SIZE} (extra bytes after the blob)")
    (crc,) = struct.unpack_from("<I", data, CRC_OFFSET)
    if zlib.crc32(data[:CRC_OFFSET]) != crc:  # rule 7
        raise _fail("checksum mismatch: the blob is corrupt")
    (_, _, _, mode, padding, align, reserved11, inputs, image_index, grid_index, reserved15) = (
        _HEADER.unpack_from(data)
    )
    if mode not in MODE_NAMES:  # rule 8
        raise _fail(f"mode code {mode}, must be 0 (bilinear) or 1 (nearest)")
    if padding not in PADDING_NAMES:  # rule 9
        raise _fail(f"padding code {padding}, must be 0 (zeros), 1 (border) or 2 (reflection)")
    if align > 1:  # rule 10
        raise _fail(f"align_corners {align}, must be 0 or 1")
    if reserved11 != 0:  # rule 11
        raise _fail(f"reserved byte 11 is {reserved11}, must be 0")
    if inputs not in (1, 2):  # rule 12
        raise _fail(f"input count {inputs}, must be 1 (image and grid are one tensor) or 2")
    if image_index >= inputs:  # rule 13
        raise _fail(f"image argument index {image_index}, must be below the input count {inputs}")
    if grid_index >= inputs:  # rule 14
        raise _fail(f"grid argument index {grid_index}, must be below the input count {inputs}")
    if inputs == 2 and image_index == grid_index:  # rule 15
        raise _fail(
            f"image and grid argument indices are both {image_index}; with 2 inputs they must "
            "differ"
        )
    if reserved15 != 0:  # rule 16
        raise _fail(f"reserved byte 15 is {reserved15}, must be 0")
    image_q = _check_record(data, IMAGE_RECORD_OFFSET, "image")  # rule 17
    grid_q = _check_record(data, GRID_RECORD_OFFSET, "grid")
    output_q = _check_record(data, OUTPUT_RECORD_OFFSET, "output")
    if (image_q is None) != (grid_q is None):  # rule 18
        raise _fail("image and grid must both be quantized or both float32")
    if output_q is not None and image_q is None:  # rule 19
        raise _fail("a quantized output needs a quantized image and grid")
    image_shape: tuple[int, int, int, int] = _SHAPE.unpack_from(data, IMAGE_SHAPE_OFFSET)
    grid_shape: tuple[int, int, int, int] = _SHAPE.unpack_from(data, GRID_SHAPE_OFFSET)
    if not all(1 <= d <= MAX_DIMENSION for d in image_shape):  # rule 20
        raise _fail(
            f"image shape {_shape_text(image_shape)}: every dimension must be in "
            f"[1, {MAX_DIMENSION}]"
        )
    if _elements_exceed(image_shape):  # rule 21
        raise _fail(f"image shape {_shape_text(image_shape)}: more than {MAX_ELEMENTS} elements")
    if not all(1 <= d <= MAX_DIMENSION for d in grid_shape):  # rule 22
        raise _fail(
            f"grid shape {_shape_text(grid_shape)}: every dimension must be in [1, {MAX_DIMENSION}]"
        )
    if grid_shape[3] != 2:  # rule 23
        raise _fail(f"grid shape {_shape_text(grid_shape)}: last dimension must be 2")
    if _elements_exceed(grid_shape):  # rule 24
        raise _fail(f"grid shape {_shape_text(grid_shape)}: more than {MAX_ELEMENTS} elements")
    if grid_shape[0] != image_shape[0]:  # rule 25
        raise _fail(f"grid N {grid_shape[0]} differs from the image's N {image_shape[0]}")
    output_shape = (image_shape[0], image_shape[1], grid_shape[1], grid_shape[2])
    if _elements_exceed(output_shape):  # rule 26
        raise _fail(f"output shape {_shape_text(output_shape)}: more than {MAX_ELEMENTS} elements")
    if inputs == 1 and (  # rule 27
        (None if image_q is None else image_q.dtype) != (None if grid_q is None else grid_q.dtype)
        or image_shape != grid_shape
    ):
        raise _fail(
            "image and grid are one tensor (input count 1) but the blob gives them different "
            "dtypes or shapes"
        )
    op = GridSampleOp(
        mode=MODE_NAMES[mode],
        padding_mode=PADDING_NAMES[padding],
        align_corners=bool(align),
        image=image_q,
        grid=grid_q,
        output=output_q,
    )
    return DelegateBlob(op, image_shape, grid_shape, ArgumentRoles(inputs, image_index, grid_index))
