// The architecture-neutral plans of the vectorized kernels' forms (quantized_x86_common.h for the
// x86 kernels, quantized_neon.cpp for AArch64): what each kernel derives once per call, in plain
// integers, before it loads its registers. Each derivation is beside its code and gives the scalar
// steps' bits (quantized_steps.h). No intrinsics; needs __int128 (GCC, Clang), as both kernels
// do. Internal to the native library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "quantized.h"
#include "quantized_steps.h"

namespace etkit::gridsampler {

// Q = round(P / 2^17) (halves up) of a coordinate clamped to [-2, size] pixels: x0 = Q >> 15,
// w = Q & 0x7fff. Where the scalar weight is 2^15 (the upper tap alone), Q names the upper tap with
// weight 0: the same value, and 15-bit weights; and a coordinate clamped at -2 or size pixels has
// both taps outside the image either way (the value is 0).
inline int32_t scalar_tap(int64_t coord, int64_t size) {
  const int64_t clamped = std::min(std::max(coord, -2 * steps::kOne), size * steps::kOne);
  return static_cast<int32_t>(steps::shift_round(clamped, 17));
}

// The nearest pixel index of one axis (steps 2 and 3), the coordinate clamped to [-2, size + 1]
// pixels first (as AxisExact clamps it): outside stays outside, and the index fits 32 bits.
inline int32_t nearest_index(int64_t coord, int64_t size) {
  const int64_t clamped = std::min(std::max(coord, -2 * steps::kOne), (size + 1) * steps::kOne);
  return static_cast<int32_t>(steps::round_half_even(clamped));
}

// The table form (int8 grids): pass 1's result, Q (scalar_tap) or the nearest index
// (nearest_index), of each of the 256 grid values, per axis; table[v + 128] is grid value v's.
inline void fill_axis_tables(const QuantizedPlan& p, bool nearest, int32_t table_x[256],
                             int32_t table_y[256]) {
  for (int v = -128; v < 128; ++v) {
    const int64_t px = steps::pixel_coordinate(v, p, p.x);
    const int64_t py = steps::pixel_coordinate(v, p, p.y);
    table_x[v + 128] = nearest ? nearest_index(px, p.x.size) : scalar_tap(px, p.x.size);
    table_y[v + 128] = nearest ? nearest_index(py, p.y.size) : scalar_tap(py, p.y.size);
  }
}

// Steps 1 and 2 and the Q of step 3 (scalar_tap) for one axis of an int16 grid with zeros or
// border padding, in 64-bit integer lanes. With F = floor(P / 2^16) clamped to
// [0, (size - 1) * 2^16] (border) or [-2^17, size * 2^16] (zeros: both taps of the axis outside),
// Q = floor((F + 1) / 2); F = floor((d * M + R) / 2^K) + offset / 2^16 with d = q - zero,
// K = s + 16 and R = 2^(s-1) (0 when s <= 0), so Q = floor((q * M + C) / 2^S) with S = K + 1 and
// C = R - zero * M + (offset / 2^16 + 1) * 2^K, clamped to half the bounds of F (the map
// F -> floor((F + 1) / 2) is monotone and the bounds are even). Halving M and S together while M
// is even and halving C (floor) leaves Q unchanged, as q * M is an integer. It applies when
// M < 2^31 (one 32 x 32 -> 64-bit multiply), S <= 32 and Q stays below 2^30 in magnitude. (S may
// reach 0, where Q = q * M + C: the x86 kernels take it; quantized_neon.cpp asks for S >= 1.)
struct AxisInteger {
  bool applies;
  int32_t multiplier;
  int64_t constant;
  int shift;
  int32_t low, high;
};

inline AxisInteger plan_axis_integer(const AxisPlan& axis, int64_t grid_zero_point,
                                     Padding padding, bool int16_grid) {
  AxisInteger integer{};
  if (!int16_grid || padding == Padding::kReflection || axis.multiplier <= 0 ||
      axis.shift < -16 || axis.shift > 40) {
    return integer;
  }
  const int64_t k = axis.shift + 16;
  __int128 multiplier = axis.multiplier;
  __int128 constant = (axis.shift > 0 ? (static_cast<__int128>(1) << (axis.shift - 1)) : 0) +
                      ((static_cast<__int128>(axis.offset >> 16) + 1) << k) -
                      static_cast<__int128>(grid_zero_point) * multiplier;
  int64_t shift = k + 1;
  while (shift > 0 && (multiplier & 1) == 0) {
    multiplier >>= 1;
    constant >>= 1;  // an arithmetic shift: floor(C / 2)
    --shift;
  }
  const __int128 extreme = 32768 * multiplier + (constant < 0 ? -constant : constant);
  if (multiplier >= (static_cast<__int128>(1) << 31) || shift > 32 ||
      extreme >= (static_cast<__int128>(1) << 62) ||
      (extreme >> shift) >= (static_cast<__int128>(1) << 30)) {
    return integer;
  }
  integer.applies = true;
  integer.multiplier = static_cast<int32_t>(multiplier);
  integer.constant = static_cast<int64_t>(constant);
  integer.shift = static_cast<int>(shift);
  const bool border = padding == Padding::kBorder;
  integer.low = border ? 0 : -65536;
  integer.high = static_cast<int32_t>((border ? axis.size - 1 : axis.size) * 32768);
  return integer;
}

// The nearest pixel index of an int16 grid with zeros or border padding in the integer form:
// with G = P + 2^31 (offset + 2^31 = size * 2^31), round-half-up(P / 2^32) = floor(G / 2^32) and
// G = floor((q * M + C) / 2^s) (shift_round folded into C, as in AxisInteger), so the index
// rounded half up is floor(X / 2^S) with X = q * M + C, S = s + 32; P is a tie exactly when
// G mod 2^32 = 0, that is X mod 2^S < 2^s, and halves to even then take the index below when the
// one above is odd. Halving M, C (floor) and s together while M is even keeps both the quotient
// and the tie test (X = 2 X' + b: X mod 2^S < 2^s iff X' mod 2^(S-1) < 2^(s-1)); with s = 0, C
// must be even too. It applies when M < 2^31 and |X| < 2^62. The padding clamps the index
// (clip commutes with rounding to integers: both are monotone and the bounds are integers).
struct AxisNearest {
  bool applies;
  int32_t multiplier;
  int64_t constant;
  int shift;             // S
  int64_t tie_limit;     // 2^s
  int32_t low, high;     // the index clamp: [-2, size + 1] (zeros), [0, size - 1] (border)
};

inline AxisNearest plan_axis_nearest(const AxisPlan& axis, int64_t grid_zero_point,
                                     Padding padding) {
  AxisNearest nearest{};
  if (padding == Padding::kReflection || axis.multiplier < 0 || axis.shift > 62 ||
      axis.shift < -30) {
    return nearest;
  }
  __int128 multiplier = axis.multiplier;
  int64_t s = axis.shift;
  if (s < 0) {
    multiplier <<= -s;
    s = 0;
  }
  const __int128 g_offset = static_cast<__int128>(axis.size) << 31;  // offset + 2^31
  __int128 constant = (s > 0 ? (static_cast<__int128>(1) << (s - 1)) : 0) -
                      static_cast<__int128>(grid_zero_point) * multiplier + (g_offset << s);
  int64_t shift = s + 32;
  while (multiplier > 0 && (multiplier & 1) == 0) {
    if (s == 0 && (constant & 1) != 0) {
      break;
    }
    multiplier >>= 1;
    constant >>= 1;  // floor(C / 2)
    --shift;
    s = s > 0 ? s - 1 : 0;
  }
  const __int128 extreme = 32768 * multiplier + (constant < 0 ? -constant : constant);
  if (multiplier >= (static_cast<__int128>(1) << 31) || shift > 62 || shift < 1 ||
      extreme >= (static_cast<__int128>(1) << 62) || axis.size >= (int64_t(1) << 15)) {
    return nearest;
  }
  nearest.applies = true;
  nearest.multiplier = static_cast<int32_t>(multiplier);
  nearest.constant = static_cast<int64_t>(constant);
  nearest.shift = static_cast<int>(shift);
  nearest.tie_limit = int64_t(1) << s;
  const bool border = padding == Padding::kBorder;
  nearest.low = border ? 0 : -2;
  nearest.high = static_cast<int32_t>(border ? axis.size - 1 : axis.size + 1);
  return nearest;
}

// Steps 1 and 2 exactly as the scalar steps compute them, in 64-bit lanes, for any padding: then
// step 3's Q (bilinear, see scalar_tap) or the nearest pixel index (nearest_index). The lanes do
// the scalar operations themselves: P = shift_round(d * multiplier, s) + offset (or an exact left
// shift), d = q - zero for grid values q in [grid_min, grid_max], exact while
// |d| * multiplier < 2^62 (how a kernel forms the 64-bit product is its own: see its registers);
// the padding's clamp; and reflection's |P - low| mod 2 * span, whose span is a multiple of 2^32:
// with A = |P - low|, A mod (K * 2^32) = (floor(A / 2^32) mod K) * 2^32 + (A mod 2^32),
// K = 2 * span / 2^32, and floor(A / 2^32) < 2^25, so its quotient by K comes from one float64
// product, off by at most one and corrected. The clamp after the padding is the scalar clip
// (border, reflection), or for zeros [-2, size] pixels (bilinear, scalar_tap) and [-2, size + 1]
// (nearest): either way a tap that was outside stays outside.
struct AxisExact {
  bool applies;
  int64_t multiplier, round, offset, zero;
  int shift;  // > 0: shift_round by shift; <= 0: left shift by -shift
  bool reflect;
  int64_t reflect_low, span;
  int64_t period;  // K
  double inverse_period;
  int64_t low, high;  // the clamp after the padding
};

inline AxisExact plan_axis_exact(const AxisPlan& axis, int64_t grid_zero_point, Padding padding,
                                 bool align_corners, bool nearest, int64_t grid_min,
                                 int64_t grid_max) {
  AxisExact exact{};
  const int64_t one = steps::kOne;
  const __int128 max_d = std::max(std::llabs(grid_min - grid_zero_point),
                                  std::llabs(grid_max - grid_zero_point));
  const __int128 limit = static_cast<__int128>(1) << 62;
  if (axis.multiplier < 0 || axis.shift > 62 || axis.shift < -62 ||
      max_d * axis.multiplier >= limit ||
      (axis.shift < 0 && (max_d * axis.multiplier) >= (limit >> -axis.shift)) ||
      axis.size >= (int64_t(1) << 15)) {
    return exact;
  }
  exact.applies = true;
  exact.multiplier = axis.multiplier;
  exact.shift = static_cast<int>(axis.shift);
  exact.round = axis.shift > 0 ? int64_t(1) << (axis.shift - 1) : 0;
  exact.offset = axis.offset;
  exact.zero = grid_zero_point;
  const int64_t size = axis.size;
  exact.low = 0;
  exact.high = (size - 1) * one;
  if (padding == Padding::kZeros) {
    exact.low = -2 * one;
    exact.high = (nearest ? size + 1 : size) * one;
  } else if (padding == Padding::kReflection && !(align_corners && size == 1)) {
    // (align_corners with one pixel: the scalar steps give 0, as the clip to [0, 0] does)
    exact.reflect = true;
    exact.reflect_low = align_corners ? 0 : -one / 2;
    exact.span = (align_corners ? size - 1 : size) * one;
    exact.period = 2 * (align_corners ? size - 1 : size);
    exact.inverse_period = 1.0 / static_cast<double>(exact.period);
  }
  return exact;
}

// The requantization multiplier and shift reduced to M = m * 2^t, k - t, when m < 2^8 and
// k - t <= 24 (equal image and output scales, for example: m = 1, k - t = 15); then
// |value * m| + 2^(k-t-1) < 255 * 2^15 * 255 + 2^23 < 2^31 and step 5 (the scalar requantize,
// halves to even) stays in 32-bit lanes.
struct NarrowRequant {
  bool applies;
  int32_t multiplier;
  int64_t shift;
};

inline NarrowRequant narrow_requant(int64_t multiplier, int64_t shift) {
  while (multiplier > 0 && (multiplier & 1) == 0 && shift > 1) {
    multiplier >>= 1;
    --shift;
  }
  return {multiplier > 0 && multiplier < 256 && shift <= 24, static_cast<int32_t>(multiplier),
          shift};
}

}  // namespace etkit::gridsampler
