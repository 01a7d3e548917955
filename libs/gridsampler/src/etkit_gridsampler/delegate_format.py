"""The grid-sampler delegate blob: what ``GridSamplerBackend.preprocess`` writes into a ``.pte``
and the C++ backend reads at ``init``. Layout (little-endian, 120 bytes), also in
docs/delegate_format.md:

=======  ====  ==========================================================
offset   size  field
=======  ====  ==========================================================
0        4     magic ``b"ETGS"``
4        2     format version (1)
6        2     blob size in bytes (120)
8        1     mode: 0 bilinear, 1 nearest
9        1     padding: 0 zeros, 1 border, 2 reflection
10       1     align_corners: 0 or 1
11       1     reserved, 0
12       24    image quantization record
36       24    grid quantization record
60       24    output quantization record
84       16    image shape N, C, H, W (int32 each)
100      16    grid shape N, Ho, Wo, 2 (int32 each)
116      4     CRC-32 (zlib) of bytes 0..115
=======  ====  ==========================================================

A quantization record is ``present`` (uint8: 0 float32, 1 quantized), ``dtype`` (uint8: 0
float32, 1 int8, 2 int16, 3 uint8), 2 reserved bytes, ``zero_point``, ``quant_min``,
``quant_max`` (int32 each) and ``scale`` (float64).
"""

from __future__ import annotations

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
FORMAT_VERSION: Final = 1
BLOB_SIZE: Final = 120

_HEADER = struct.Struct("<4sHHBBBB")
_QPARAMS = struct.Struct("<BBHiiid")
_SHAPES = struct.Struct("<8i")
_DTYPE_CODES: Final[dict[torch.dtype, int]] = {torch.int8: 1, torch.int16: 2, torch.uint8: 3}
_CODE_DTYPES: Final = {code: dtype for dtype, code in _DTYPE_CODES.items()}


class DelegateFormatError(ValueError):
    """A blob that is not a valid grid-sampler delegate blob."""


@dataclass(frozen=True)
class DelegateBlob:
    """The decoded content of a delegate blob."""

    op: GridSampleOp
    image_shape: tuple[int, int, int, int]
    grid_shape: tuple[int, int, int, int]


def _pack_qparams(qparams: QParams | None) -> bytes:
    if qparams is None:
        return _QPARAMS.pack(0, 0, 0, 0, 0, 0, 0.0)
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
) -> bytes:
    """The blob for ``op`` on an image of ``image_shape`` and a grid of ``grid_shape``."""
    if len(image_shape) != 4 or len(grid_shape) != 4 or grid_shape[3] != 2:
        raise ValueError(
            f"expected an N x C x H x W image and an N x Ho x Wo x 2 grid, got "
            f"{tuple(image_shape)} and {tuple(grid_shape)}"
        )
    body = (
        _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            BLOB_SIZE,
            MODE_CODES[op.mode],
            PADDING_CODES[op.padding_mode],
            int(op.align_corners),
            0,
        )
        + _pack_qparams(op.image)
        + _pack_qparams(op.grid)
        + _pack_qparams(op.output)
        + _SHAPES.pack(*image_shape, *grid_shape)
    )
    return body + struct.pack("<I", zlib.crc32(body))


def _unpack_qparams(data: bytes, offset: int) -> QParams | None:
    present, dtype, _, zero_point, quant_min, quant_max, scale = _QPARAMS.unpack_from(data, offset)
    if not present:
        return None
    if dtype not in _CODE_DTYPES:
        raise DelegateFormatError(f"unknown dtype code {dtype} in a quantization record")
    return QParams(scale, zero_point, quant_min, quant_max, _CODE_DTYPES[dtype])


def decode(data: bytes) -> DelegateBlob:
    """Reads a blob back (for reports and tests), with the checks the C++ runtime makes.
    Raises ``DelegateFormatError`` saying what is wrong."""
    if len(data) < _HEADER.size:
        raise DelegateFormatError(f"truncated: {len(data)} bytes, shorter than the header")
    magic, version, size, mode, padding, align_corners, _ = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DelegateFormatError(f"bad magic {magic!r}: not an etkit grid-sampler blob")
    if version > FORMAT_VERSION:
        raise DelegateFormatError(
            f"format version {version} is newer than this library's {FORMAT_VERSION}"
        )
    if size != BLOB_SIZE or len(data) < BLOB_SIZE:
        raise DelegateFormatError(f"truncated: {len(data)} bytes, expected {BLOB_SIZE}")
    (crc,) = struct.unpack_from("<I", data, BLOB_SIZE - 4)
    if zlib.crc32(data[: BLOB_SIZE - 4]) != crc:
        raise DelegateFormatError("checksum mismatch: the blob is corrupt")
    if mode not in MODE_NAMES or padding not in PADDING_NAMES or align_corners > 1:
        raise DelegateFormatError("invalid mode, padding or align_corners")
    try:
        op = GridSampleOp(
            mode=MODE_NAMES[mode],
            padding_mode=PADDING_NAMES[padding],
            align_corners=bool(align_corners),
            image=_unpack_qparams(data, 12),
            grid=_unpack_qparams(data, 36),
            output=_unpack_qparams(data, 60),
        )
    except ValueError as error:
        raise DelegateFormatError(f"invalid quantization record: {error}") from error
    shapes = _SHAPES.unpack_from(data, 84)
    return DelegateBlob(op, tuple(shapes[:4]), tuple(shapes[4:]))
