"""The integer contract (docs/contract.md) in torch tensor ops, on any device.

``grid_sample(image, grid, op)`` computes the C++ kernel's bits (``cpu.grid_sample`` with a
quantized op) with int32/int64 tensor arithmetic only: every step of ``csrc/quantized_steps.h``
is a few element-wise integer ops over all output pixels at once (``sample``: in forms equal as
integers, each derivation beside it; ``grid_sample_steps``: the steps as written), and the taps
are gathered from the image's channel planes. Integer arithmetic is exact on every device, so
the same call gives the same bits on the CPU and on CUDA (or any device torch supports). The
only float operation is the float32 output's one multiply (step 5, as the kernels do it).

The per-op constants (``IntegerPlan``) are derived here in Python by the same operations as the
C++ ``plan_quantized`` (the tests compare them with ``plan.plan``), so nothing here calls the
native library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np
import torch

from etkit_gridsampler.op import GridSampleOp, QParams
from etkit_gridsampler.plan import UnsupportedOpError

COORD_FRAC_BITS: Final = 32  # pixel coordinates: int64 with 32 fractional bits
WEIGHT_BITS: Final = 15  # bilinear weights: 0 .. 2^15
_ONE: Final = 1 << COORD_FRAC_BITS
_MAX_COORDINATE: Final = 16777216.0  # |pixel coordinate| < 2^24
_MAX_REQUANT_RATIO: Final = 32.0  # image scale / output scale


@dataclass(frozen=True)
class AxisPlan:
    """Step 1 for one axis: ``P = shift(d * multiplier, shift) + offset`` (``shift <= 0``: an
    exact left shift by ``-shift``), ``d = q_grid - grid_zero_point``."""

    multiplier: int
    shift: int
    offset: int
    size: int


@dataclass(frozen=True)
class IntegerPlan:
    """The constants of the integer contract for one op and image size: the C++
    ``QuantizedPlan`` field for field (``plan.plan(...).values`` in the same order)."""

    x: AxisPlan
    y: AxisPlan
    grid_zero_point: int
    image_zero_point: int
    output_zero_point: int
    output_min: int
    output_max: int
    requant_multiplier: int
    requant_shift: int
    float_output: bool
    float_output_scale: float  # a float32 value: image scale * 2^-15

    @property
    def values(self) -> tuple[int, ...]:
        """The 16 integers ``etkit_gridsampler_plan`` returns, in its order."""
        return (
            self.x.multiplier, self.x.shift, self.x.offset, self.x.size,
            self.y.multiplier, self.y.shift, self.y.offset, self.y.size,
            self.grid_zero_point, self.image_zero_point, self.output_zero_point,
            self.output_min, self.output_max, self.requant_multiplier, self.requant_shift,
            int(self.float_output),
        )  # fmt: skip


def _decompose_float32(scale: float) -> tuple[int, int]:
    """A float32 ``scale`` as ``m * 2^e``, ``m`` an integer below 2^24 (``decompose_float32``)."""
    fraction, exponent = math.frexp(float(np.float32(scale)))  # fraction in [0.5, 1)
    return int(math.ldexp(fraction, 24)), exponent - 24


def _plan_axis(grid: QParams, size: int, align_corners: bool) -> AxisPlan:
    """``plan_axis`` of csrc/quantized.cpp, operation for operation."""
    mantissa, exponent = _decompose_float32(grid.scale)
    factor = size - 1 if align_corners else size
    multiplier = mantissa * factor
    left = exponent + 31
    shift = -left if left >= 0 else min(-left, 62)
    full_range = 32768.0 if grid.dtype == torch.int16 else 128.0
    max_d = full_range + abs(float(grid.zero_point))
    max_p = max_d * grid.scale * float(factor) / 2.0 + float(size) / 2.0
    if not max_p < _MAX_COORDINATE:
        raise UnsupportedOpError(
            "grid scale too large for this image: pixel coordinates would exceed 2^24"
        )
    product = max_d * float(multiplier) * math.ldexp(1.0, max(0, -shift))
    if not product < 9.2e18:
        raise UnsupportedOpError(
            "image axis too long for this grid quantization: step 1's 64-bit product would "
            "overflow (more than 2^63)"
        )
    return AxisPlan(multiplier, shift, (size - 1) << (COORD_FRAC_BITS - 1), size)


def _plan_requantization(image: QParams, output: QParams) -> tuple[int, int]:
    """Step 5's ``(multiplier, shift)``: ``scale_i / scale_o = multiplier * 2^-(shift - 15)``."""
    ratio = float(np.float32(image.scale)) / float(np.float32(output.scale))
    if not ratio <= _MAX_REQUANT_RATIO:
        raise UnsupportedOpError("image scale / output scale exceeds 32")
    fraction, exponent = math.frexp(ratio)  # ratio = fraction * 2^exponent, fraction in [0.5, 1)
    # llround: halves away from zero; the value is positive, and x + 0.5 is exact (x < 2^31
    # with at most 53 significant bits).
    multiplier = math.floor(math.ldexp(fraction, 31) + 0.5)
    if multiplier == 1 << 31:
        multiplier >>= 1
        exponent += 1
    shift = min(31 - exponent + WEIGHT_BITS, 62)
    if shift < 1:
        raise UnsupportedOpError("image scale / output scale exceeds 32")
    return multiplier, shift


def _op_reason(op: GridSampleOp) -> str | None:
    """Why the integer contract cannot serve ``op`` whatever the image's size, or None."""
    if op.image is None or op.image.dtype != torch.int8:
        got = "float32 (None)" if op.image is None else str(op.image.dtype)
        return f"a quantized grid sampler needs an int8 image (op.image.dtype), got {got}"
    if op.grid is None or op.grid.dtype not in (torch.int16, torch.int8):
        got = "float32 (None)" if op.grid is None else str(op.grid.dtype)
        return f"a quantized grid sampler needs an int16 or int8 grid (op.grid.dtype), got {got}"
    if op.output is not None and op.output.dtype != torch.int8:
        return (
            "a quantized grid sampler writes int8 or float32 (op.output.dtype torch.int8, or "
            f"op.output None), got {op.output.dtype}"
        )
    return None


@lru_cache(maxsize=1024)
def integer_plan(op: GridSampleOp, height: int, width: int) -> IntegerPlan:
    """The integer contract's constants for ``op`` on an image of ``height`` x ``width``, derived
    as the C++ ``plan_quantized`` derives them. Raises ``UnsupportedOpError`` (a ``ValueError``)
    saying why when the configuration is outside the contract (the C++ planner's reasons)."""
    if not isinstance(op, GridSampleOp):
        raise TypeError(f"op must be an etkit_gridsampler.GridSampleOp, got {type(op).__name__}")
    if height < 1 or width < 1:
        raise UnsupportedOpError(
            f"image height and width must be at least 1, got {height} x {width}"
        )
    reason = _op_reason(op)
    if reason is not None:
        raise UnsupportedOpError(reason)
    assert op.image is not None and op.grid is not None
    x = _plan_axis(op.grid, width, op.align_corners)
    y = _plan_axis(op.grid, height, op.align_corners)
    float_output_scale = float(np.float32(math.ldexp(float(np.float32(op.image.scale)), -15)))
    if op.output is None:
        requant_multiplier, requant_shift = 0, 1
        output_zero_point = output_min = output_max = 0
    else:
        requant_multiplier, requant_shift = _plan_requantization(op.image, op.output)
        output_zero_point = op.output.zero_point
        output_min, output_max = op.output.quant_min, op.output.quant_max
    return IntegerPlan(
        x=x,
        y=y,
        grid_zero_point=op.grid.zero_point,
        image_zero_point=op.image.zero_point,
        output_zero_point=output_zero_point,
        output_min=output_min,
        output_max=output_max,
        requant_multiplier=requant_multiplier,
        requant_shift=requant_shift,
        float_output=op.output is None,
        float_output_scale=float_output_scale,
    )


# ---- the steps, element-wise on int64 tensors (csrc/quantized_steps.h, one function each) ----


def _shift_round(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x / 2^k`` rounded half up: ``(x + 2^(k-1)) >> k`` (arithmetic shift); ``k`` in 1..62."""
    return (x + (1 << (k - 1))) >> k


def _shift_round_half_even(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x / 2^k`` rounded to nearest, halves to even; ``k`` in 1..62."""
    whole = x >> k
    rest = x & ((1 << k) - 1)
    halfway = 1 << (k - 1)
    up = (rest > halfway) | ((rest == halfway) & ((whole & 1) != 0))
    return whole + up.to(x.dtype)


def _unnormalize(q: torch.Tensor, grid_zero_point: int, axis: AxisPlan) -> torch.Tensor:
    """Step 1: int64 grid values to pixel coordinates with 32 fractional bits."""
    product = (q - grid_zero_point) * axis.multiplier
    scaled = _shift_round(product, axis.shift) if axis.shift > 0 else product * (1 << -axis.shift)
    return scaled + axis.offset


def _clip(coord: torch.Tensor, size: int) -> torch.Tensor:
    return coord.clamp(0, (size - 1) * _ONE)


def _reflect(coord: torch.Tensor, low: int, span: int) -> torch.Tensor:
    """Reflects over ``[low, low + span]`` as often as needed (``reflect``)."""
    folded = torch.remainder((coord - low).abs(), 2 * span)  # non-negative: fmod == remainder
    folded = torch.where(folded > span, 2 * span - folded, folded)
    return folded + low


def _apply_padding(
    coord: torch.Tensor, size: int, padding: str, align_corners: bool
) -> torch.Tensor:
    """Step 2."""
    if padding == "zeros":
        return coord
    if padding == "border":
        return _clip(coord, size)
    if align_corners:
        if size == 1:
            return torch.zeros_like(coord)
        return _clip(_reflect(coord, 0, (size - 1) * _ONE), size)
    return _clip(_reflect(coord, -_ONE // 2, size * _ONE), size)


def _round_half_even(coord: torch.Tensor) -> torch.Tensor:
    """Step 3, nearest: the pixel index, halves to even."""
    whole = coord >> COORD_FRAC_BITS
    fraction = coord & (_ONE - 1)
    up = (fraction > _ONE // 2) | ((fraction == _ONE // 2) & ((whole & 1) != 0))
    return whole + up.to(torch.int64)


def _weight_of(coord: torch.Tensor) -> torch.Tensor:
    """Step 3, bilinear: the upper tap's weight, 0 .. 2^15."""
    return _shift_round(coord & (_ONE - 1), COORD_FRAC_BITS - WEIGHT_BITS)


def _to_output(value: torch.Tensor, plan: IntegerPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5 on int64 values (15 fractional bits, image steps), as ``to_output``: the output
    (int8 or float32) and where step 5 did not clamp it."""
    if plan.float_output:
        scale = torch.tensor(plan.float_output_scale, dtype=torch.float32, device=value.device)
        return value.to(torch.float32) * scale, torch.ones_like(value, dtype=torch.bool)
    q = (
        _shift_round_half_even(value * plan.requant_multiplier, plan.requant_shift)
        + plan.output_zero_point
    )
    clamped = q.clamp(plan.output_min, plan.output_max)
    return clamped.to(torch.int8), q == clamped


# ---- tables: steps 1 to 3 depend on one grid value per axis, nearest's 4 and 5 on one pixel ----

# An offset no tap inside the image reaches (N * H * W < 2^40): marks a tap outside the image,
# which reads the extra pixel row holding the image zero point (v = 0, as the kernel reads it).
_OUTSIDE: Final = 1 << 40


@dataclass(frozen=True)
class _AxisKey:
    """What steps 1 to 3 of one axis depend on: the axis plan, the grid's zero point and dtype,
    the mode, padding and corner alignment, and the stride of the axis's pixels."""

    axis: AxisPlan
    grid_zero_point: int
    grid_dtype: torch.dtype
    mode: str
    padding: str
    align_corners: bool
    stride: int


def _axis_entries(q: torch.Tensor, key: _AxisKey) -> torch.Tensor:
    """Steps 1 to 3 of one axis for the int64 grid values ``q`` (1-D), one row each, int64:
    bilinear ``[offset of tap 0, offset of tap 1, weight of tap 1]``, nearest ``[offset]``; an
    offset is the tap's index times ``key.stride`` inside the image, ``_OUTSIDE`` outside it."""
    size = key.axis.size
    unnormalized = _unnormalize(q, key.grid_zero_point, key.axis)
    coord = _apply_padding(unnormalized, size, key.padding, key.align_corners)

    def offset(index: torch.Tensor) -> torch.Tensor:
        inside = (index >= 0) & (index < size)
        return torch.where(inside, index * key.stride, _OUTSIDE)

    if key.mode == "nearest":
        return offset(_round_half_even(coord)).unsqueeze(1)
    x0 = coord >> COORD_FRAC_BITS
    return torch.stack((offset(x0), offset(x0 + 1), _weight_of(coord)), 1)


@lru_cache(maxsize=64)  # at most 1.5 MiB each (int16 grids)
def _axis_table(key: _AxisKey, device: torch.device) -> torch.Tensor:
    """``_axis_entries`` of every value of the grid's dtype (row ``q - min``)."""
    info = torch.iinfo(key.grid_dtype)
    q = torch.arange(info.min, info.max + 1, dtype=torch.int64, device=device)
    return _axis_entries(q, key)


def _axis(values: torch.Tensor, key: _AxisKey) -> torch.Tensor:
    """``_axis_entries`` of the grid ``values`` (any shape; rows in their flattened order):
    looked up in the table of every value when there are at least a quarter as many values as
    the table has rows, else computed for these values alone (the same function)."""
    info = torch.iinfo(values.dtype)
    index = values.reshape(-1).to(torch.int64)
    if 4 * index.numel() < info.max - info.min + 1:
        return _axis_entries(index, key)
    return _axis_table(key, values.device).index_select(0, index.sub_(info.min))


@lru_cache(maxsize=256)  # 256 entries each
def _pixel_table(plan: IntegerPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest's steps 4 and 5 for every int8 pixel value (row ``q + 128``): the output and
    where step 5 did not clamp it. A tap outside the image reads the image zero point: v = 0."""
    raw = torch.arange(-128, 128, dtype=torch.int64, device=device)
    return _to_output((raw - plan.image_zero_point) * (1 << WEIGHT_BITS), plan)


@dataclass(frozen=True)
class _Requantization:
    """Step 5 of an int8 output as ``q = ((x + bias + ((x >> shift) & 1)) >> shift) + add``
    with ``x = raw * multiplier - offset`` (``raw``: the value plus the image zero point times
    2^15): equal as integers to ``shift_round_half_even(value * M, S) + zero_o``, since
    ``M = multiplier * 2^(S - shift)``, and ``(x + 2^(k-1) - 1 + parity) >> k`` is ``x / 2^k``
    rounded half to even. ``dtype`` int32 where every intermediate fits (the kernels' 32-bit
    form), else int64."""

    dtype: torch.dtype
    multiplier: int
    shift: int
    offset: int
    bias: int
    add: int


@lru_cache(maxsize=1024)
def _requantization(plan: IntegerPlan) -> _Requantization:
    multiplier, shift = plan.requant_multiplier, plan.requant_shift
    while multiplier % 2 == 0 and shift > 1:
        multiplier //= 2
        shift -= 1
    zero_i, zero_o = plan.image_zero_point, plan.output_zero_point
    offset = zero_i * (1 << WEIGHT_BITS) * multiplier
    # |raw|, |value| < 2^23; the sum below bounds every intermediate of the int32 form.
    bound = (1 << 23) * multiplier + abs(offset) + (1 << shift) * (abs(zero_o) + 2)
    if bound < 1 << 31:
        half = (1 << (shift - 1)) - 1 + zero_o * (1 << shift)
        return _Requantization(torch.int32, multiplier, shift, offset, half, 0)
    return _Requantization(torch.int64, multiplier, shift, offset, (1 << (shift - 1)) - 1, zero_o)


def _requantize_raw(
    raw: torch.Tensor, plan: IntegerPlan, with_mask: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step 5 on int32 ``raw`` values (value + image zero point * 2^15), which it overwrites:
    int8 or float32, and (``with_mask``) where step 5 did not clamp."""
    if plan.float_output:
        value = raw - plan.image_zero_point * (1 << WEIGHT_BITS)  # |value| < 2^24: exact
        scale = torch.tensor(plan.float_output_scale, dtype=torch.float32, device=raw.device)
        out = value.to(torch.float32).mul_(scale)
        return out, torch.ones_like(out, dtype=torch.bool) if with_mask else None
    form = _requantization(plan)
    x = raw.to(form.dtype).mul_(form.multiplier)
    if form.offset:
        x.sub_(form.offset)
    parity = (x >> form.shift).bitwise_and_(1)
    q = x.add_(form.bias).add_(parity).bitwise_right_shift_(form.shift)
    if form.add:
        q.add_(form.add)
    mask = ((q >= plan.output_min) & (q <= plan.output_max)) if with_mask else None
    return q.clamp_(plan.output_min, plan.output_max).to(torch.int8), mask


@dataclass(frozen=True)
class IntegerResult:
    """What ``sample`` computes: ``output`` (int8 or float32, N x C x Ho x Wo, the image's memory
    format) and ``in_range`` (bool, the same shape, or None when not asked for: False where step
    5 clamped an int8 output; all True for float32 output)."""

    output: torch.Tensor
    in_range: torch.Tensor | None


def _pixel_columns(image: torch.Tensor, dtype: torch.dtype, pad: int) -> torch.Tensor:
    """The image as C x (N * H * W + 1) values of ``dtype``: per channel every pixel of every
    batch element, and last ``pad`` (what a tap outside the image reads)."""
    n, channels, height, width = image.shape
    columns = torch.empty((channels, n * height * width + 1), dtype=dtype, device=image.device)
    columns[:, :-1].view(channels, n, height, width).copy_(image.permute(1, 0, 2, 3))
    columns[:, -1] = pad
    return columns


def _shaped(columns: torch.Tensor, image: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """C x N*Ho*Wo values as N x C x Ho x Wo in the image's memory format (the C++ output's
    strides)."""
    n, channels = image.shape[0], image.shape[1]
    view = columns.reshape(channels, n, out_h, out_w).permute(1, 0, 2, 3)
    memory_format = torch.channels_last if _is_channels_last(image) else torch.contiguous_format
    out = torch.empty(view.shape, dtype=columns.dtype, device=columns.device,
                      memory_format=memory_format)  # fmt: skip
    return out.copy_(view)


def sample(
    image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp, *, with_mask: bool = False
) -> IntegerResult:
    """``grid_sample``, and with ``with_mask`` where step 5 clamped; the operands are checked as
    ``grid_sample`` checks them.

    Written for speed in forms equal as integers to the contract's steps (each derivation
    beside it): steps 1 to 3 looked up per axis in a table of every grid value (computed by
    the steps themselves, once per op, size and device), tap offsets that send a tap outside
    the image to an extra pixel holding the image zero point (v = 0, as the kernel reads it),
    the channels in rows and the pixels in columns (so per-pixel weights broadcast along
    rows), step 4 in 32-bit lanes, step 5 in 32-bit lanes where it fits (``_Requantization``),
    and nearest's steps 4 and 5 a table of the 256 pixel values."""
    _check_operands(image, grid, op)
    n, channels, height, width = image.shape
    plan = integer_plan(op, height, width)
    out_h, out_w = grid.shape[1], grid.shape[2]
    device = image.device
    common = (plan.grid_zero_point, grid.dtype, op.mode, op.padding_mode, op.align_corners)
    tx = _axis(grid[..., 0], _AxisKey(plan.x, *common, 1))
    ty = _axis(grid[..., 1], _AxisKey(plan.y, *common, width))
    pad = n * height * width  # the zero point's column
    base = torch.arange(n, device=device, dtype=torch.int64).mul_(height * width).view(n, 1)

    def taps(columns: torch.Tensor, row: torch.Tensor, x_offset: torch.Tensor) -> torch.Tensor:
        # A tap outside along either axis has an offset of at least 2^40: the zero point.
        index = (row + x_offset).clamp_(max=pad)
        return torch.gather(columns, 1, index.expand(columns.shape[0], -1))

    if op.mode == "nearest":
        # Steps 4 and 5 depend on the tap's raw value alone: pick the raw value, then map it.
        table, in_range = _pixel_table(plan, device)
        raw = _pixel_columns(image, torch.int8, plan.image_zero_point)
        picked = taps(raw, (ty[:, 0].view(n, -1) + base).view(-1), tx[:, 0])
        index = picked.view(-1).to(torch.int64).add_(128)
        out = table.index_select(0, index).view(channels, -1)
        mask = in_range.index_select(0, index).view(channels, -1) if with_mask else None
    else:
        columns = _pixel_columns(image, torch.int32, plan.image_zero_point)
        row0 = (ty[:, 0].view(n, -1) + base).view(-1)
        row1 = (ty[:, 1].view(n, -1) + base).view(-1)
        t00, t01 = taps(columns, row0, tx[:, 0]), taps(columns, row0, tx[:, 1])
        t10, t11 = taps(columns, row1, tx[:, 0]), taps(columns, row1, tx[:, 1])
        wx = tx[:, 2].to(torch.int32).view(1, -1)
        wy = ty[:, 2].to(torch.int32).view(1, -1)
        # Step 4 on raw taps t = v + z (z, the image zero point, outside the image):
        # top' = t00 * 2^15 + (t01 - t00) * wx = top + z * 2^15, bottom' likewise, and
        # d = bottom' - top' = bottom - top. shift_round(top * 2^15 + d * wy, 15)
        # = top + floor((d * wy + 2^14) / 2^15), and with d = dh * 2^15 + dl (0 <= dl < 2^15)
        # = top + dh * wy + ((dl * wy + 2^14) >> 15): every term below 2^31.
        top = t01.sub_(t00).mul_(wx).add_(t00.mul_(1 << WEIGHT_BITS))
        bottom = t11.sub_(t10).mul_(wx).add_(t10.mul_(1 << WEIGHT_BITS))
        d = bottom.sub_(top)
        dl = (d & ((1 << WEIGHT_BITS) - 1)).mul_(wy).add_(1 << (WEIGHT_BITS - 1))
        raw_value = d.bitwise_right_shift_(WEIGHT_BITS).mul_(wy).add_(top)
        raw_value.add_(dl.bitwise_right_shift_(WEIGHT_BITS))  # value + z * 2^15
        out, mask = _requantize_raw(raw_value, plan, with_mask)
    return IntegerResult(
        _shaped(out, image, out_h, out_w),
        None if mask is None else _shaped(mask, image, out_h, out_w),
    )


def grid_sample(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """Samples the int8 ``image`` (N x C x H x W, any memory layout, any device) at the int16 or
    int8 ``grid`` (N x Ho x Wo x 2, on the image's device) as the quantized ``op`` says: int8
    output when ``op.output`` is set, float32 otherwise, in the image's memory format. The
    integer contract's bits: ``cpu.grid_sample(image, grid, op)`` for CPU tensors, the same
    bits on every device.

    Raises ``TypeError`` for an argument of the wrong type, ``ValueError`` naming the argument
    for a tensor of the wrong dtype, shape or device, and ``UnsupportedOpError`` (a
    ``ValueError``) for a configuration outside the contract, saying why."""
    return sample(image, grid, op).output


def grid_sample_steps(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.Tensor:
    """``grid_sample`` computed step by step as docs/contract.md writes it (int64 everywhere, no
    table, no rewritten form): the plainest statement of the contract in tensor ops, slower;
    the tests hold ``grid_sample`` to it and to the C++ kernel."""
    _check_operands(image, grid, op)
    n, channels, height, width = image.shape
    plan = integer_plan(op, height, width)
    q = grid.to(torch.int64)
    x = _apply_padding(
        _unnormalize(q[..., 0], plan.grid_zero_point, plan.x), width, op.padding_mode,
        op.align_corners,
    ).reshape(-1)  # fmt: skip
    y = _apply_padding(
        _unnormalize(q[..., 1], plan.grid_zero_point, plan.y), height, op.padding_mode,
        op.align_corners,
    ).reshape(-1)  # fmt: skip
    pixels = image.permute(0, 2, 3, 1).reshape(n * height * width, channels).to(torch.int64)
    base = torch.arange(n, device=image.device, dtype=torch.int64).repeat_interleave(
        grid.shape[1] * grid.shape[2]
    ) * (height * width)

    def v(ix: torch.Tensor, iy: torch.Tensor) -> torch.Tensor:
        valid = (ix >= 0) & (ix < width) & (iy >= 0) & (iy < height)
        index = torch.where(valid, base + iy * width + ix, 0)
        return (pixels.index_select(0, index) - plan.image_zero_point) * valid.unsqueeze(1)

    if op.mode == "nearest":
        value = v(_round_half_even(x), _round_half_even(y)) * (1 << WEIGHT_BITS)
    else:
        x0, y0 = x >> COORD_FRAC_BITS, y >> COORD_FRAC_BITS
        wx, wy = _weight_of(x).unsqueeze(1), _weight_of(y).unsqueeze(1)
        v00, v01, v10, v11 = v(x0, y0), v(x0 + 1, y0), v(x0, y0 + 1), v(x0 + 1, y0 + 1)
        top = v00 * (1 << WEIGHT_BITS) + (v01 - v00) * wx
        bottom = v10 * (1 << WEIGHT_BITS) + (v11 - v10) * wx
        value = _shift_round(top * (1 << WEIGHT_BITS) + (bottom - top) * wy, WEIGHT_BITS)
    out, _ = _to_output(value, plan)
    return _shaped(out.t(), image, grid.shape[1], grid.shape[2])


# ---- checks ----

_SHAPES: Final = {"image": "N x C x H x W", "grid": "N x Ho x Wo x 2"}


def _is_channels_last(image: torch.Tensor) -> bool:
    return (
        bool(image.is_contiguous(memory_format=torch.channels_last)) and not image.is_contiguous()
    )


def describe(op: GridSampleOp) -> str:
    """``op`` in one phrase, for messages."""
    return (
        f"GridSampleOp(mode={op.mode!r}, padding_mode={op.padding_mode!r}, "
        f"align_corners={op.align_corners})"
    )


def check_op(op: object) -> GridSampleOp:
    """Raises ``TypeError`` unless ``op`` is a ``GridSampleOp``, ``UnsupportedOpError`` (a
    ``ValueError``) saying which part of it the integer contract cannot mirror whatever the
    image's size (float operands, dtypes, the requantization ratio)."""
    if not isinstance(op, GridSampleOp):
        raise TypeError(
            f"op must be an etkit_gridsampler.GridSampleOp, got {type(op).__module__}."
            f"{type(op).__qualname__}; build one with GridSampleOp(mode=..., padding_mode=..., "
            "align_corners=..., image=QParams(...), grid=QParams(...), output=...)"
        )
    try:
        integer_plan(op, 1, 1)
    except UnsupportedOpError as error:
        raise UnsupportedOpError(
            f"op: the exact integer sampler cannot mirror {describe(op)}: {error}"
        ) from None
    return op


def check_tensor(value: object, name: str) -> torch.Tensor:
    """Raises unless ``value`` is a dense 4-D tensor with every size at least 1 (and, for the
    grid, 2 values last), naming ``name`` (``"image"`` or ``"grid"``)."""
    shape = _SHAPES[name]
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor ({shape}), got {type(value).__module__}."
            f"{type(value).__qualname__}"
        )
    if value.layout != torch.strided or value.is_nested:
        raise ValueError(f"{name} must be a dense (torch.strided) {shape} tensor")
    if value.dim() != 4 or (name == "grid" and value.shape[-1] != 2):
        raise ValueError(f"{name} must be {shape} (4-D), got shape {tuple(value.shape)}")
    if min(value.shape) < 1:
        raise ValueError(f"{name} must have every size at least 1 ({shape}), got shape "
                         f"{tuple(value.shape)}")  # fmt: skip
    return value


def check_pair(image: torch.Tensor, grid: torch.Tensor) -> None:
    """Raises ``ValueError`` unless ``image`` and ``grid`` share N and a device."""
    if grid.shape[0] != image.shape[0]:
        raise ValueError(
            f"image and grid must have the same batch size N, got image N = {image.shape[0]} "
            f"(shape {tuple(image.shape)}) and grid N = {grid.shape[0]} "
            f"(shape {tuple(grid.shape)})"
        )
    if grid.device != image.device:
        raise ValueError(
            f"grid must be on the image's device ({image.device}), got {grid.device}; move it "
            f"with grid.to({str(image.device)!r})"
        )


def _check_operands(image: object, grid: object, op: object) -> None:
    op = check_op(op)
    image_t, grid_t = check_tensor(image, "image"), check_tensor(grid, "grid")
    assert op.image is not None and op.grid is not None
    for name, tensor, qparams in (("image", image_t, op.image), ("grid", grid_t, op.grid)):
        if tensor.dtype != qparams.dtype:
            raise ValueError(
                f"{name} must be {qparams.dtype} (op.{name}.dtype), got {tensor.dtype}; "
                f"quantize it with qat.quantize({name}, op.{name}) first, or use "
                "qat.fake_quant_grid_sample for float tensors"
            )
    check_pair(image_t, grid_t)
    try:
        integer_plan(op, image_t.shape[2], image_t.shape[3])
    except UnsupportedOpError as error:
        raise UnsupportedOpError(
            f"op: the exact integer sampler cannot mirror {describe(op)} on a "
            f"{image_t.shape[2]} x {image_t.shape[3]} image: {error}"
        ) from None
