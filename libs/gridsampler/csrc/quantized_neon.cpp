// The vectorized AArch64 kernel of the integer contract (quantized_neon.h): Advanced SIMD, sixteen
// output pixels at a time, every step giving the bits of the scalar steps (quantized_steps.h); the
// comments say why each rewrite is exact.
//
// Each block of up to 256 output pixels (an output row, or several: rows that follow each other in
// the grid and in the output are one run, and small outputs run across batch elements) takes two
// passes:
//
// 1. Steps 1 to 3 of each axis, which do not depend on the channels: Q = round(P / 2^17) for
//    bilinear (x0 = Q >> 15, wx = Q & 0x7fff, as scalar_tap), the pixel index for nearest.
//    Int16 grids take the integer form (bilinear, zeros and border: one 32 x 32-bit product), the
//    nearest integer form (nearest, zeros and border) or the exact 64-bit form (any mode and
//    padding, reflection included), four grid values at a time; int8 grids read a table of the
//    scalar steps' result for each of the 256 grid values. (The exact form applies wherever the
//    grid's zero point lies within int16; configurations where it does not run the scalar
//    kernel.) The loop is quantized_pass1.h's, written once with the x86 kernels, over the Neon
//    traits below.
// 2. Per group of sixteen pixels: the taps, steps 4 and 5 and the stores. AArch64 has no gathers,
//    so each pixel's taps are copied into a staging buffer (its two rows as two slots of adjacent
//    taps; a tap outside the image reads the image zero point, so v = q - zero = 0 as the scalar
//    steps' zero weight gives), and the lanes are then de-interleaved by structure loads:
//    - planar images (NCHW, or one channel) and channels-last images of 2, 3 and 4 channels:
//      lanes are pixels, one channel at a time (the weights are those of the pixels, for every
//      channel), and the stores interleave the channels again (st2, st3, st4);
//    - 8 and multiples of 16 channels (channels-last): lanes are channels, one pixel at a time, the
//      pixel's weights broadcast from lanes;
//    - any other layout (channels-last images of 5, 6, 7, 9 .. 15 channels, ...): lanes are
//      pixels, one channel at a time, each tap read on its own and the outputs stored one by one;
//    - nearest, every layout: the source pixel's bytes (the image zero point where it is outside
//      the image) in output order, then step 5 as a 256-entry table of the scalar requantization
//      of each int8 value (tbl), or the float32 product.
//    Step 4 is exact in 16-bit products (see Taps), step 5 the halves-to-even shift of the
//    scalar requantize in 32-bit lanes where the multiplier is small, else in 64-bit lanes.
//
// The kinds, the set-up and the rows loop are quantized_core.h's, pass 1 and the nearest pass's
// walk quantized_pass1.h's and quantized_nearest.h's, shared with the x86 kernels.
#include "quantized_neon.h"

#if defined(__aarch64__)

#include <arm_neon.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "quantized_core.h"
#include "quantized_forms.h"
#include "quantized_steps.h"

namespace etkit::gridsampler {

namespace {

std::atomic<uint64_t> g_counters[kNeonCounterCount];

// The vector helpers are inlined into the blocks' loops, whatever the optimization level.
#define ETKIT_INLINE __attribute__((always_inline))

using core::Coordinates;
using core::Kind;
using core::kRun;               // pixels per block (pass 1)
constexpr int kGroup = 16;     // pixels per group (pass 2)

// NEON's coordinate forms (quantized_core.h): the integer form with S >= 1 only (S = 0 runs the
// exact form), the nearest integer form, and the exact form for int16 grid values with
// d = q - zero in 32-bit lanes (see ExactRegisters), which must apply (select_kind checks it, for
// int8 grids too, which read a table); no scalar fallback.
constexpr core::FormSet kFormSet{false, false, false, 1, -32768, 32767};

// Everything both passes need, derived once per call (quantized_core.h).
struct Setup : core::Setup {
  int8_t image_zero;
};

// Pass 1's result for a block, and each pixel's image plane.
struct Coords {
  alignas(16) int32_t x[kRun];
  alignas(16) int32_t y[kRun];
  alignas(16) int64_t plane[kRun];  // bytes from the image's start to the pixel's batch element
};

// ---- pass 1: the registers and taps of NEON's coordinate forms, four lanes each ----

struct IntegerRegisters {
  int32x4_t multiplier;
  int64x2_t constant, shift;  // shift: -S
  int32x4_t low, high;
};

IntegerRegisters integer_registers(const AxisInteger& a) {
  return {vdupq_n_s32(a.multiplier), vdupq_n_s64(a.constant), vdupq_n_s64(-a.shift),
          vdupq_n_s32(a.low), vdupq_n_s32(a.high)};
}

// Q of four grid values: an arithmetic shift is the floor; Q fits 31 bits, so the narrowing
// keeps it.
ETKIT_INLINE inline int32x4_t integer_tap(int32x4_t q, const IntegerRegisters& a) {
  const int64x2_t lo =
      vshlq_s64(vmlal_s32(a.constant, vget_low_s32(q), vget_low_s32(a.multiplier)), a.shift);
  const int64x2_t hi = vshlq_s64(vmlal_high_s32(a.constant, q, a.multiplier), a.shift);
  return vminq_s32(vmaxq_s32(vmovn_high_s64(vmovn_s64(lo), hi), a.low), a.high);
}

struct NearestRegisters {
  int32x4_t multiplier;
  int64x2_t constant, shift, below_shift, tie_limit;
  int32x4_t low, high;
};

NearestRegisters nearest_registers(const AxisNearest& a) {
  return {vdupq_n_s32(a.multiplier),
          vdupq_n_s64(a.constant),
          vdupq_n_s64(-a.shift),
          vdupq_n_s64(static_cast<int64_t>((uint64_t(1) << a.shift) - 1)),
          vdupq_n_s64(a.tie_limit),
          vdupq_n_s32(a.low),
          vdupq_n_s32(a.high)};
}

ETKIT_INLINE inline int64x2_t nearest_index2(int64x2_t x, const NearestRegisters& a) {
  const int64x2_t up = vshlq_s64(x, a.shift);
  const uint64x2_t tie = vcltq_s64(vandq_s64(x, a.below_shift), a.tie_limit);
  const int64x2_t odd = vandq_s64(up, vdupq_n_s64(1));
  return vsubq_s64(up, vandq_s64(odd, vreinterpretq_s64_u64(tie)));
}

// The nearest indexes of four grid values; the index is within 2^25 (coordinates are below 2^24
// pixels), so the narrowing keeps it.
ETKIT_INLINE inline int32x4_t nearest_tap(int32x4_t q, const NearestRegisters& a) {
  const int64x2_t lo =
      nearest_index2(vmlal_s32(a.constant, vget_low_s32(q), vget_low_s32(a.multiplier)), a);
  const int64x2_t hi = nearest_index2(vmlal_high_s32(a.constant, q, a.multiplier), a);
  return vminq_s32(vmaxq_s32(vmovn_high_s64(vmovn_s64(lo), hi), a.low), a.high);
}

// AxisExact in registers (plan_exact). Step 1's product d * multiplier (d = q - zero within 32
// bits, the product below 2^62) is formed from two 32 x 32-bit products: with
// multiplier = mh * 2^32 + ml, ml read as a signed 32-bit lo = ml - 2^32 * [ml >= 2^31], it is
// d * lo + (d * (mh + [ml >= 2^31])) * 2^32, summed modulo 2^64 (exact: the product is below
// 2^63). The shift is one rounding shift (srshl by -shift: a left shift where shift <= 0), which
// is shift_round.
struct ExactRegisters {
  int32x4_t multiplier_low, multiplier_high, zero;
  int64x2_t shift, offset, low, high;
  bool reflect;
  int64x2_t reflect_low, span, double_span, period64;
  uint32x2_t period;
  float64x2_t inverse_period;
};

ExactRegisters exact_registers(const AxisExact& a) {
  const uint64_t multiplier = static_cast<uint64_t>(a.multiplier);
  const uint32_t ml = static_cast<uint32_t>(multiplier & 0xffffffffu);
  return {vdupq_n_s32(static_cast<int32_t>(ml)),
          vdupq_n_s32(static_cast<int32_t>((multiplier >> 32) + (ml >> 31))),
          vdupq_n_s32(static_cast<int32_t>(a.zero)),
          vdupq_n_s64(-static_cast<int64_t>(a.shift)),
          vdupq_n_s64(a.offset),
          vdupq_n_s64(a.low),
          vdupq_n_s64(a.high),
          a.reflect,
          vdupq_n_s64(a.reflect_low),
          vdupq_n_s64(a.span),
          vdupq_n_s64(2 * a.span),
          vdupq_n_s64(a.period),
          vdup_n_u32(static_cast<uint32_t>(a.period)),
          vdupq_n_f64(a.inverse_period)};
}

// Steps 1 and 2 (the padding and its clamp) of two grid values, from their products' parts.
ETKIT_INLINE inline int64x2_t exact_coordinate2(int64x2_t low_product, int64x2_t high_product,
                                   const ExactRegisters& a) {
  const int64x2_t product = vaddq_s64(low_product, vshlq_n_s64(high_product, 32));
  int64x2_t p = vaddq_s64(vrshlq_s64(product, a.shift), a.offset);
  if (a.reflect) {
    const int64x2_t distance = vabsq_s64(vsubq_s64(p, a.reflect_low));
    const uint64x2_t whole = vshrq_n_u64(vreinterpretq_u64_s64(distance), 32);  // < 2^25
    const uint64x2_t quotient =
        vcvtq_u64_f64(vrndmq_f64(vmulq_f64(vcvtq_f64_u64(whole), a.inverse_period)));
    int64x2_t rest =
        vreinterpretq_s64_u64(vsubq_u64(whole, vmull_u32(vmovn_u64(quotient), a.period)));
    rest = vaddq_s64(rest, vandq_s64(vreinterpretq_s64_u64(vcltzq_s64(rest)), a.period64));
    rest = vsubq_s64(rest, vandq_s64(vreinterpretq_s64_u64(vcgeq_s64(rest, a.period64)),
                                     a.period64));
    int64x2_t folded = vorrq_s64(vshlq_n_s64(rest, 32),
                                 vandq_s64(distance, vdupq_n_s64(0xffffffffLL)));
    folded = vbslq_s64(vcgtq_s64(folded, a.span), vsubq_s64(a.double_span, folded), folded);
    p = vaddq_s64(folded, a.reflect_low);
  }
  p = vbslq_s64(vcgtq_s64(p, a.high), a.high, p);
  return vbslq_s64(vcltq_s64(p, a.low), a.low, p);
}

// Step 3 of two coordinates: Q (shift_round by 17, as scalar_tap) or the nearest index
// (round_half_even: halves up, then a tie, fraction 2^31, back to the even index).
template <bool kNearest>
ETKIT_INLINE inline int64x2_t exact_step3(int64x2_t p) {
  if constexpr (kNearest) {
    const int64x2_t up = vrshrq_n_s64(p, 32);
    const uint64x2_t tie =
        vceqq_s64(vandq_s64(p, vdupq_n_s64(0xffffffffLL)), vdupq_n_s64(int64_t(1) << 31));
    return vsubq_s64(up, vandq_s64(vandq_s64(up, vdupq_n_s64(1)), vreinterpretq_s64_u64(tie)));
  } else {
    return vrshrq_n_s64(p, 17);
  }
}

template <bool kNearest>
ETKIT_INLINE inline int32x4_t exact_tap(int32x4_t q, const ExactRegisters& a) {
  const int32x4_t d = vsubq_s32(q, a.zero);
  const int64x2_t lo = exact_coordinate2(
      vmull_s32(vget_low_s32(d), vget_low_s32(a.multiplier_low)),
      vmull_s32(vget_low_s32(d), vget_low_s32(a.multiplier_high)), a);
  const int64x2_t hi = exact_coordinate2(vmull_high_s32(d, a.multiplier_low),
                                         vmull_high_s32(d, a.multiplier_high), a);
  return vmovn_high_s64(vmovn_s64(exact_step3<kNearest>(lo)), exact_step3<kNearest>(hi));
}

// ---- pass 1: quantized_pass1.h, written once with the x86 kernels, over these traits ----

// Eight lanes as two 4-lane halves: one structure load (vld2q) of eight int16 (x, y) pairs
// de-interleaves them, and each half of an axis is one widening. No gathers: int8 grids read their
// tables one pixel at a time. Pass 2 reads whole groups of sixteen lanes, so pass 1 writes the
// lanes up to the next group (kPadTo).
struct Neon {
  static constexpr int kLanes = 8;
  static constexpr int kPadTo = kGroup;
  static constexpr int kNearestGroup = kGroup;  // nearest: pixels per group
  static constexpr int kNearestPlanes = 4;       // planar: channel planes per walk
  static constexpr bool kNearestStrided = true;  // nearest of any layout
  static constexpr bool kStagedRaw = false;      // nearest: step 5 per sixteen raw bytes
  static constexpr bool kGathers = false;
  struct I {
    int32x4_t low, high;
  };

  ETKIT_INLINE static I load(const int32_t* values) {
    return {vld1q_s32(values), vld1q_s32(values + 4)};
  }
  ETKIT_INLINE static void store(int32_t* values, I v) {
    vst1q_s32(values, v.low);
    vst1q_s32(values + 4, v.high);
  }

  // (x, y) pairs of int16 grids (int8 grids read a table), eight at a time: the loads are not
  // masked, so the block's last pixels (fewer than eight) are staged. Pairs: grid_x is 2; the
  // address grid + i * grid_x is the staged loads' own, so one pointer serves both.
  static constexpr bool kPairLoads = true;
  static constexpr bool kPairLoadsMasked = false;
  template <typename GridT>
  ETKIT_INLINE static void load_pairs_xy(const GridT* grid, int64_t grid_x, int64_t i, int64_t,
                                         I* gx, I* gy) {
    static_assert(std::is_same_v<GridT, int16_t>, "int8 grids read a table (no grid loads)");
    const int16x8x2_t xy = vld2q_s16(grid + i * grid_x);
    *gx = {vmovl_s16(vget_low_s16(xy.val[0])), vmovl_high_s16(xy.val[0])};
    *gy = {vmovl_s16(vget_low_s16(xy.val[1])), vmovl_high_s16(xy.val[1])};
  }
  template <typename GridT>
  static I load_pairs(const GridT*, int64_t, int64_t);  // (no split form)

  // A form's registers for axis 0 (x) or 1 (y) (the table form reads the set-up's tables).
  template <Coordinates kForm>
  static auto registers(const Setup& s, int axis) {
    if constexpr (kForm == Coordinates::kInteger) {
      return integer_registers(axis == 0 ? s.integer_x : s.integer_y);
    } else if constexpr (kForm == Coordinates::kNearest) {
      return nearest_registers(axis == 0 ? s.nearest_x : s.nearest_y);
    } else if constexpr (kForm == Coordinates::kExact) {
      return exact_registers(axis == 0 ? s.exact_x : s.exact_y);
    } else {
      return 0;
    }
  }

  // The form's Q (bilinear) or nearest index of four grid values.
  template <Coordinates kForm, bool kNearest, typename Registers>
  ETKIT_INLINE static int32x4_t tap4(int32x4_t q, const Registers& r) {
    if constexpr (kForm == Coordinates::kInteger) {
      return integer_tap(q, r);
    } else if constexpr (kForm == Coordinates::kNearest) {
      return nearest_tap(q, r);
    } else {
      static_assert(kForm == Coordinates::kExact, "NEON's vector forms: integer, nearest, exact");
      return exact_tap<kNearest>(q, r);
    }
  }
  template <Coordinates kForm, bool kNearest, typename Registers>
  ETKIT_INLINE static I tap(I g, const Registers& r) {
    return {tap4<kForm, kNearest>(g.low, r), tap4<kForm, kNearest>(g.high, r)};
  }

  // The nearest and exact forms: each half stored as it is computed (tap_store) rather than both
  // axes computed, then stored. Their registers (7 and 13 vectors per axis) and an axis' result
  // held over the other's computation spilled: 0.6 more instructions per pixel for the exact form
  // (nearest sampling), 0.3 for the nearest form. The integer form's loop is the shorter as is.
  template <Coordinates kForm>
  static constexpr bool kStoreEachAxis = kForm != Coordinates::kInteger;
  template <Coordinates kForm, bool kNearest, typename Registers>
  ETKIT_INLINE static void tap_store(I g, const Registers& r, int32_t* out) {
    vst1q_s32(out, tap4<kForm, kNearest>(g.low, r));
    vst1q_s32(out + 4, tap4<kForm, kNearest>(g.high, r));
  }

  // NEON's forms (kFormSet): no split or float64 forms, no scalar steps.
  template <typename GridT, typename Body>
  static void with_form(Coordinates form, bool nearest, const Body& body) {
    using C = Coordinates;
    core::with_form<GridT, C::kTable, C::kInteger, C::kNearest, C::kExact>(form, nearest, body);
  }
};

namespace neon {
using V = Neon;
#define ETKIT_TARGET
#include "quantized_pass1.h"
#undef ETKIT_TARGET
}  // namespace neon

// ---- pass 2: shared pieces ----

// One run of output pixels: what the second pass needs besides the block.
struct Run {
  const int8_t* image;        // the image's first element (Coords::plane is from here)
  void* out;                  // the run's first output pixel (OutT)
  int64_t output_c, output_x;  // output strides, elements
};

// Step 5's constants in registers.
struct Finish {
  bool narrow, unit;
  int32x4_t narrow_multiplier, narrow_shift;  // m, -(k - t)
  int32x4_t wide_multiplier;
  int64x2_t wide_shift;  // -k
  bool zero_point;       // the output zero point is not 0
  int16x8_t output_zero;
  int8x16_t output_min, output_max;
  bool clamp;
  float32x4_t float_scale;
  int8x16_t image_zero;
  bool identity_table;
  uint8x16x4_t table[4];  // output_table, 64 entries each
};

Finish finish_registers(const Setup& s) {
  Finish f;
  f.narrow = s.narrow.applies;
  f.unit = s.narrow.multiplier == 1;
  f.narrow_multiplier = vdupq_n_s32(s.narrow.multiplier);
  f.narrow_shift = vdupq_n_s32(static_cast<int32_t>(-s.narrow.shift));
  f.wide_multiplier = vdupq_n_s32(static_cast<int32_t>(s.wide_multiplier));
  f.wide_shift = vdupq_n_s64(-s.wide_shift);
  f.zero_point = s.output_zero_point != 0;
  f.output_zero = vdupq_n_s16(static_cast<int16_t>(s.output_zero_point));
  f.output_min = vdupq_n_s8(s.output_min);
  f.output_max = vdupq_n_s8(s.output_max);
  f.clamp = s.output_min > -128 || s.output_max < 127;
  f.float_scale = vdupq_n_f32(s.float_scale);
  f.image_zero = vdupq_n_s8(s.image_zero);
  f.identity_table = s.identity_table;
  for (int k = 0; k < 4; ++k) {
    f.table[k] = vld1q_u8_x4(s.output_table + 64 * k);
  }
  return f;
}

// shift_round_half_even(x, k) = (x + 2^(k-1) - 1 + b) >> k with b = bit k of x: below the half the
// sum stays below the next multiple of 2^k, above it passes it, and at the half it does when
// x / 2^k is odd. That is the rounding shift (srshl: (y + 2^(k-1)) >> k) of y = x - (1 - b), and
// 1 - b = ~(x >> k) & 1.
ETKIT_INLINE inline int32x4_t round_half_even32(int32x4_t x, int32x4_t shift) {
  const int32x4_t not_odd = vbicq_s32(vdupq_n_s32(1), vshlq_s32(x, shift));
  return vrshlq_s32(vsubq_s32(x, not_odd), shift);
}

ETKIT_INLINE inline int64x2_t round_half_even64(int64x2_t x, int64x2_t shift) {
  const int64x2_t not_odd = vbicq_s64(vdupq_n_s64(1), vshlq_s64(x, shift));
  return vrshlq_s64(vsubq_s64(x, not_odd), shift);
}

// Step 5 for four values of step 4 (int8 output), without the output zero point: the product
// value * M (|value| <= 255 * 2^15), shifted with halves to even; |q| <= 255 * 32.
ETKIT_INLINE inline int32x4_t requantize4(int32x4_t value, const Finish& f) {
  if (f.narrow) {
    const int32x4_t x = f.unit ? value : vmulq_s32(value, f.narrow_multiplier);
    return round_half_even32(x, f.narrow_shift);
  }
  const int64x2_t lo = round_half_even64(
      vmull_s32(vget_low_s32(value), vget_low_s32(f.wide_multiplier)), f.wide_shift);
  const int64x2_t hi = round_half_even64(vmull_high_s32(value, f.wide_multiplier), f.wide_shift);
  return vmovn_high_s64(vmovn_s64(lo), hi);
}

// Requantized values to int8: plus the zero point, then the clamp. The saturations (to int16,
// then int8) only move values that lie outside the output range (within int8) anyway.
ETKIT_INLINE inline int16x8_t plus_zero_point(int32x4_t q0, int32x4_t q1, const Finish& f) {
  const int16x8_t q = vqmovn_high_s32(vqmovn_s32(q0), q1);
  return f.zero_point ? vqaddq_s16(q, f.output_zero) : q;
}

ETKIT_INLINE inline int8x8_t to_bytes8(int32x4_t v0, int32x4_t v1, const Finish& f) {
  int8x8_t bytes = vqmovn_s16(plus_zero_point(requantize4(v0, f), requantize4(v1, f), f));
  if (f.clamp) {
    bytes = vmin_s8(vmax_s8(bytes, vget_low_s8(f.output_min)), vget_low_s8(f.output_max));
  }
  return bytes;
}

// Four values of step 4 (sixteen lanes).
struct Values16 {
  int32x4_t v0, v1, v2, v3;
};

ETKIT_INLINE inline int8x16_t to_bytes16(const Values16& v, const Finish& f) {
  const int16x8_t a = plus_zero_point(requantize4(v.v0, f), requantize4(v.v1, f), f);
  const int16x8_t b = plus_zero_point(requantize4(v.v2, f), requantize4(v.v3, f), f);
  int8x16_t bytes = vqmovn_high_s16(vqmovn_s16(a), b);
  if (f.clamp) {
    bytes = vminq_s8(vmaxq_s8(bytes, f.output_min), f.output_max);
  }
  return bytes;
}

// to_output<float>: static_cast<float>(value) * scale (value below 2^24: exact).
ETKIT_INLINE inline float32x4_t to_float(int32x4_t value, const Finish& f) {
  return vmulq_f32(vcvtq_f32_s32(value), f.float_scale);
}

// Step 4, exactly, in 16-bit products. With the taps v = q - zero (0 outside the image),
// a = v01 - v00, e = v10 - v00, b = v11 - v10 - v01 + v00, the scalar value
// shift_round((top << 15) + (bottom - top) * wy, 15) is
//   v00 * 2^15 + a * wx + e * wy + shift_round(b * wx * wy, 15)
// since top << 15 + (bottom - top) * wy = 2^15 (v00 * 2^15 + a * wx + e * wy) + b * wx * wy; and
// with wx * wy = h * 2^15 + l, shift_round(b * wx * wy, 15) = b * h + ((b * l + 2^14) >> 15), the
// last term one rounding doubling multiply (sqrdmulh: (2 b l + 2^15) >> 16, no saturation as
// |b| <= 510). |a|, |e| <= 255, the weights, h and l below 2^15: every factor fits 16 bits, every
// sum 32 bits. a, e and b are differences of raw taps (the zero point cancels).
struct Taps {
  int16x8_t v00, a, e, b;
};

ETKIT_INLINE inline Taps taps_low(int8x16_t q00, int8x16_t q01, int8x16_t q10, int8x16_t q11,
                     int8x16_t zero) {
  const int16x8_t a = vsubl_s8(vget_low_s8(q01), vget_low_s8(q00));
  return {vsubl_s8(vget_low_s8(q00), vget_low_s8(zero)), a,
          vsubl_s8(vget_low_s8(q10), vget_low_s8(q00)),
          vsubq_s16(vsubl_s8(vget_low_s8(q11), vget_low_s8(q10)), a)};
}

ETKIT_INLINE inline Taps taps_high(int8x16_t q00, int8x16_t q01, int8x16_t q10, int8x16_t q11,
                      int8x16_t zero) {
  const int16x8_t a = vsubl_high_s8(q01, q00);
  return {vsubl_high_s8(q00, zero), a, vsubl_high_s8(q10, q00),
          vsubq_s16(vsubl_high_s8(q11, q10), a)};
}

// The weights of eight lanes.
struct Weights8 {
  int16x8_t wx, wy, h, l;
};

// Eight lanes, weights per lane.
ETKIT_INLINE inline void step4_lanes(const Taps& t, const Weights8& w, int32x4_t* low, int32x4_t* high) {
  const int16x8_t cross = vqrdmulhq_s16(t.b, w.l);
  int32x4_t lo = vshll_n_s16(vget_low_s16(t.v00), kWeightBits);
  lo = vmlal_s16(lo, vget_low_s16(t.a), vget_low_s16(w.wx));
  lo = vmlal_s16(lo, vget_low_s16(t.e), vget_low_s16(w.wy));
  lo = vmlal_s16(lo, vget_low_s16(t.b), vget_low_s16(w.h));
  *low = vaddw_s16(lo, vget_low_s16(cross));
  int32x4_t hi = vshll_high_n_s16(t.v00, kWeightBits);
  hi = vmlal_high_s16(hi, t.a, w.wx);
  hi = vmlal_high_s16(hi, t.e, w.wy);
  hi = vmlal_high_s16(hi, t.b, w.h);
  *high = vaddw_high_s16(hi, cross);
}

// Sixteen pixels (lanes) of one channel.
struct Weights16 {
  Weights8 low, high;
};

ETKIT_INLINE inline Values16 step4_pixels(int8x16_t q00, int8x16_t q01, int8x16_t q10, int8x16_t q11,
                             int8x16_t zero, const Weights16& w) {
  Values16 v;
  step4_lanes(taps_low(q00, q01, q10, q11, zero), w.low, &v.v0, &v.v1);
  step4_lanes(taps_high(q00, q01, q10, q11, zero), w.high, &v.v2, &v.v3);
  return v;
}

// Eight or sixteen channels (lanes) of one pixel, its weights broadcast.
ETKIT_INLINE inline Weights8 broadcast(const int16_t* weights) {
  const int16x4_t w = vld1_s16(weights);
  return {vdupq_lane_s16(w, 0), vdupq_lane_s16(w, 1), vdupq_lane_s16(w, 2),
          vdupq_lane_s16(w, 3)};
}

// The weights of sixteen pixels from their Q: wx, wy < 2^15 (the low halves of Q, masked),
// wx * wy = h * 2^15 + l.
ETKIT_INLINE inline Weights8 weights8(int32x4_t qx0, int32x4_t qx1, int32x4_t qy0, int32x4_t qy1) {
  const int16x8_t mask = vdupq_n_s16(0x7fff);
  const int16x8_t wx =
      vandq_s16(vuzp1q_s16(vreinterpretq_s16_s32(qx0), vreinterpretq_s16_s32(qx1)), mask);
  const int16x8_t wy =
      vandq_s16(vuzp1q_s16(vreinterpretq_s16_s32(qy0), vreinterpretq_s16_s32(qy1)), mask);
  const int32x4_t lo = vmull_s16(vget_low_s16(wx), vget_low_s16(wy));  // below 2^30
  const int32x4_t hi = vmull_high_s16(wx, wy);
  return {wx, wy, vshrn_high_n_s32(vshrn_n_s32(lo, kWeightBits), hi, kWeightBits),
          vandq_s16(vuzp1q_s16(vreinterpretq_s16_s32(lo), vreinterpretq_s16_s32(hi)), mask)};
}

// Per group of sixteen pixels: their weights, and the offsets of their top-left taps (x0, y0)
// within their plane, or -1 where a tap is outside the image (x0 outside [0, width - 2] or y0
// outside [0, height - 2]).
struct BilinearGroup {
  Weights16 weights;
  alignas(16) int32_t off[kGroup];
};

// (Per-group constants: the image's last x0 and y0 and its strides, in lanes.)
struct GroupConstants {
  bool taps;  // width and height at least 2 (else no pixel has all its taps inside)
  uint32x4_t last_x0, last_y0;
  int32x4_t stride_x, stride_y;
};

ETKIT_INLINE inline GroupConstants group_constants(const Setup& s) {
  return {s.width >= 2 && s.height >= 2, vdupq_n_u32(static_cast<uint32_t>(s.width - 2)),
          vdupq_n_u32(static_cast<uint32_t>(s.height - 2)),
          vdupq_n_s32(static_cast<int32_t>(s.stride_x)),
          vdupq_n_s32(static_cast<int32_t>(s.stride_y))};
}

ETKIT_INLINE inline int32x4_t tap_offsets(int32x4_t qx, int32x4_t qy, const GroupConstants& k) {
  const int32x4_t x0 = vshrq_n_s32(qx, kWeightBits), y0 = vshrq_n_s32(qy, kWeightBits);
  const uint32x4_t inside = vandq_u32(vcleq_u32(vreinterpretq_u32_s32(x0), k.last_x0),
                                      vcleq_u32(vreinterpretq_u32_s32(y0), k.last_y0));
  const int32x4_t offset = vmlaq_s32(vmulq_s32(x0, k.stride_x), y0, k.stride_y);
  return vorrq_s32(offset, vreinterpretq_s32_u32(vmvnq_u32(inside)));
}

ETKIT_INLINE inline void bilinear_group(const int32_t* qx, const int32_t* qy, const GroupConstants& k,
                           BilinearGroup* g) {
  const int32x4_t x0 = vld1q_s32(qx), x1 = vld1q_s32(qx + 4), x2 = vld1q_s32(qx + 8),
                  x3 = vld1q_s32(qx + 12);
  const int32x4_t y0 = vld1q_s32(qy), y1 = vld1q_s32(qy + 4), y2 = vld1q_s32(qy + 8),
                  y3 = vld1q_s32(qy + 12);
  g->weights.low = weights8(x0, x1, y0, y1);
  g->weights.high = weights8(x2, x3, y2, y3);
  if (!k.taps) {
    const int32x4_t none = vdupq_n_s32(-1);
    vst1q_s32_x4(g->off, (int32x4x4_t{{none, none, none, none}}));
    return;
  }
  vst1q_s32_x4(g->off, (int32x4x4_t{{tap_offsets(x0, y0, k), tap_offsets(x1, y1, k),
                                     tap_offsets(x2, y2, k), tap_offsets(x3, y3, k)}}));
}

// One row of a pixel's taps, (x0, y) and (x0 + 1, y), `bytes` each, into `slot`: a tap outside the
// image reads the image zero point.
ETKIT_INLINE inline void edge_slot(const int8_t* plane, int32_t x0, int32_t y, int bytes, const Setup& s,
                      uint8_t* slot) {
  std::memset(slot, static_cast<uint8_t>(s.image_zero), 2 * static_cast<size_t>(bytes));
  if (y < 0 || y >= s.height) {
    return;
  }
  for (int t = 0; t < 2; ++t) {
    const int32_t x = x0 + t;
    if (x >= 0 && x < s.width) {
      std::memcpy(slot + t * bytes, plane + y * s.stride_y + x * s.stride_x,
                  static_cast<size_t>(bytes));
    }
  }
}

// Stores sixteen channels-last pixels of kC channels (kC = 1: one plane), `n` of them; lanes of
// channel k in `values[k]`.
template <int kC>
ETKIT_INLINE inline void store_pixels(const int8x16_t* values, int8_t* out, int n) {
  int8_t staged[kGroup * kC];
  int8_t* const to = n == kGroup ? out : staged;
  if constexpr (kC == 1) {
    vst1q_s8(to, values[0]);
  } else if constexpr (kC == 2) {
    vst2q_s8(to, (int8x16x2_t{{values[0], values[1]}}));
  } else if constexpr (kC == 3) {
    vst3q_s8(to, (int8x16x3_t{{values[0], values[1], values[2]}}));
  } else {
    vst4q_s8(to, (int8x16x4_t{{values[0], values[1], values[2], values[3]}}));
  }
  if (n < kGroup) {
    std::memcpy(out, staged, static_cast<size_t>(n) * kC);
  }
}

template <int kC>
ETKIT_INLINE inline void store_pixels(const float32x4_t (*values)[4], float* out, int n) {
  float staged[kGroup * kC];
  float* const to = n == kGroup ? out : staged;
  for (int q = 0; q < 4; ++q) {
    float* const at = to + 4 * q * kC;
    if constexpr (kC == 1) {
      vst1q_f32(at, values[0][q]);
    } else if constexpr (kC == 2) {
      vst2q_f32(at, (float32x4x2_t{{values[0][q], values[1][q]}}));
    } else if constexpr (kC == 3) {
      vst3q_f32(at, (float32x4x3_t{{values[0][q], values[1][q], values[2][q]}}));
    } else {
      vst4q_f32(at, (float32x4x4_t{{values[0][q], values[1][q], values[2][q], values[3][q]}}));
    }
  }
  if (n < kGroup) {
    std::memcpy(out, staged, static_cast<size_t>(n) * kC * sizeof(float));
  }
}

// Stores `n` values of one channel, one per pixel, `stride` elements apart.
ETKIT_INLINE inline void store_strided(int8x16_t values, int8_t* out, int64_t stride, int n) {
  int8_t staged[kGroup];
  vst1q_s8(staged, values);
  for (int j = 0; j < n; ++j) {
    out[j * stride] = staged[j];
  }
}

ETKIT_INLINE inline void store_strided(const float32x4_t values[4], float* out, int64_t stride, int n) {
  float staged[kGroup];
  for (int q = 0; q < 4; ++q) {
    vst1q_f32(staged + 4 * q, values[q]);
  }
  for (int j = 0; j < n; ++j) {
    out[j * stride] = staged[j];
  }
}

template <typename OutT>
ETKIT_INLINE inline void store_values(const Values16& v, const Finish& f, OutT* out, int64_t stride, int n,
                         bool strided) {
  if constexpr (std::is_same_v<OutT, int8_t>) {
    const int8x16_t bytes = to_bytes16(v, f);
    if (strided) {
      store_strided(bytes, out, stride, n);
    } else {
      store_pixels<1>(&bytes, out, n);
    }
  } else {
    const float32x4_t values[1][4] = {
        {to_float(v.v0, f), to_float(v.v1, f), to_float(v.v2, f), to_float(v.v3, f)}};
    if (strided) {
      store_strided(values[0], out, stride, n);
    } else {
      store_pixels<1>(values, out, n);
    }
  }
}

// ---- pass 2, bilinear, lanes of pixels: planar images and any layout, one plane at a time ----

// Each pixel's two rows of taps are copied as 2-byte slots [x0, x0 + 1], up to kPlanes planes (or
// channels) per visit of the pixel; ld2 takes them apart into the x0 and x0 + 1 taps of sixteen
// pixels. kStrided (any layout): a tap's two columns lie stride_x apart and the outputs output_x.
template <int kPlanes, bool kStrided, bool kBatched>
ETKIT_INLINE inline uint64_t stage_planes(const Coords& c, int64_t i, int n, const BilinearGroup& g,
                             const int8_t* image, const Setup& s,
                             uint8_t (*upper)[2 * kGroup], uint8_t (*lower)[2 * kGroup]) {
  const int64_t stride_c = s.stride_c, stride_y = s.stride_y, stride_x = kStrided ? s.stride_x : 1;
  const int8_t* const first_plane = image + c.plane[i];
  uint64_t edges = 0;
  int j = 0;
  if constexpr (!kBatched && !kStrided) {
    // four pixels at a time while their taps are all inside
    const auto copy = [&](int k) ETKIT_INLINE {
      const int8_t* const tap = first_plane + g.off[k];
#pragma GCC unroll 4
      for (int p = 0; p < kPlanes; ++p) {
        std::memcpy(upper[p] + 2 * k, tap + p * stride_c, 2);
        std::memcpy(lower[p] + 2 * k, tap + p * stride_c + stride_y, 2);
      }
    };
    for (; j + 4 <= n && vminvq_s32(vld1q_s32(g.off + j)) >= 0; j += 4) {
      copy(j);
      copy(j + 1);
      copy(j + 2);
      copy(j + 3);
    }
  }
  for (; j < n; ++j) {
    const int8_t* const plane = kBatched ? image + c.plane[i + j] : first_plane;
    const int32_t off = g.off[j];
    if (off >= 0) {
      const int8_t* const tap = plane + off;
#pragma GCC unroll 4
      for (int p = 0; p < kPlanes; ++p) {
        const int8_t* const at = tap + p * stride_c;
        if constexpr (kStrided) {
          upper[p][2 * j] = static_cast<uint8_t>(at[0]);
          upper[p][2 * j + 1] = static_cast<uint8_t>(at[stride_x]);
          lower[p][2 * j] = static_cast<uint8_t>(at[stride_y]);
          lower[p][2 * j + 1] = static_cast<uint8_t>(at[stride_y + stride_x]);
        } else {
          std::memcpy(upper[p] + 2 * j, at, 2);
          std::memcpy(lower[p] + 2 * j, at + stride_y, 2);
        }
      }
    } else {
      ++edges;
      const int32_t x0 = c.x[i + j] >> kWeightBits, y0 = c.y[i + j] >> kWeightBits;
      for (int p = 0; p < kPlanes; ++p) {
        edge_slot(plane + p * stride_c, x0, y0, 1, s, upper[p] + 2 * j);
        edge_slot(plane + p * stride_c, x0, y0 + 1, 1, s, lower[p] + 2 * j);
      }
    }
  }
  return edges;
}

template <typename OutT, bool kStrided>
__attribute__((noinline)) void bilinear_planes_block(const Coords& c, int64_t count,
                                                     const Setup& s, const Finish& finish,
                                                     const Run& r, int64_t first,
                                                     uint64_t* edge_pixels) {
  const Finish f = finish;  // a local copy: no output store can alias it
  constexpr int kPlanes = 4;  // planes staged per visit of a pixel
  const int64_t planes = s.channels;
  // (the lanes past a run's end compute from what earlier groups left: not stored)
  alignas(16) uint8_t upper[kPlanes][2 * kGroup] = {}, lower[kPlanes][2 * kGroup] = {};
  const GroupConstants constants = group_constants(s);
  BilinearGroup g;
  uint64_t edges = 0;
  for (int64_t i = 0; i < count; i += kGroup) {
    const int n = static_cast<int>(std::min<int64_t>(kGroup, count - i));
    bilinear_group(c.x + i, c.y + i, constants, &g);
    const bool batched = c.plane[i] != c.plane[i + n - 1];
    for (int64_t ch0 = 0; ch0 < planes; ch0 += kPlanes) {
      const int8_t* const image = r.image + ch0 * s.stride_c;
      const int chunk = static_cast<int>(std::min<int64_t>(kPlanes, planes - ch0));
      uint64_t staged_edges;
      if (chunk == kPlanes) {
        staged_edges =
            batched ? stage_planes<kPlanes, kStrided, true>(c, i, n, g, image, s, upper, lower)
                    : stage_planes<kPlanes, kStrided, false>(c, i, n, g, image, s, upper, lower);
      } else {
        for (int p = 0; p < chunk; ++p) {
          staged_edges = batched ? stage_planes<1, kStrided, true>(c, i, n, g, image + p * s.stride_c,
                                                                   s, upper + p, lower + p)
                                 : stage_planes<1, kStrided, false>(
                                       c, i, n, g, image + p * s.stride_c, s, upper + p, lower + p);
        }
      }
      if (ch0 == 0) {
        edges += staged_edges;
      }
      for (int p = 0; p < chunk; ++p) {
        const int8x16x2_t u = vld2q_s8(reinterpret_cast<const int8_t*>(upper[p]));
        const int8x16x2_t d = vld2q_s8(reinterpret_cast<const int8_t*>(lower[p]));
        const Values16 v = step4_pixels(u.val[0], u.val[1], d.val[0], d.val[1], f.image_zero,
                                        g.weights);
        OutT* const out =
            static_cast<OutT*>(r.out) + (first + i) * r.output_x + (ch0 + p) * r.output_c;
        store_values(v, f, out, r.output_x, n, kStrided);
      }
    }
  }
  *edge_pixels += edges;
}

// ---- pass 2, bilinear, lanes of pixels: 2, 3 and 4 channels-last ----

// Each pixel's two rows of taps are copied as slots of 2 * kC bytes (8 for 3 channels, the last
// two unused): [x0 channels | x0 + 1 channels]. Structure loads take them apart: 2 channels, ld4
// of 4-byte slots gives each channel's x0 and x0 + 1 taps of sixteen pixels; 3 and 4 channels, ld4
// of 8-byte slots (eight pixels) gives, in byte k of each 4-byte half, the x0 and x0 + 1 taps
// alternating, and uzp1 / uzp2 of two such (sixteen pixels) separate them.
template <int kC, bool kBatched>
ETKIT_INLINE inline uint64_t stage_pixels(const Coords& c, int64_t i, int n, const BilinearGroup& g,
                             const int8_t* image, const Setup& s, uint8_t* upper,
                             uint8_t* lower) {
  constexpr int kSlot = kC == 2 ? 4 : 8;
  const int64_t stride_y = s.stride_y;
  const int8_t* const first_plane = image + c.plane[i];
  uint64_t edges = 0;
  int j = 0;
  if constexpr (!kBatched) {
    // four pixels at a time while their taps are all inside
    const auto copy = [&](int k) ETKIT_INLINE {
      std::memcpy(upper + kSlot * k, first_plane + g.off[k], 2 * kC);
      std::memcpy(lower + kSlot * k, first_plane + g.off[k] + stride_y, 2 * kC);
    };
    for (; j + 4 <= n && vminvq_s32(vld1q_s32(g.off + j)) >= 0; j += 4) {
      copy(j);
      copy(j + 1);
      copy(j + 2);
      copy(j + 3);
    }
  }
  for (; j < n; ++j) {
    const int8_t* const plane = kBatched ? image + c.plane[i + j] : first_plane;
    const int32_t off = g.off[j];
    if (off >= 0) {
      std::memcpy(upper + kSlot * j, plane + off, 2 * kC);
      std::memcpy(lower + kSlot * j, plane + off + stride_y, 2 * kC);
    } else {
      ++edges;
      const int32_t x0 = c.x[i + j] >> kWeightBits, y0 = c.y[i + j] >> kWeightBits;
      edge_slot(plane, x0, y0, kC, s, upper + kSlot * j);
      edge_slot(plane, x0, y0 + 1, kC, s, lower + kSlot * j);
    }
  }
  return edges;
}

// Step 5 of one channel's sixteen pixels, into the lanes store_pixels takes.
template <typename OutT>
struct Outputs;

template <>
struct Outputs<int8_t> {
  int8x16_t values[4];
  ETKIT_INLINE void set(int k, const Values16& v, const Finish& f) {
    values[k] = to_bytes16(v, f);
  }
  template <int kC>
  ETKIT_INLINE void store(int8_t* out, int n) const {
    store_pixels<kC>(values, out, n);
  }
};

template <>
struct Outputs<float> {
  float32x4_t values[4][4];
  ETKIT_INLINE void set(int k, const Values16& v, const Finish& f) {
    values[k][0] = to_float(v.v0, f);
    values[k][1] = to_float(v.v1, f);
    values[k][2] = to_float(v.v2, f);
    values[k][3] = to_float(v.v3, f);
  }
  template <int kC>
  ETKIT_INLINE void store(float* out, int n) const {
    store_pixels<kC>(values, out, n);
  }
};

template <int kC, typename OutT>
__attribute__((noinline)) void bilinear_pixels_block(const Coords& c, int64_t count,
                                                     const Setup& s, const Finish& finish,
                                                     const Run& r, int64_t first,
                                                     uint64_t* edge_pixels) {
  const Finish f = finish;  // a local copy: no output store can alias it
  constexpr int kSlot = kC == 2 ? 4 : 8;
  // (the lanes past a run's end compute from what earlier groups left: not stored)
  alignas(16) uint8_t upper[kGroup * kSlot] = {}, lower[kGroup * kSlot] = {};
  const GroupConstants constants = group_constants(s);
  BilinearGroup g;
  uint64_t edges = 0;
  for (int64_t i = 0; i < count; i += kGroup) {
    const int n = static_cast<int>(std::min<int64_t>(kGroup, count - i));
    bilinear_group(c.x + i, c.y + i, constants, &g);
    edges += c.plane[i] != c.plane[i + n - 1]
                 ? stage_pixels<kC, true>(c, i, n, g, r.image, s, upper, lower)
                 : stage_pixels<kC, false>(c, i, n, g, r.image, s, upper, lower);
    const int8x16_t zero = f.image_zero;
    Outputs<OutT> out;
    const auto channel = [&](int k, int8x16_t q00, int8x16_t q01, int8x16_t q10,
                             int8x16_t q11) ETKIT_INLINE {
      out.set(k, step4_pixels(q00, q01, q10, q11, zero, g.weights), f);
    };
    if constexpr (kC == 2) {
      const int8x16x4_t u = vld4q_s8(reinterpret_cast<const int8_t*>(upper));
      const int8x16x4_t d = vld4q_s8(reinterpret_cast<const int8_t*>(lower));
      channel(0, u.val[0], u.val[2], d.val[0], d.val[2]);
      channel(1, u.val[1], u.val[3], d.val[1], d.val[3]);
    } else {
      const int8x16x4_t ua = vld4q_s8(reinterpret_cast<const int8_t*>(upper));
      const int8x16x4_t ub = vld4q_s8(reinterpret_cast<const int8_t*>(upper + 64));
      const int8x16x4_t da = vld4q_s8(reinterpret_cast<const int8_t*>(lower));
      const int8x16x4_t db = vld4q_s8(reinterpret_cast<const int8_t*>(lower + 64));
      if constexpr (kC == 4) {
        channel(0, vuzp1q_s8(ua.val[0], ub.val[0]), vuzp2q_s8(ua.val[0], ub.val[0]),
                vuzp1q_s8(da.val[0], db.val[0]), vuzp2q_s8(da.val[0], db.val[0]));
        channel(1, vuzp1q_s8(ua.val[1], ub.val[1]), vuzp2q_s8(ua.val[1], ub.val[1]),
                vuzp1q_s8(da.val[1], db.val[1]), vuzp2q_s8(da.val[1], db.val[1]));
        channel(2, vuzp1q_s8(ua.val[2], ub.val[2]), vuzp2q_s8(ua.val[2], ub.val[2]),
                vuzp1q_s8(da.val[2], db.val[2]), vuzp2q_s8(da.val[2], db.val[2]));
        channel(3, vuzp1q_s8(ua.val[3], ub.val[3]), vuzp2q_s8(ua.val[3], ub.val[3]),
                vuzp1q_s8(da.val[3], db.val[3]), vuzp2q_s8(da.val[3], db.val[3]));
      } else {  // slot bytes: x0 c0, c1, c2, x1 c0, c1, c2, -, -
        channel(0, vuzp1q_s8(ua.val[0], ub.val[0]), vuzp1q_s8(ua.val[3], ub.val[3]),
                vuzp1q_s8(da.val[0], db.val[0]), vuzp1q_s8(da.val[3], db.val[3]));
        channel(1, vuzp1q_s8(ua.val[1], ub.val[1]), vuzp2q_s8(ua.val[0], ub.val[0]),
                vuzp1q_s8(da.val[1], db.val[1]), vuzp2q_s8(da.val[0], db.val[0]));
        channel(2, vuzp1q_s8(ua.val[2], ub.val[2]), vuzp2q_s8(ua.val[1], ub.val[1]),
                vuzp1q_s8(da.val[2], db.val[2]), vuzp2q_s8(da.val[1], db.val[1]));
      }
    }
    out.template store<kC>(static_cast<OutT*>(r.out) + (first + i) * kC, n);
  }
  *edge_pixels += edges;
}

// ---- pass 2, bilinear, lanes of channels: 8 and multiples of 16 channels-last ----

// 8 channels: each row's two taps are one 16-byte load [x0 | x0 + 1]. 16k channels: each tap's
// sixteen channels at a time. The pixel's weights [wx, wy, h, l] are broadcast from lanes.
template <bool kSixteens, typename OutT>
__attribute__((noinline)) void bilinear_channels_block(const Coords& c, int64_t count,
                                                       const Setup& s, const Finish& finish,
                                                       const Run& r, int64_t first,
                                                       uint64_t* edge_pixels) {
  const Finish f = finish;  // a local copy: no output store can alias it
  const int64_t channels = s.channels, stride_x = s.stride_x, stride_y = s.stride_y;
  const int8x16_t zero = f.image_zero;
  alignas(16) int16_t weights[kGroup][4];
  alignas(16) int8_t zeros[16];
  vst1q_s8(zeros, zero);
  const GroupConstants constants = group_constants(s);
  BilinearGroup g;
  uint64_t edges = 0;
  for (int64_t i = 0; i < count; i += kGroup) {
    const int n = static_cast<int>(std::min<int64_t>(kGroup, count - i));
    bilinear_group(c.x + i, c.y + i, constants, &g);
    const Weights16& w = g.weights;
    vst4q_s16(weights[0], (int16x8x4_t{{w.low.wx, w.low.wy, w.low.h, w.low.l}}));
    vst4q_s16(weights[8], (int16x8x4_t{{w.high.wx, w.high.wy, w.high.h, w.high.l}}));
    for (int j = 0; j < n; ++j) {
      const Weights8 weight = broadcast(weights[j]);
      const int8_t* const plane = r.image + c.plane[i + j];
      OutT* const out = static_cast<OutT*>(r.out) + (first + i + j) * channels;
      const int32_t off = g.off[j];
      if constexpr (!kSixteens) {
        alignas(16) uint8_t slots[2][16];
        int8x16_t upper, lower;
        if (off >= 0) {
          upper = vld1q_s8(plane + off);
          lower = vld1q_s8(plane + off + stride_y);
        } else {
          ++edges;
          const int32_t x0 = c.x[i + j] >> kWeightBits, y0 = c.y[i + j] >> kWeightBits;
          edge_slot(plane, x0, y0, 8, s, slots[0]);
          edge_slot(plane, x0, y0 + 1, 8, s, slots[1]);
          upper = vreinterpretq_s8_u8(vld1q_u8(slots[0]));
          lower = vreinterpretq_s8_u8(vld1q_u8(slots[1]));
        }
        // lanes: the eight channels of x0 | of x0 + 1
        const int8x16_t q00 = upper, q01 = vextq_s8(upper, upper, 8);
        const int8x16_t q10 = lower, q11 = vextq_s8(lower, lower, 8);
        int32x4_t v0, v1;
        step4_lanes(taps_low(q00, q01, q10, q11, zero), weight, &v0, &v1);
        if constexpr (std::is_same_v<OutT, int8_t>) {
          vst1_s8(out, to_bytes8(v0, v1, f));
        } else {
          vst1q_f32(out, to_float(v0, f));
          vst1q_f32(out + 4, to_float(v1, f));
        }
      } else {
        // the four taps, or the zero point's bytes where outside
        const int8_t* tap[4];
        bool inside[4];
        if (off >= 0) {
          tap[0] = plane + off;
          tap[1] = tap[0] + stride_x;
          tap[2] = tap[0] + stride_y;
          tap[3] = tap[2] + stride_x;
          inside[0] = inside[1] = inside[2] = inside[3] = true;
        } else {
          ++edges;
          const int32_t x0 = c.x[i + j] >> kWeightBits, y0 = c.y[i + j] >> kWeightBits;
          for (int t = 0; t < 4; ++t) {
            const int32_t x = x0 + (t & 1), y = y0 + (t >> 1);
            inside[t] = x >= 0 && x < s.width && y >= 0 && y < s.height;
            tap[t] = inside[t] ? plane + y * stride_y + x * stride_x : zeros;
          }
        }
        const Weights16 both{weight, weight};
        for (int64_t h = 0; h < channels; h += 16) {
          const Values16 v = step4_pixels(
              vld1q_s8(inside[0] ? tap[0] + h : zeros), vld1q_s8(inside[1] ? tap[1] + h : zeros),
              vld1q_s8(inside[2] ? tap[2] + h : zeros), vld1q_s8(inside[3] ? tap[3] + h : zeros),
              zero, both);
          if constexpr (std::is_same_v<OutT, int8_t>) {
            vst1q_s8(out + h, to_bytes16(v, f));
          } else {
            vst1q_f32(out + h, to_float(v.v0, f));
            vst1q_f32(out + h + 4, to_float(v.v1, f));
            vst1q_f32(out + h + 8, to_float(v.v2, f));
            vst1q_f32(out + h + 12, to_float(v.v3, f));
          }
        }
      }
    }
  }
  *edge_pixels += edges;
}

// ---- pass 2, nearest ----

// Nearest, step 5: sixteen raw image values to their int8 outputs by the table (tbl reads 64
// entries; the index less 64, 128, 192 picks the other three quarters, out of range elsewhere).
ETKIT_INLINE inline int8x16_t table_lookup(int8x16_t raw, const Finish& f) {
  if (f.identity_table) {
    return raw;
  }
  const uint8x16_t index = vreinterpretq_u8_s8(raw);
  uint8x16_t out = vqtbl4q_u8(f.table[0], index);
  out = vqtbx4q_u8(out, f.table[1], vsubq_u8(index, vdupq_n_u8(64)));
  out = vqtbx4q_u8(out, f.table[2], vsubq_u8(index, vdupq_n_u8(128)));
  out = vqtbx4q_u8(out, f.table[3], vsubq_u8(index, vdupq_n_u8(192)));
  return vreinterpretq_s8_u8(out);
}

// Nearest, float output: value = (q - zero) * 2^15, exact in float32; one product, as
// to_output<float>.
ETKIT_INLINE inline void raw_to_float(int8x16_t raw, const Finish& f, float32x4_t values[4]) {
  const int16x8_t low = vsubl_s8(vget_low_s8(raw), vget_low_s8(f.image_zero));
  const int16x8_t high = vsubl_high_s8(raw, f.image_zero);
  values[0] = to_float(vshll_n_s16(vget_low_s16(low), kWeightBits), f);
  values[1] = to_float(vshll_high_n_s16(low, kWeightBits), f);
  values[2] = to_float(vshll_n_s16(vget_low_s16(high), kWeightBits), f);
  values[3] = to_float(vshll_high_n_s16(high, kWeightBits), f);
}

// Nearest: sixteen raw values to the output (the first `n` stored).
template <typename OutT>
ETKIT_INLINE inline void store_raw16(int8x16_t raw, const Finish& f, OutT* out, int64_t n) {
  if constexpr (std::is_same_v<OutT, int8_t>) {
    const int8x16_t bytes = table_lookup(raw, f);
    if (n >= 16) {
      vst1q_s8(out, bytes);
    } else {
      int8_t staged[16];
      vst1q_s8(staged, bytes);
      std::memcpy(out, staged, static_cast<size_t>(n));
    }
  } else {
    float32x4_t values[4];
    raw_to_float(raw, f, values);
    if (n >= 16) {
      for (int k = 0; k < 4; ++k) {
        vst1q_f32(out + 4 * k, values[k]);
      }
    } else {
      float staged[16];
      for (int k = 0; k < 4; ++k) {
        vst1q_f32(staged + 4 * k, values[k]);
      }
      std::memcpy(out, staged, static_cast<size_t>(n) * sizeof(float));
    }
  }
}

// ---- pass 2, nearest: NEON's part of the shared pass (quantized_nearest.h) ----

ETKIT_INLINE inline Finish nearest_step5(const Setup& s) { return finish_registers(s); }

// The image's bounds and strides in registers, and its zero point in every byte.
struct NearestBounds {
  uint32x4_t width, height;
  int32x4_t stride_x, stride_y;
  int8x16_t zero16;
  uint8_t zero;  // (read once: the output's bytes may alias the set-up)
};

ETKIT_INLINE inline NearestBounds nearest_bounds(const Setup& s) {
  return {vdupq_n_u32(static_cast<uint32_t>(s.width)),
          vdupq_n_u32(static_cast<uint32_t>(s.height)),
          vdupq_n_s32(static_cast<int32_t>(s.stride_x)),
          vdupq_n_s32(static_cast<int32_t>(s.stride_y)),
          vdupq_n_s8(s.image_zero),
          static_cast<uint8_t>(s.image_zero)};
}

// A group of sixteen pixels (pass 1 wrote every lane of it: kPadTo): the offsets of their source
// pixels within their plane, or -1 outside.
struct NearestGroup {
  alignas(16) int32_t off[kGroup];
  const int8_t* element;  // the first pixel's batch element in the image
  bool one_element;       // every pixel's
};

ETKIT_INLINE inline NearestGroup nearest_group(const Coords& c, int64_t i, int64_t n,
                                               const NearestBounds& b, const Run& r) {
  NearestGroup g;
  g.element = r.image + c.plane[i];
  g.one_element = c.plane[i] == c.plane[i + n - 1];
  for (int k = 0; k < kGroup; k += 4) {
    const int32x4_t x = vld1q_s32(c.x + i + k), y = vld1q_s32(c.y + i + k);
    const uint32x4_t inside = vandq_u32(vcltq_u32(vreinterpretq_u32_s32(x), b.width),
                                        vcltq_u32(vreinterpretq_u32_s32(y), b.height));
    const int32x4_t offset = vmlaq_s32(vmulq_s32(x, b.stride_x), y, b.stride_y);
    vst1q_s32(g.off + k, vorrq_s32(offset, vreinterpretq_s32_u32(vmvnq_u32(inside))));
  }
  return g;
}

// Any layout: one channel plane, `channel` bytes into the image; the outputs output_x apart.
template <typename OutT>
ETKIT_INLINE inline void nearest_strided(const NearestGroup& g, const NearestBounds& b,
                                         const Coords& c, int64_t i, int n, const Run& r,
                                         int64_t channel, const Finish& f, OutT* out) {
  const int32_t* const off = g.off;
  const int8_t* const image = r.image + channel;
  alignas(16) uint8_t staged[kGroup];
  for (int j = 0; j < n; ++j) {
    staged[j] = off[j] >= 0 ? static_cast<uint8_t>(image[c.plane[i + j] + off[j]]) : b.zero;
  }
  const int8x16_t raw = vld1q_s8(reinterpret_cast<const int8_t*>(staged));
  if constexpr (std::is_same_v<OutT, int8_t>) {
    store_strided(table_lookup(raw, f), out, r.output_x, n);
  } else {
    float32x4_t values[4];
    raw_to_float(raw, f, values);
    store_strided(values, out, r.output_x, n);
  }
}

// Channels-last images of kC = 2, 3, 4 or 8 channels: the group's n pixels' bytes (the image
// zero point outside) copied in output order (for int8 output with the identity table, straight
// into the output), then step 5.
template <int kC, typename OutT>
ETKIT_INLINE inline void nearest_channels_last(const NearestGroup& g, const NearestBounds& b,
                                               const Coords& c, int64_t i, int n, const Run& r,
                                               const Finish& f, OutT* out) {
  const int32_t* const off = g.off;
  alignas(16) uint8_t staged[kGroup * kC];
  const bool direct = std::is_same_v<OutT, int8_t> && f.identity_table;
  uint8_t* const to = direct ? reinterpret_cast<uint8_t*>(out) : staged;
  int j = 0;
  if (g.one_element) {
    // one batch element: four pixels at a time while they are all inside
    const int8_t* const plane = g.element;
    const auto copy = [&](int k) ETKIT_INLINE { std::memcpy(to + kC * k, plane + off[k], kC); };
    for (; j + 4 <= n && vminvq_s32(vld1q_s32(off + j)) >= 0; j += 4) {
      copy(j);
      copy(j + 1);
      copy(j + 2);
      copy(j + 3);
    }
  }
  for (; j < n; ++j) {
    if (off[j] >= 0) {
      std::memcpy(to + kC * j, r.image + c.plane[i + j] + off[j], kC);
    } else {
      std::memset(to + kC * j, b.zero, kC);
    }
  }
  if (!direct) {
    const int64_t bytes = int64_t(n) * kC;
    for (int64_t k = 0; k < bytes; k += 16) {
      store_raw16(vld1q_s8(reinterpret_cast<const int8_t*>(staged + k)), f, out + k, bytes - k);
    }
  }
}

// What the shared pass asks of a group: its pixels' bytes, kC each (channels-last), or one plane
// of any layout (kStrided, kC = 1: nearest_strided).
template <int kC, bool kStrided, typename OutT>
ETKIT_INLINE inline void nearest_pixels(const NearestGroup& g, const NearestBounds& b,
                                        const Coords& c, int64_t i, int64_t count, const Setup&,
                                        const Run& r, int64_t channel, const Finish& f,
                                        OutT* out) {
  const int n = static_cast<int>(count);
  if constexpr (kStrided) {
    static_assert(kC == 1, "any layout's pass reads one byte a pixel");
    nearest_strided(g, b, c, i, n, r, channel, f, out);
  } else {
    nearest_channels_last<kC>(g, b, c, i, n, r, f, out);
  }
}

// Planar images: kPlanes channel planes from `channel` bytes into the image, each pixel's offset
// read once for all of them, copied (for int8 output with the identity table, straight into the
// output); then step 5 per plane, the outputs output_c apart.
template <int kPlanes, typename OutT>
ETKIT_INLINE inline void nearest_plane_bytes(const NearestGroup& g, const NearestBounds& b,
                                             const Coords& c, int64_t i, int n, const Run& r,
                                             int64_t channel, int64_t stride_c, int64_t output_c,
                                             const Finish& f, OutT* out) {
  const int32_t* const off = g.off;
  alignas(16) uint8_t staged[kPlanes][kGroup];
  const bool direct = std::is_same_v<OutT, int8_t> && f.identity_table;
  uint8_t* to[kPlanes];
  for (int p = 0; p < kPlanes; ++p) {
    to[p] = direct ? reinterpret_cast<uint8_t*>(out + p * output_c) : staged[p];
  }
  const auto copy = [&](const int8_t* source, int k) ETKIT_INLINE {
    for (int p = 0; p < kPlanes; ++p) {
      to[p][k] = static_cast<uint8_t>(source[p * stride_c]);
    }
  };
  int j = 0;
  if (g.one_element) {
    // one batch element: four pixels at a time while they are all inside (four rounds at most,
    // each its own exit: GCC unrolls them)
    const int8_t* const plane = g.element + channel;
    for (int round = 0; round < kGroup / 4; ++round, j += 4) {
      if (j + 4 > n || vminvq_s32(vld1q_s32(off + j)) < 0) {
        break;
      }
      copy(plane + off[j], j);
      copy(plane + off[j + 1], j + 1);
      copy(plane + off[j + 2], j + 2);
      copy(plane + off[j + 3], j + 3);
    }
  }
  const int8_t* const image = r.image + channel;
  for (; j < n; ++j) {
    if (off[j] >= 0) {
      copy(image + c.plane[i + j] + off[j], j);
    } else {
      for (int p = 0; p < kPlanes; ++p) {
        to[p][j] = b.zero;
      }
    }
  }
  if (!direct) {
    for (int p = 0; p < kPlanes; ++p) {
      store_raw16(vld1q_s8(reinterpret_cast<const int8_t*>(staged[p])), f, out + p * output_c, n);
    }
  }
}

// Planar images: planes ch .. ch + planes - 1 (at most kNearestPlanes) together.
template <typename OutT>
ETKIT_INLINE inline void nearest_planes(const NearestGroup& g, const NearestBounds& b,
                                        const Coords& c, int64_t i, int64_t count, const Setup& s,
                                        const Run& r, int64_t ch, int64_t planes, const Finish& f,
                                        OutT* out) {
  const int n = static_cast<int>(count);
  const int64_t stride_c = s.stride_c, output_c = r.output_c;  // (before any output store)
  const int64_t channel = ch * stride_c;
  switch (planes) {
    case 1:
      return nearest_plane_bytes<1>(g, b, c, i, n, r, channel, stride_c, output_c, f, out);
    case 2:
      return nearest_plane_bytes<2>(g, b, c, i, n, r, channel, stride_c, output_c, f, out);
    case 3:
      return nearest_plane_bytes<3>(g, b, c, i, n, r, channel, stride_c, output_c, f, out);
    default:
      return nearest_plane_bytes<4>(g, b, c, i, n, r, channel, stride_c, output_c, f, out);
  }
}

// 16k channels: each pixel's first byte, or the image zero point outside.
struct NearestSources {
  const int32_t* off;
  const int64_t* plane;
  const int8_t* image;
  ETKIT_INLINE int8x16_t raw16(int64_t j, int64_t h, const NearestBounds& b) const {
    return off[j] >= 0 ? vld1q_s8(image + plane[j] + off[j] + h) : b.zero16;
  }
};

ETKIT_INLINE inline NearestSources nearest_sources(const NearestGroup& g, const Coords& c,
                                                   int64_t i, const Run& r) {
  return {g.off, c.plane + i, r.image};
}

template <typename Raw>
void store_bytes16(int8_t*, Raw);  // (none: NEON does not stage raw bytes, kStagedRaw)

namespace neon {
#define ETKIT_TARGET
#include "quantized_nearest.h"
#undef ETKIT_TARGET
}  // namespace neon

// ---- the driver ----

// Which second pass applies, if any (see neon_kernel_applies): every layout's own kind.
template <typename OutT>
bool select_kind(const View4<const int8_t>& image, const View4<OutT>& output,
                 const QuantizedPlan& plan, Kind* kind) {
  const core::Layout l = core::layout_of(image, output);
  const int64_t* const is = image.strides;
  // the offsets of a plane's pixels, y * stride_y + x * stride_x, in 32-bit lanes
  if (!core::vector_limits_hold<OutT>(l, plan) ||
      l.height * is[2] + l.width * is[3] >= (int64_t(1) << 31)) {
    return false;
  }
  // steps 1 and 2 in vector lanes: the exact form must apply to int16 grids (it does wherever
  // the grid's zero point lies within int16); int8 grids read a table
  const bool nearest = plan.params.mode == Mode::kNearest;
  for (const AxisPlan* axis : {&plan.x, &plan.y}) {
    if (!core::plan_exact<int16_t>(*axis, plan, nearest, kFormSet).applies) {
      return false;
    }
  }
  *kind = core::natural_kind(l, nearest);
  return true;
}

template <typename GridT, typename OutT>
void make_setup(const View4<const int8_t>& image, const View4<const GridT>& grid,
                const QuantizedPlan& p, Kind kind, Setup* s) {
  core::make_setup<GridT, OutT>(image, grid, p, kind, kFormSet, s);
  s->image_zero = static_cast<int8_t>(p.image_zero_point);
}

// The counter of a coordinate form.
int form_counter(Coordinates form) {
  switch (form) {
    case Coordinates::kInteger:
      return kNeonCoordinatesInteger;
    case Coordinates::kNearest:
      return kNeonCoordinatesNearest;
    case Coordinates::kTable:
      return kNeonCoordinatesTable;
    default:
      return kNeonCoordinatesExact;
  }
}

template <typename OutT>
void second_pass(const Coords& c, int64_t block, const Setup& s, const Finish& f, const Run& run,
                 int64_t first, uint64_t* edge_pixels) {
  switch (s.kind) {
    case Kind::kPlanar:
      bilinear_planes_block<OutT, false>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kStrided:
      bilinear_planes_block<OutT, true>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kPairs:
      bilinear_pixels_block<2, OutT>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kTriples:
      bilinear_pixels_block<3, OutT>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kQuads:
      bilinear_pixels_block<4, OutT>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kEights:
      bilinear_channels_block<false, OutT>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kSixteens:
      bilinear_channels_block<true, OutT>(c, block, s, f, run, first, edge_pixels);
      return;
    case Kind::kNearPlanar:
    case Kind::kNearStrided:
    case Kind::kNear2:
    case Kind::kNear3:
    case Kind::kNear4:
    case Kind::kNear8:
    case Kind::kNear16:
      neon::nearest_pass<OutT>(c, block, s, run, first);
      return;
    case Kind::kChannels:  // (x86 only)
      return;
  }
}

template <typename GridT, typename OutT>
void rows_neon(const View4<const int8_t>& image, const View4<const GridT>& grid,
               const View4<OutT>& output, const QuantizedPlan& plan, Kind kind, int64_t row_begin,
               int64_t row_end) {
  const QuantizedPlan p = plan;
  Setup s;
  make_setup<GridT, OutT>(image, grid, p, kind, &s);
  const Finish f = finish_registers(s);
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  const int64_t image_n = image.strides[0];
  // Where each element's grid and output follow the one before, the whole range is one run:
  // each pixel then carries its element's image offset (64 bits, from the image's start).
  Coords c;
  uint64_t edge_pixels = 0;
  core::for_each_run(
      grid, output, row_begin, row_end, core::batches_flat(grid, output), [&](const auto& run) {
        const Run r{image.data, run.out, output.strides[1], output.strides[3]};
        const auto first_pass = [&](int64_t first, int64_t block, Coords* coords) {
          neon::coordinates(run.grid + first * grid_x, grid_x, grid_axis, block, s, p, coords);
          core::element_offsets(run.n, run.oy, first, block, out_height, out_width, image_n, 0,
                                block, coords->plane);
        };
        const auto second = [&](int64_t first, int64_t block, const Coords& coords) {
          second_pass<OutT>(coords, block, s, f, r, first, &edge_pixels);
        };
        core::run_blocks<false>(run.count, &c, first_pass, second);
      });
  const int64_t pixels = (row_end - row_begin) * out_width;
  g_counters[kNeonPixels].fetch_add(static_cast<uint64_t>(pixels), std::memory_order_relaxed);
  g_counters[form_counter(s.coordinates)].fetch_add(static_cast<uint64_t>(pixels),
                                                    std::memory_order_relaxed);
  g_counters[kNeonEdgePixels].fetch_add(edge_pixels, std::memory_order_relaxed);
}

}  // namespace

template <typename OutT>
bool neon_kernel_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                         const QuantizedPlan& plan) {
  Kind kind;
  return select_kind(image, output, plan, &kind);
}

template <typename GridT, typename OutT>
void grid_sample_quantized_neon(const View4<const int8_t>& image, const View4<const GridT>& grid,
                                const View4<OutT>& output, const QuantizedPlan& plan,
                                int64_t row_begin, int64_t row_end) {
  Kind kind;
  if (!select_kind(image, output, plan, &kind)) {
    std::abort();  // callers check neon_kernel_applies
  }
  rows_neon(image, grid, output, plan, kind, row_begin, row_end);
}

void neon_counters(uint64_t counts[kNeonCounterCount]) {
  for (int k = 0; k < kNeonCounterCount; ++k) {
    counts[k] = g_counters[k].load(std::memory_order_relaxed);
  }
}

template bool neon_kernel_applies<int8_t>(const View4<const int8_t>&, const View4<int8_t>&,
                                          const QuantizedPlan&);
template bool neon_kernel_applies<float>(const View4<const int8_t>&, const View4<float>&,
                                         const QuantizedPlan&);
#define ETKIT_INSTANTIATE(GridT, OutT)                                           \
  template void grid_sample_quantized_neon<GridT, OutT>(                        \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&, \
      const QuantizedPlan&, int64_t, int64_t);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE

}  // namespace etkit::gridsampler

#endif  // defined(__aarch64__)
