"""The delegate blob: written by Python, validated by Python and by the C++ runtime with the same
rules and the same messages (docs/delegate_format.md), one case per rule."""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch

from etkit_gridsampler import GridSampleOp, QParams
from etkit_gridsampler.delegate_format import (
    BLOB_SIZE,
    DYNAMIC_BLOB_SIZE,
    ArgumentRoles,
    DelegateFormatError,
    decode,
    encode,
    shape_text,
)
from etkit_gridsampler.runtime import validate_blob

OP = GridSampleOp(
    mode="nearest",
    padding_mode="reflection",
    align_corners=True,
    image=QParams(1 / 127, 0, -127, 127, torch.int8),
    grid=QParams(1 / 32767, 0, -32767, 32767, torch.int16),
    output=None,
)
FLOAT_OP = GridSampleOp(mode="bilinear", padding_mode="border")
GRID_FIRST = ArgumentRoles(inputs=2, image=1, grid=0)
IMAGE_SHAPE, GRID_SHAPE = (1, 4, 6, 8), (1, 5, 7, 2)


def _with_crc(blob: bytes) -> bytes:
    crc_offset = len(blob) - 4  # 120 (version 2) or 156 (version 3)
    return blob[:crc_offset] + struct.pack("<I", zlib.crc32(blob[:crc_offset]))


def _set(offset: int, fmt: str, *values: object) -> Callable[[bytes], bytes]:
    """A mutation that writes ``values`` at ``offset`` and recomputes the checksum, so that the
    field's own rule is what refuses the blob."""

    def mutate(blob: bytes) -> bytes:
        data = bytearray(blob)
        struct.pack_into(fmt, data, offset, *values)
        return _with_crc(bytes(data))

    return mutate


def _messages(blob: bytes) -> tuple[str | None, str | None]:
    """(Python's message, C++'s message); None where the side accepts the blob."""
    python = native = None
    try:
        decode(blob)
    except DelegateFormatError as error:
        python = str(error)
    try:
        validate_blob(blob)
    except DelegateFormatError as error:
        native = str(error)
    return python, native


@pytest.mark.parametrize(
    ("op", "image_shape", "grid_shape", "roles"),
    [
        (OP, (2, 4, 30, 40), (2, 10, 12, 2), ArgumentRoles(2, 0, 1)),
        (OP, IMAGE_SHAPE, GRID_SHAPE, GRID_FIRST),
        (FLOAT_OP, IMAGE_SHAPE, GRID_SHAPE, GRID_FIRST),
        (FLOAT_OP, (1, 5, 7, 2), (1, 5, 7, 2), ArgumentRoles(1, 0, 0)),  # one tensor, both roles
        (
            GridSampleOp(
                image=QParams(0.02, -3, -128, 127, torch.int8),
                grid=QParams(1 / 127, 0, -127, 127, torch.int8),
                output=QParams(0.03, 5, -128, 127, torch.int8),
            ),
            (3, 1, 1, 1),
            (3, 1, 1, 2),
            ArgumentRoles(2, 1, 0),
        ),
    ],
    ids=["image-first", "grid-first", "float", "one-tensor", "int8-grid"],
)
def test_round_trip(
    op: GridSampleOp,
    image_shape: tuple[int, int, int, int],
    grid_shape: tuple[int, int, int, int],
    roles: ArgumentRoles,
) -> None:
    blob = encode(op, image_shape, grid_shape, roles=roles)
    assert len(blob) == BLOB_SIZE and blob[:4] == b"ETGS"
    decoded = decode(blob)
    assert (decoded.op, decoded.image_shape, decoded.grid_shape, decoded.roles) == (
        op,
        image_shape,
        grid_shape,
        roles,
    )
    validate_blob(blob)  # the C++ side accepts it too
    assert encode(decoded.op, decoded.image_shape, decoded.grid_shape, roles=decoded.roles) == blob


def _blob() -> bytes:
    return encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST)


# A version-3 blob: the image's H and W and the grid's Ho and Wo dynamic.
IMAGE_UPPER, IMAGE_LOWER = (1, 4, 64, 96), (1, 4, 1, 1)
GRID_UPPER, GRID_LOWER = (1, 48, 80, 2), (1, 1, 1, 2)


def _dynamic_blob() -> bytes:
    return encode(
        OP,
        IMAGE_UPPER,
        GRID_UPPER,
        roles=GRID_FIRST,
        image_min_shape=IMAGE_LOWER,
        grid_min_shape=GRID_LOWER,
    )


def _dynamic_batch_blob() -> bytes:
    """N dynamic too (1 to 4), and C fixed."""
    return encode(
        OP,
        (4, 4, 64, 96),
        (4, 48, 80, 2),
        roles=GRID_FIRST,
        image_min_shape=(1, 4, 8, 8),
        grid_min_shape=(1, 8, 8, 2),
    )


def _dynamic_one_tensor_blob() -> bytes:
    return encode(
        FLOAT_OP,
        (1, 16, 9, 2),
        (1, 16, 9, 2),
        roles=ArgumentRoles(1, 0, 0),
        image_min_shape=(1, 2, 3, 2),
        grid_min_shape=(1, 2, 3, 2),
    )


def _float_blob() -> bytes:
    return encode(FLOAT_OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST)


def _absent(offset: int) -> Callable[[bytes], bytes]:
    return _set(offset, "<24x")


# One case per rule of docs/delegate_format.md: (rule, base blob, mutation, the message's text).
RULE_CASES: list[tuple[str, Callable[[], bytes], Callable[[bytes], bytes], str]] = [
    ("1", _blob, lambda b: b[:7], "truncated: 7 bytes, shorter than the 8-byte header"),
    ("2", _blob, lambda b: b"XXXX" + b[4:], "bad magic: not an etkit grid-sampler blob"),
    ("3", _blob, _set(4, "<H", 4), "format version 4 is newer than this reader's 3"),
    ("3-v3", _dynamic_blob, _set(4, "<H", 0xFFFF), "format version 65535 is newer than this"),
    ("4-v1", _blob, _set(4, "<H", 1), "format version 1 is no longer read"),
    ("4-v0", _blob, _set(4, "<H", 0), "format version 0 is no longer read"),
    ("5", _blob, _set(6, "<H", 120), "size field 120, expected 124 for format version 2"),
    ("6-short", _blob, lambda b: b[:50], "truncated: 50 bytes, expected 124"),
    ("6-long", _blob, lambda b: b + b"\0", "125 bytes, expected 124 (extra bytes after the blob)"),
    (
        "5-v3",
        _dynamic_blob,
        _set(6, "<H", 124),
        "size field 124, expected 160 for format version 3",
    ),
    ("5-v2-as-v3", _blob, _set(4, "<H", 3), "size field 124, expected 160 for format version 3"),
    ("6-v3-short", _dynamic_blob, lambda b: b[:124], "truncated: 124 bytes, expected 160"),
    ("6-v3-long", _dynamic_blob, lambda b: b + b"\0", "161 bytes, expected 160 (extra bytes"),
    ("7-v3", _dynamic_blob, lambda b: b[:130] + bytes([b[130] ^ 1]) + b[131:], "checksum"),
    ("7", _blob, lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], "checksum mismatch"),
    ("8", _blob, _set(8, "<B", 7), "mode code 7, must be 0 (bilinear) or 1 (nearest)"),
    ("9", _blob, _set(9, "<B", 3), "padding code 3, must be 0 (zeros), 1 (border) or 2"),
    ("10", _blob, _set(10, "<B", 2), "align_corners 2, must be 0 or 1"),
    ("11", _blob, _set(11, "<B", 1), "reserved byte 11 is 1, must be 0"),
    ("12-zero", _blob, _set(12, "<B", 0), "input count 0, must be 1 (image and grid are one"),
    ("12-three", _blob, _set(12, "<B", 3), "input count 3, must be 1"),
    ("13", _blob, _set(13, "<B", 2), "image argument index 2, must be below the input count 2"),
    ("14", _blob, _set(14, "<B", 255), "grid argument index 255, must be below the input count"),
    ("14-one", _blob, _set(12, "<B", 1), "image argument index 1, must be below the input count"),
    ("15", _blob, _set(13, "<BB", 1, 1), "image and grid argument indices are both 1"),
    (
        "16",
        _blob,
        _set(15, "<B", 9),
        "grid arrival code 9, must be 0 (as its record says) or 1 (float32, quantized on entry)",
    ),
    ("17a", _blob, _set(16, "<B", 2), "image quantization record: present flag 2, must be 0"),
    ("17b", _blob, _set(64 + 20, "<B", 1), "output quantization record: absent (float32) but not"),
    ("17c-image", _blob, _set(17, "<B", 2), "image quantization record: dtype code 2, must be 1"),
    (
        "17c-grid",
        _blob,
        _set(41, "<B", 3),
        "grid quantization record: dtype code 3, must be 1 (int8",
    ),
    ("17c-float", _blob, _set(17, "<B", 0), "image quantization record: dtype code 0"),
    ("17d", _blob, _set(42, "<H", 1), "grid quantization record: reserved bytes are not zero"),
    (
        "17e",
        _blob,
        _set(48, "<i", -70000),
        "grid quantization record: quant_min -70000 outside int16's range [-32768, 32767]",
    ),
    (
        "17f",
        _blob,
        _set(28, "<i", 200),
        "image quantization record: quant_max 200 outside int8's range [-128, 127]",
    ),
    (
        "17g",
        _blob,
        _set(20, "<iii", 4, 5, 3),
        "image quantization record: quant_min 5 greater than quant_max 3",
    ),
    (
        "17h",
        _blob,
        _set(20, "<i", 200),
        "image quantization record: zero point 200 outside [quant_min, quant_max] = [-127, 127]",
    ),
    ("17i-inf", _blob, _set(32, "<d", math.inf), "image quantization record: scale is not finite"),
    ("17i-nan", _blob, _set(56, "<d", math.nan), "grid quantization record: scale is not finite"),
    ("17j-zero", _blob, _set(32, "<d", 0.0), "image quantization record: scale 0 outside [1e-12,"),
    ("17j-huge", _blob, _set(32, "<d", 1e300), "scale 1e+300 outside [1e-12, 1e+12]"),
    ("17j-negative", _blob, _set(32, "<d", -0.5), "scale -0.5 outside [1e-12, 1e+12]"),
    ("17j-tiny", _blob, _set(56, "<d", 1e-13), "grid quantization record: scale 1e-13 outside"),
    ("17k", _blob, _set(32, "<d", 0.1), "scale 0.10000000000000001 is not a float32 value"),
    ("18", _blob, _absent(40), "image and grid must both be quantized or both float32"),
    (
        "19",
        _float_blob,
        _set(64, "<BBHiiid", 1, 1, 0, 0, -127, 127, 1 / 128),
        "a quantized output needs a quantized image and grid",
    ),
    (
        "20",
        _blob,
        _set(88, "<4i", 1, 0, 6, 8),
        "image shape [1, 0, 6, 8]: every dimension must be in [1, 16777216]",
    ),
    (
        "20-big",
        _blob,
        _set(88, "<4i", 1, 4, 6, (1 << 24) + 1),
        "image shape [1, 4, 6, 16777217]: every dimension",
    ),
    (
        "21",
        _blob,
        _set(88, "<4i", 1, 1 << 16, 1 << 16, 1),
        "image shape [1, 65536, 65536, 1]: more than 2147483647 elements",
    ),
    ("22", _blob, _set(104, "<4i", 1, -5, 7, 2), "grid shape [1, -5, 7, 2]: every dimension"),
    (
        "23",
        _blob,
        _set(104, "<4i", 1, 5, 7, 3),
        "grid shape [1, 5, 7, 3]: last dimension must be 2",
    ),
    (
        "24",
        _blob,
        _set(104, "<4i", 1, 1 << 16, 1 << 16, 2),
        "grid shape [1, 65536, 65536, 2]: more than 2147483647 elements",
    ),
    ("25", _blob, _set(104, "<i", 2), "grid N 2 differs from the image's N 1"),
    (
        "26",
        _blob,
        _set(88, "<8i", 1, 1 << 16, 1, 1, 1, 256, 256, 2),
        "output shape [1, 65536, 256, 256]: more than 2147483647 elements",
    ),
    (
        "27",
        _blob,
        _set(12, "<BBB", 1, 0, 0),
        "image and grid are one tensor (input count 1) but the blob gives them different",
    ),
    ("20-v3", _dynamic_blob, _set(88, "<4i", 1, 4, 0, 96), "image shape [1, 4, 0, 96]: every"),
    (
        "28",
        _dynamic_blob,
        _set(120, "<B", 0x8C),
        "dynamic dimension flags 0x8c: bit 7 must be 0 (the grid's last dimension is always 2)",
    ),
    ("29", _dynamic_blob, _set(122, "<B", 1), "reserved bytes 121 to 123 are not zero"),
    (
        "30",
        _dynamic_blob,
        _set(120, "<B", 0),
        "format version 3 with no dynamic dimension: fixed shapes are written as format version 2",
    ),
    (
        "31-fixed",
        _dynamic_blob,
        _set(128, "<i", 3),
        "image C is fixed at 4 but its lower bound is 3",
    ),
    (
        "31-zero",
        _dynamic_blob,
        _set(132, "<i", 0),
        "image H is dynamic with bounds [0, 64]: the lower bound must be at least 1 and below the "
        "upper bound",
    ),
    ("31-equal", _dynamic_blob, _set(136, "<i", 96), "image W is dynamic with bounds [96, 96]"),
    ("31-above", _dynamic_blob, _set(136, "<i", 97), "image W is dynamic with bounds [97, 96]"),
    ("31-flag", _dynamic_blob, _set(120, "<B", 0x6E), "image C is dynamic with bounds [4, 4]"),
    (
        "32-fixed",
        _dynamic_blob,
        _set(140, "<i", 2),
        "grid N is fixed at 1 but its lower bound is 2",
    ),
    ("32-dynamic", _dynamic_blob, _set(148, "<i", 80), "grid Wo is dynamic with bounds [80, 80]"),
    (
        "32-last",
        _dynamic_blob,
        _set(152, "<i", 1),
        "grid last dimension is fixed at 2 but its lower bound is 1",
    ),
    (
        "33",
        _dynamic_batch_blob,
        _set(140, "<i", 2),
        "grid N bounds [2, 4] differ from the image's N bounds [1, 4]",
    ),
    (
        "34",
        _dynamic_one_tensor_blob,
        _set(140, "<4i", 1, 3, 3, 2),
        "image and grid are one tensor (input count 1) but the blob gives them different bounds",
    ),
    (
        "35",
        _float_blob,
        _set(15, "<B", 1),
        "a grid that arrives as float32 to be quantized (grid arrival code 1) needs a quantized "
        "grid record and an input of its own (input count 2)",
    ),
    ("35-v3", _dynamic_one_tensor_blob, _set(15, "<B", 1), "grid arrival code 1) needs a"),
]


@pytest.mark.parametrize(
    ("base", "mutate", "message"),
    [case[1:] for case in RULE_CASES],
    ids=[f"rule-{case[0]}" for case in RULE_CASES],
)
def test_each_rule_refused_by_both_sides_with_one_message(
    base: Callable[[], bytes], mutate: Callable[[bytes], bytes], message: str
) -> None:
    python, native = _messages(mutate(base()))
    assert python is not None and native is not None, (python, native)
    assert python == native
    assert python.startswith("grid-sampler delegate blob: ")
    assert message in python, python


def test_every_rule_has_a_case() -> None:
    rules = {case[0].split("-")[0] for case in RULE_CASES}
    expected = {str(n) for n in range(1, 35) if n != 17} | {f"17{c}" for c in "abcdefghijk"}
    assert expected <= rules, sorted(expected - rules)


def _float32_neighbour(value: float, towards: float) -> float:
    return float(np.nextafter(np.float32(value), np.float32(towards)))


# The float32 values nearest the bounds: the bounds are inclusive, and a scale is a float32 value.
SMALLEST_SCALE = 1.0000001044244144e-12  # the first float32 at or above 1e-12
LARGEST_SCALE = 999999995904.0  # the last float32 at or below 1e12


@pytest.mark.parametrize(
    ("scale", "valid"),
    [
        (SMALLEST_SCALE, True),
        (_float32_neighbour(SMALLEST_SCALE, 0.0), False),
        (LARGEST_SCALE, True),
        (_float32_neighbour(LARGEST_SCALE, math.inf), False),
        (1e-12, False),  # in range, but no float32 value
        (5e-324, False),
    ],
)
def test_scale_bounds(scale: float, valid: bool) -> None:
    assert valid == (float(np.float32(scale)) == scale and 1e-12 <= scale <= 1e12)
    python, native = _messages(_set(32, "<d", scale)(_blob()))
    assert python == native
    assert (python is None) == valid, python


def test_encode_rejects_wrong_shapes() -> None:
    with pytest.raises(ValueError, match="N x Ho x Wo x 2"):
        encode(OP, (1, 3, 4, 4), (1, 2, 2, 3), roles=GRID_FIRST)


def test_encode_refuses_what_decode_would() -> None:
    with pytest.raises(DelegateFormatError, match="argument indices are both 0"):
        encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=ArgumentRoles(2, 0, 0))
    with pytest.raises(DelegateFormatError, match="image quantization record: dtype code 2"):
        encode(GridSampleOp(image=OP.grid, grid=OP.grid), IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST)
    with pytest.raises(DelegateFormatError, match="no dtype code"):
        encode(
            GridSampleOp(image=QParams(1 / 255, 0, 0, 255, torch.uint8), grid=OP.grid),
            IMAGE_SHAPE,
            GRID_SHAPE,
            roles=GRID_FIRST,
        )


@pytest.mark.parametrize(
    "make", [_dynamic_blob, _dynamic_batch_blob, _dynamic_one_tensor_blob], ids=lambda f: f.__name__
)
def test_dynamic_round_trip(make: Callable[[], bytes]) -> None:
    blob = make()
    assert len(blob) == DYNAMIC_BLOB_SIZE and struct.unpack_from("<HH", blob, 4) == (3, 160)
    decoded = decode(blob)
    assert decoded.is_dynamic and decoded.version == 3
    validate_blob(blob)  # the C++ side accepts it too
    again = encode(
        decoded.op,
        decoded.image_shape,
        decoded.grid_shape,
        roles=decoded.roles,
        image_min_shape=decoded.image_min_shape,
        grid_min_shape=decoded.grid_min_shape,
    )
    assert again == blob


def test_dynamic_blob_fields() -> None:
    decoded = decode(_dynamic_blob())
    assert (decoded.image_shape, decoded.image_min_shape) == (IMAGE_UPPER, IMAGE_LOWER)
    assert (decoded.grid_shape, decoded.grid_min_shape) == (GRID_UPPER, GRID_LOWER)
    assert _dynamic_blob()[120] == 0b0110_1100  # image H, W; grid Ho, Wo
    assert decoded.image_bounds() == ((1, 1), (4, 4), (1, 64), (1, 96))
    assert shape_text(decoded.image_min_shape, decoded.image_shape) == "[1, 4, 1..64, 1..96]"
    # The first 120 bytes are laid out as in version 2 (the shapes are the upper bounds).
    fixed = encode(OP, IMAGE_UPPER, GRID_UPPER, roles=GRID_FIRST)
    assert _dynamic_blob()[8:120] == fixed[8:120]


def test_fixed_shapes_are_written_as_version_2() -> None:
    """Bounds that are all equal are fixed shapes: the version-2 blob, byte for byte."""
    blob = encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST, image_min_shape=IMAGE_SHAPE)
    assert blob == _blob() and len(blob) == BLOB_SIZE
    decoded = decode(blob)
    assert not decoded.is_dynamic and decoded.version == 2
    assert decoded.image_min_shape == IMAGE_SHAPE and decoded.grid_min_shape == GRID_SHAPE


def test_encode_refuses_bad_bounds() -> None:
    with pytest.raises(DelegateFormatError, match=r"image H is dynamic with bounds \[9, 6\]"):
        encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST, image_min_shape=(1, 4, 9, 8))
    with pytest.raises(DelegateFormatError, match="grid N bounds"):
        encode(OP, (2, 4, 6, 8), (2, 5, 7, 2), roles=GRID_FIRST, image_min_shape=(1, 4, 6, 8))
    with pytest.raises(DelegateFormatError, match="grid last dimension is fixed at 2"):
        encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST, grid_min_shape=(1, 2, 7, 1))


def test_a_grid_quantized_on_entry_round_trips_and_both_sides_read_it() -> None:
    """Byte 15 = 1: the grid arrives as float32 and the delegate quantizes it; the readers
    accept it and say so, and a blob without it is byte for byte what it was."""
    blob = _blob()
    fused = encode(OP, IMAGE_SHAPE, GRID_SHAPE, roles=GRID_FIRST, quantizes_grid=True)
    assert fused[15] == 1 and fused[:15] == blob[:15] and fused[16:120] == blob[16:120]
    decoded = decode(fused)
    assert decoded.quantizes_grid and not decode(blob).quantizes_grid
    assert decoded.grid_arrival_dtype == torch.float32
    assert decode(blob).grid_arrival_dtype == torch.int16
    assert _messages(fused) == (None, None)
