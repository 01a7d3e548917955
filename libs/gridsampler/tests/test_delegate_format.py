"""The delegate blob: written by Python, validated identically by Python and by the C++ runtime."""

from __future__ import annotations

import struct
import zlib

import pytest
import torch

from etkit_gridsampler import GridSampleOp, QParams
from etkit_gridsampler.delegate_format import BLOB_SIZE, DelegateFormatError, decode, encode
from etkit_gridsampler.runtime import validate_blob

OP = GridSampleOp(
    mode="nearest",
    padding_mode="reflection",
    align_corners=True,
    image=QParams(1 / 127, 0, -127, 127, torch.int8),
    grid=QParams(1 / 32767, 0, -32767, 32767, torch.int16),
    output=None,
)


def _with_crc(body: bytes) -> bytes:
    return body[: BLOB_SIZE - 4] + struct.pack("<I", zlib.crc32(body[: BLOB_SIZE - 4]))


def test_round_trip() -> None:
    blob = encode(OP, (2, 4, 30, 40), (2, 10, 12, 2))
    assert len(blob) == BLOB_SIZE and blob[:4] == b"ETGS"
    decoded = decode(blob)
    assert decoded.op == OP
    assert decoded.image_shape == (2, 4, 30, 40) and decoded.grid_shape == (2, 10, 12, 2)
    validate_blob(blob)  # the C++ side accepts it too


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b[:50], "truncated"),
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: _with_crc(b[:4] + struct.pack("<H", 2) + b[6:]), "newer"),
        (lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:], "checksum"),
        (lambda b: _with_crc(b[:8] + b"\x07" + b[9:]), "mode"),
    ],
    ids=["truncated", "bad-magic", "newer-version", "corrupt", "bad-mode"],
)
def test_bad_blobs_refused_by_both_sides(mangle: object, message: str) -> None:
    blob = mangle(encode(OP, (1, 3, 4, 4), (1, 2, 2, 2)))  # type: ignore[operator]
    with pytest.raises(DelegateFormatError, match=message):
        decode(blob)
    with pytest.raises(DelegateFormatError, match=message):
        validate_blob(blob)


def test_encode_rejects_wrong_shapes() -> None:
    with pytest.raises(ValueError, match="N x Ho x Wo x 2"):
        encode(OP, (1, 3, 4, 4), (1, 2, 2, 3))
