"""The grid-sampler delegate blob: what ``GridSamplerBackend.preprocess`` writes into a ``.pte``
and the C++ backend reads at ``init``: format version 2 for fixed shapes, version 3 where a
dimension is dynamic (bounds instead of sizes).

docs/delegate_format.md is its one definition (layout, validity rules in order, messages);
``decode`` implements those rules as csrc/delegate_format.cpp does, message for message, and
``encode`` writes the canonical blob and checks it with ``decode``.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Final

import torch

from etkit_gridsampler.op import (
    MODE_CODES,
    MODE_NAMES,
    PADDING_CODES,
    PADDING_NAMES,
    GridSampleOp,
    QParams,
    quantize_per_tensor,
)

MAGIC: Final = b"ETGS"
FORMAT_VERSION: Final = 3  # the newest version this module reads; fixed shapes are written as 2
FIXED_VERSION: Final = 2
BLOB_SIZE: Final = 124  # version 2
CRC_OFFSET: Final = BLOB_SIZE - 4
DYNAMIC_BLOB_SIZE: Final = 160  # version 3
DYNAMIC_CRC_OFFSET: Final = DYNAMIC_BLOB_SIZE - 4
BLOB_SIZES: Final[dict[int, int]] = {2: BLOB_SIZE, 3: DYNAMIC_BLOB_SIZE}

MAX_DIMENSION: Final = 1 << 24
MAX_ELEMENTS: Final = (1 << 31) - 1
MIN_SCALE: Final = 1e-12
MAX_SCALE: Final = 1e12

IMAGE_RECORD_OFFSET: Final = 16
GRID_RECORD_OFFSET: Final = 40
OUTPUT_RECORD_OFFSET: Final = 64
IMAGE_SHAPE_OFFSET: Final = 88
GRID_SHAPE_OFFSET: Final = 104
DYNAMIC_FLAGS_OFFSET: Final = 120
IMAGE_LOWER_OFFSET: Final = 124
GRID_LOWER_OFFSET: Final = 140

# The dimension names of rules 31 and 32, in the order of the flag bits (image: bits 0 to 3, grid:
# bits 4 to 6; the grid's last dimension is never dynamic).
IMAGE_DIMENSIONS: Final = ("N", "C", "H", "W")
GRID_DIMENSIONS: Final = ("N", "Ho", "Wo", "last dimension")

_PREFIX: Final = "grid-sampler delegate blob: "
_HEADER = struct.Struct("<4sHHBBBBBBBB")  # 16 bytes: through the argument roles
_QPARAMS = struct.Struct("<BBHiiid")
_SHAPE = struct.Struct("<4i")
_FLAGS = struct.Struct("<B3x")  # version 3: the dynamic dimensions, 3 reserved bytes
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
class SamplerShapes:
    """A grid sampler's op and shapes. ``image_shape`` and ``grid_shape`` are the shapes (where
    a dimension is dynamic: its upper bound); ``image_min_shape`` and ``grid_min_shape`` the
    lower bounds (equal to the shapes where every dimension is fixed; left out, they are)."""

    op: GridSampleOp
    image_shape: tuple[int, int, int, int]
    grid_shape: tuple[int, int, int, int]
    image_min_shape: tuple[int, ...] = ()
    grid_min_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.image_min_shape:
            object.__setattr__(self, "image_min_shape", tuple(self.image_shape))
        if not self.grid_min_shape:
            object.__setattr__(self, "grid_min_shape", tuple(self.grid_shape))

    @property
    def is_dynamic(self) -> bool:
        """True when a dimension of the image or the grid is dynamic."""
        image_fixed = tuple(self.image_min_shape) == tuple(self.image_shape)
        grid_fixed = tuple(self.grid_min_shape) == tuple(self.grid_shape)
        return not (image_fixed and grid_fixed)

    def image_bounds(self) -> tuple[tuple[int, int], ...]:
        """(lower, upper) of each image dimension, N, C, H, W."""
        return tuple(zip(self.image_min_shape, self.image_shape, strict=True))

    def grid_bounds(self) -> tuple[tuple[int, int], ...]:
        """(lower, upper) of each grid dimension, N, Ho, Wo, 2."""
        return tuple(zip(self.grid_min_shape, self.grid_shape, strict=True))


@dataclass(frozen=True)
class DelegateBlob(SamplerShapes):
    """The decoded content of a delegate blob: the sampler (version 3: with the bounds of its
    dynamic dimensions) and which runtime argument is which."""

    roles: ArgumentRoles = field(kw_only=True)
    # The grid arrives as float32 and the delegate quantizes it with ``op.grid`` on entry
    # (byte 15; ``op.quantize_per_tensor``): the quantize before the sampler, fused.
    quantizes_grid: bool = field(default=False, kw_only=True)

    @property
    def grid_arrival_dtype(self) -> torch.dtype:
        """The dtype of the tensor the delegate receives as its grid: float32 where it quantizes
        the grid on entry or the op is float, else the grid's quantized dtype."""
        if self.quantizes_grid or self.op.grid is None:
            return torch.float32
        return self.op.grid.dtype

    def grid_operand(self, grid: torch.Tensor) -> torch.Tensor:
        """The grid the sampler samples with, from the tensor the delegate receives as its grid:
        that tensor, or where the blob quantizes the grid on entry, it quantized as the runtime
        does (``quantize_per_tensor``)."""
        if self.quantizes_grid and self.op.grid is not None:
            return quantize_per_tensor(grid, self.op.grid)
        return grid

    @property
    def version(self) -> int:
        """The format version ``encode`` writes for this content: 3 with a dynamic dimension,
        else 2."""
        return FORMAT_VERSION if self.is_dynamic else FIXED_VERSION


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
    image_min_shape: tuple[int, ...] | None = None,
    grid_min_shape: tuple[int, ...] | None = None,
    quantizes_grid: bool = False,
) -> bytes:
    """The blob for ``op`` on an image of ``image_shape`` and a grid of ``grid_shape``, which
    the delegate receives as the arguments ``roles`` names. With ``image_min_shape`` or
    ``grid_min_shape`` (lower bounds; ``None``: the shape, every dimension fixed), the shapes
    are upper bounds and each dimension whose bounds differ is dynamic: the blob is then format
    version 3, else version 2. With ``quantizes_grid`` the grid arrives as float32 and the
    delegate quantizes it with ``op.grid`` (byte 15). Raises ``DelegateFormatError`` (a
    ``ValueError``) when the result would break a rule of docs/delegate_format.md."""
    image_lower = tuple(image_shape if image_min_shape is None else image_min_shape)
    grid_lower = tuple(grid_shape if grid_min_shape is None else grid_min_shape)
    if (
        len(image_shape) != 4
        or len(grid_shape) != 4
        or grid_shape[3] != 2
        or len(image_lower) != 4
        or len(grid_lower) != 4
    ):
        raise DelegateFormatError(
            f"{_PREFIX}expected an N x C x H x W image and an N x Ho x Wo x 2 grid, got "
            f"{tuple(image_shape)} and {tuple(grid_shape)} (lower bounds {image_lower} and "
            f"{grid_lower})"
        )
    for value in (*image_shape, *grid_shape, *image_lower, *grid_lower):
        if not -(1 << 31) <= value < (1 << 31):
            raise DelegateFormatError(
                f"{_PREFIX}shapes {tuple(image_shape)} and {tuple(grid_shape)} (lower bounds "
                f"{image_lower} and {grid_lower}) do not fit int32"
            )
    for value in (roles.inputs, roles.image, roles.grid):
        if not 0 <= value <= 255:
            raise DelegateFormatError(f"{_PREFIX}argument roles {roles} do not fit a byte each")
    dynamic = image_lower != tuple(image_shape) or grid_lower != tuple(grid_shape)
    version = FORMAT_VERSION if dynamic else FIXED_VERSION
    body = (
        _HEADER.pack(
            MAGIC,
            version,
            BLOB_SIZES[version],
            MODE_CODES[op.mode],
            PADDING_CODES[op.padding_mode],
            int(op.align_corners),
            0,
            roles.inputs,
            roles.image,
            roles.grid,
            int(quantizes_grid),
        )
        + _pack_qparams(op.image)
        + _pack_qparams(op.grid)
        + _pack_qparams(op.output)
        + _SHAPE.pack(*image_shape)
        + _SHAPE.pack(*grid_shape)
    )
    if dynamic:
        # The grid's last dimension has no bit: a lower bound other than 2 is left for rule 32.
        flags = sum(1 << i for i in range(4) if image_lower[i] != image_shape[i]) | sum(
            1 << (4 + i) for i in range(3) if grid_lower[i] != grid_shape[i]
        )
        body += _FLAGS.pack(flags) + _SHAPE.pack(*image_lower) + _SHAPE.pack(*grid_lower)
    blob = body + struct.pack("<I", zlib.crc32(body))
    decode(blob)  # the writer holds itself to the reader's rules
    return blob


def shape_text(lower: tuple[int, ...], upper: tuple[int, ...]) -> str:
    """``[1, 3, 4..64, 4..64]``: a shape with each dynamic dimension as ``lower..upper``, as the
    runtime's messages write it."""
    return (
        "["
        + ", ".join(str(u) if lo == u else f"{lo}..{u}" for lo, u in zip(lower, upper, strict=True))
        + "]"
    )


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
    if version < FIXED_VERSION:  # rule 4
        raise _fail(
            f"format version {version} is no longer read (it did not record which argument is "
            "the image): export the program again with this etkit-gridsampler"
        )
    expected_size = BLOB_SIZES[version]
    if size != expected_size:  # rule 5
        raise _fail(f"size field {size}, expected {expected_size} for format version {version}")
    if length < expected_size:  # rule 6
        raise _fail(f"truncated: {length} bytes, expected {expected_size}")
    if length > expected_size:
        raise _fail(f"{length} bytes, expected {expected_size} (extra bytes after the blob)")
    crc_offset = expected_size - 4
    (crc,) = struct.unpack_from("<I", data, crc_offset)
    if zlib.crc32(data[:crc_offset]) != crc:  # rule 7
        raise _fail("checksum mismatch: the blob is corrupt")
    (_, _, _, mode, padding, align, reserved11, inputs, image_index, grid_index, arrival) = (
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
    if arrival > 1:  # rule 16
        raise _fail(
            f"grid arrival code {arrival}, must be 0 (as its record says) or 1 (float32, "
            "quantized on entry)"
        )
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
    image_lower, grid_lower = image_shape, grid_shape
    if version == FORMAT_VERSION:
        image_lower, grid_lower = _check_bounds(data, image_shape, grid_shape, inputs)
    if arrival == 1 and (grid_q is None or inputs != 2):  # rule 35
        raise _fail(
            "a grid that arrives as float32 to be quantized (grid arrival code 1) needs a "
            "quantized grid record and an input of its own (input count 2)"
        )
    op = GridSampleOp(
        mode=MODE_NAMES[mode],
        padding_mode=PADDING_NAMES[padding],
        align_corners=bool(align),
        image=image_q,
        grid=grid_q,
        output=output_q,
    )
    return DelegateBlob(
        op,
        image_shape,
        grid_shape,
        image_lower,
        grid_lower,
        roles=ArgumentRoles(inputs, image_index, grid_index),
        quantizes_grid=arrival == 1,
    )


def _check_lower_bound(role: str, name: str, dynamic: bool, lower: int, upper: int) -> None:
    """Rules 31 and 32 for one dimension."""
    if not dynamic and lower != upper:
        raise _fail(f"{role} {name} is fixed at {upper} but its lower bound is {lower}")
    if dynamic and not 1 <= lower < upper:
        raise _fail(
            f"{role} {name} is dynamic with bounds [{lower}, {upper}]: the lower bound must be at "
            "least 1 and below the upper bound"
        )


def _check_bounds(
    data: bytes,
    image_shape: tuple[int, int, int, int],
    grid_shape: tuple[int, int, int, int],
    inputs: int,
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Rules 28 to 34 (version 3): the dynamic dimensions and the lower bounds, returned."""
    flags = data[DYNAMIC_FLAGS_OFFSET]
    if flags & 0x80:  # rule 28
        raise _fail(
            f"dynamic dimension flags 0x{flags:02x}: bit 7 must be 0 (the grid's last dimension "
            "is always 2)"
        )
    if any(data[DYNAMIC_FLAGS_OFFSET + 1 : IMAGE_LOWER_OFFSET]):  # rule 29
        raise _fail("reserved bytes 121 to 123 are not zero")
    if flags == 0:  # rule 30
        raise _fail(
            "format version 3 with no dynamic dimension: fixed shapes are written as format "
            "version 2"
        )
    image_lower: tuple[int, int, int, int] = _SHAPE.unpack_from(data, IMAGE_LOWER_OFFSET)
    grid_lower: tuple[int, int, int, int] = _SHAPE.unpack_from(data, GRID_LOWER_OFFSET)
    for i, name in enumerate(IMAGE_DIMENSIONS):  # rule 31
        _check_lower_bound("image", name, bool(flags >> i & 1), image_lower[i], image_shape[i])
    for i, name in enumerate(GRID_DIMENSIONS):  # rule 32
        dynamic = i < 3 and bool(flags >> (4 + i) & 1)
        _check_lower_bound("grid", name, dynamic, grid_lower[i], grid_shape[i])
    if grid_lower[0] != image_lower[0]:  # rule 33
        raise _fail(
            f"grid N bounds [{grid_lower[0]}, {grid_shape[0]}] differ from the image's N bounds "
            f"[{image_lower[0]}, {image_shape[0]}]"
        )
    if inputs == 1 and image_lower != grid_lower:  # rule 34
        raise _fail(
            "image and grid are one tensor (input count 1) but the blob gives them different bounds"
        )
    return image_lower, grid_lower
