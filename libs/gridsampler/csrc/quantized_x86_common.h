// What the vectorized x86 kernels share (quantized_x86.cpp: bilinear 4-channel channels-last;
// quantized_x86_any.cpp: every other mode and layout): the vector forms of steps 1 and 2, the
// requantization constants and the AVX-512 weight layout. Internal to the native library; every
// form gives the scalar steps' bits (quantized_steps.h), each derivation beside the code. The
// plans the NEON kernel shares (AxisInteger, AxisNearest, AxisExact, NarrowRequant, scalar_tap,
// nearest_index) are in quantized_forms.h.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ETKIT_HAVE_X86_KERNEL 1

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "quantized.h"
#include "quantized_core.h"
#include "quantized_forms.h"
#include "quantized_steps.h"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector idiom.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace etkit::gridsampler::x86 {

#define ETKIT_AVX2 __attribute__((target("avx2,fma")))


// Steps 1 and 2 in float64 for an int16 grid with zeros or border padding. With d = q - zero,
// X = d * multiplier and s = shift, the scalar steps compute P = round(X / 2^s) + offset (an
// exact left shift when s <= 0); the taps need only floor(P / 2^16) (offset is a multiple of
// 2^16), which is floor((X + 2^(s-1)) * 2^-(s+16)) + offset / 2^16. When |X| < 2^52 and
// s <= 52, X + 2^(s-1) is an integer below 2^53, so one fused multiply-add computes it exactly,
// and the floor, the sum and the clamp below are exact too.
struct AxisVector {
  bool applies;
  double scale;   // multiplier * 2^-(s + 16)
  double round;   // 2^(s-1) * 2^-(s + 16) = 2^-17 when s > 0, else 0
  double offset;  // offset / 2^16 = (size - 1) * 2^15
  // floor(P / 2^16) is clamped to [low, high]: the border itself, or, for zeros, just outside
  // the image, where both taps of an axis read 0 whatever their weight (x0 in [-2, size]).
  double low, high;
};

inline AxisVector plan_axis_vector(const AxisPlan& axis, int64_t grid_zero_point, Padding padding,
                            bool int16_grid) {
  AxisVector vector{};
  const int64_t max_d = std::max(std::llabs(-32768 - grid_zero_point),
                                 std::llabs(32767 - grid_zero_point));
  vector.applies = int16_grid && padding != Padding::kReflection && axis.shift <= 52 &&
                   axis.multiplier >= 0 &&
                   static_cast<__int128>(max_d) * axis.multiplier <
                       (static_cast<__int128>(1) << 52);
  vector.scale =
      std::ldexp(static_cast<double>(axis.multiplier), -static_cast<int>(axis.shift + 16));
  vector.round = axis.shift > 0 ? std::ldexp(1.0, -17) : 0.0;
  vector.offset = static_cast<double>(axis.offset >> 16);
  const double size16 = static_cast<double>(axis.size) * 65536.0;
  vector.low = padding == Padding::kBorder ? 0.0 : -2.0 * 65536.0;
  vector.high = padding == Padding::kBorder ? size16 - 65536.0 : size16;
  return vector;
}

// AxisInteger in 32-bit lanes, from the grid's (x, y) pairs as they are (16-bit multiply-adds
// need no sign extension): with M = Mh * 2^S + Ml (Ml = M mod 2^S, less 2^S where that fits 16
// bits better) and C = Ch * 2^S + Cl (0 <= Cl < 2^S),
// q * M + C = (q * Mh + Ch) * 2^S + (q * Ml + Cl), so Q = floor((q * M + C) / 2^S) is
//   (q * Mh + Ch) + ((q * Ml + Cl) >> S),
// exactly (the floor of an integer plus any A / 2^S), where both products are 16 x 16-bit
// (Mh, Ml within int16) and both sums fit 32 bits for every int16 q (checked below; the sum of
// the two is Q, below 2^30 in magnitude). It is the 32-bit Vulkan shader's idea of splitting step
// 1's product, with the split at 2^S so that the low part's quotient is one arithmetic shift.
struct AxisSplit {
  bool applies;
  int32_t high_multiplier, low_multiplier;  // Mh, Ml (16-bit)
  int32_t high_constant, low_constant;      // Ch, Cl
  int shift;                                // S, at most 30
  int32_t low, high;                        // AxisInteger's clamp
};

inline AxisSplit plan_axis_split(const AxisInteger& axis) {
  AxisSplit split{};
  if (!axis.applies || axis.shift > 30 || axis.shift < 0) {
    return split;
  }
  const int64_t s = axis.shift, m = axis.multiplier, c = axis.constant;
  int64_t ml = m & ((int64_t(1) << s) - 1);
  if (ml > 32767) {
    ml -= int64_t(1) << s;  // Ml may be negative: any Ml = M mod 2^S that fits 16 bits
  }
  const int64_t mh = (m - ml) >> s;
  const int64_t ch = c >> s, cl = c & ((int64_t(1) << s) - 1);  // floor, and the rest
  const int64_t limit = int64_t(1) << 31;
  if (mh > 32767 || ml < -32768 || 32768 * std::llabs(ml) + cl >= limit ||
      32768 * mh + std::llabs(ch) >= limit) {
    return split;
  }
  split.applies = true;
  split.high_multiplier = static_cast<int32_t>(mh);
  split.low_multiplier = static_cast<int32_t>(ml);
  split.high_constant = static_cast<int32_t>(ch);
  split.low_constant = static_cast<int32_t>(cl);
  split.shift = static_cast<int>(s);
  split.low = axis.low;
  split.high = axis.high;
  return split;
}

// How a kernel computes steps 1 and 2 (quantized_core.h).
using core::Coordinates;

// The subsets avx512_supported requires, for both AVX-512 passes.
#define ETKIT_AVX512 \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512vnni")))

struct AxisInteger512 {
  __m512i multiplier, constant, low, high;
  __m512i even_shift, odd_shift;  // S, and 32 - S: the odd lanes' Q lands in the upper half
};

ETKIT_AVX512 inline AxisInteger512 axis_integer_registers(const AxisInteger& axis) {
  return {_mm512_set1_epi64(axis.multiplier),     _mm512_set1_epi64(axis.constant),
          _mm512_set1_epi32(axis.low),            _mm512_set1_epi32(axis.high),
          _mm512_set1_epi64(axis.shift),          _mm512_set1_epi64(32 - axis.shift)};
}

// Q of sixteen grid values q (sign-extended in 32-bit lanes).
ETKIT_AVX512 inline __m512i integer_tap(__m512i q, const AxisInteger512& axis) {
  const __m512i even = _mm512_add_epi64(_mm512_mul_epi32(q, axis.multiplier), axis.constant);
  const __m512i odd = _mm512_add_epi64(
      _mm512_mul_epi32(_mm512_srli_epi64(q, 32), axis.multiplier), axis.constant);
  const __m512i taps = _mm512_mask_blend_epi32(0xAAAA, _mm512_srlv_epi64(even, axis.even_shift),
                                               _mm512_sllv_epi64(odd, axis.odd_shift));
  return _mm512_min_epi32(_mm512_max_epi32(taps, axis.low), axis.high);
}

// AxisSplit in registers for one axis of (x, y) pair lanes: `half` 0 for x (the low 16 bits of
// each lane), 1 for y.
struct AxisSplit512 {
  __m512i high_multiplier, low_multiplier, high_constant, low_constant, low, high;
  __m512i shift;
};

ETKIT_AVX512 inline AxisSplit512 axis_split_registers(const AxisSplit& a, int half) {
  const int up = 16 * half;
  return {_mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(a.high_multiplier) & 0xFFFF) << up)),
          _mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(a.low_multiplier) & 0xFFFF) << up)),
          _mm512_set1_epi32(a.high_constant),
          _mm512_set1_epi32(a.low_constant),
          _mm512_set1_epi32(a.low),
          _mm512_set1_epi32(a.high),
          _mm512_set1_epi32(a.shift)};
}

// Q of sixteen grid values, from their (x, y) pairs `xy` (int16 each).
ETKIT_AVX512 inline __m512i split_tap(__m512i xy, const AxisSplit512& a) {
  const __m512i high = _mm512_add_epi32(_mm512_madd_epi16(xy, a.high_multiplier), a.high_constant);
  const __m512i low = _mm512_add_epi32(_mm512_madd_epi16(xy, a.low_multiplier), a.low_constant);
  const __m512i taps = _mm512_add_epi32(high, _mm512_srav_epi32(low, a.shift));
  return _mm512_min_epi32(_mm512_max_epi32(taps, a.low), a.high);
}

// AxisVector in registers, for the float64 form where the integer one does not apply: the clamp
// bounds less the offset, and the offset plus 1 (see floor_p16_plus_1).
struct AxisRegisters512 {
  __m512d scale, round, low, high;
  __m256i offset_plus_1;
};

ETKIT_AVX512 inline AxisRegisters512 axis_registers_avx512(const AxisVector& axis) {
  return {_mm512_set1_pd(axis.scale), _mm512_set1_pd(axis.round),
          _mm512_set1_pd(axis.low - axis.offset), _mm512_set1_pd(axis.high - axis.offset),
          _mm256_set1_epi32(static_cast<int32_t>(axis.offset) + 1)};
}

// floor(P / 2^16) + 1, clamped as AxisVector says, of eight grid values d = q - zero, in one
// 512-bit pass. The clamp comes first, against bounds less the (integer) offset, which commutes
// with the floor; the floor is the conversion's own rounding.
ETKIT_AVX512 inline __m256i floor_p16_plus_1(__m256i d, const AxisRegisters512& axis) {
  __m512d p = _mm512_fmadd_pd(_mm512_cvtepi32_pd(d), axis.scale, axis.round);
  p = _mm512_min_pd(_mm512_max_pd(p, axis.low), axis.high);
  return _mm256_add_epi32(_mm512_cvt_roundpd_epi32(p, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                          axis.offset_plus_1);
}

// Q (see scalar_tap) of sixteen grid values: floor((floor(P / 2^16) + 1) / 2).
ETKIT_AVX512 inline __m512i vector_tap_avx512(__m512i d, const AxisRegisters512& axis) {
  const __m512i p16_plus_1 =
      _mm512_inserti64x4(_mm512_castsi256_si512(floor_p16_plus_1(_mm512_castsi512_si256(d), axis)),
                         floor_p16_plus_1(_mm512_extracti64x4_epi64(d, 1), axis), 1);
  return _mm512_srai_epi32(p16_plus_1, 1);
}

// Byte indexes into [A | B] (two packus_epi32 results: A = [c00 | c01], B = [c10 | h] per four
// pixels) that gather each pixel's low (high: + 1) weight bytes.
constexpr std::array<uint8_t, 64> weight_byte_index(int high) {
  std::array<uint8_t, 64> index{};
  for (int pixel = 0; pixel < 16; ++pixel) {
    const int base = 16 * (pixel / 4) + 2 * (pixel % 4) + high;
    index[4 * pixel + 0] = static_cast<uint8_t>(base);           // c00
    index[4 * pixel + 1] = static_cast<uint8_t>(base + 8);       // c01
    index[4 * pixel + 2] = static_cast<uint8_t>(64 + base);      // c10
    index[4 * pixel + 3] = static_cast<uint8_t>(64 + base + 8);  // c11
  }
  return index;
}

// Step 5's constants for the AVX-512 pass (narrow requantization, m = multiplier): the value
// plus `add` (2^(k-1), and the output zero point times 2^k where that is exact, see below),
// times m, shifted by k with halves to even; `init` starts the high-byte dot product, so that
// init * 2^8 lands in the value: -zero * 2^15, and `add` too where m = 1 and it is a multiple of
// 2^8.
struct WideSample {
  bool folded;  // m = 1, add = 0, after_zero_point = 0
  int32_t init;
  int32_t multiplier, add, after_zero_point;
  int shift;
  bool clamp;  // the output range is narrower than int8
  int8_t output_min, output_max;
  float float_scale;
};

inline WideSample plan_wide_sample(const QuantizedPlan& p, const NarrowRequant& requant,
                                   bool float_output) {
  WideSample s{};
  const int64_t image_zero = -p.image_zero_point * (int64_t(1) << 15);
  s.init = static_cast<int32_t>(image_zero >> 8);
  s.float_scale = p.float_output_scale;
  if (float_output) {
    return s;
  }
  s.multiplier = requant.multiplier;
  s.shift = static_cast<int>(requant.shift);
  // Adding zp * 2^k before the shift gives q + zp; halves to even then clears bit 0 of q + zp,
  // which is that of q when zp is even. It must not overflow: |value * m| < 255 * 2^15 * m.
  const int64_t half = int64_t(1) << (s.shift - 1);
  const int64_t zero_term = p.output_zero_point * (int64_t(1) << s.shift);
  const bool fold_zero = p.output_zero_point % 2 == 0 &&
                         255 * (int64_t(1) << 15) * requant.multiplier + half +
                                 std::llabs(zero_term) <
                             (int64_t(1) << 31);
  int64_t add = half + (fold_zero ? zero_term : 0);
  s.after_zero_point = fold_zero ? 0 : static_cast<int32_t>(p.output_zero_point);
  if (requant.multiplier == 1 && add % 256 == 0) {
    s.init += static_cast<int32_t>(add / 256);
    add = 0;
  }
  s.add = static_cast<int32_t>(add);
  s.folded = s.multiplier == 1 && s.add == 0 && s.after_zero_point == 0;
  s.clamp = p.output_min > -128 || p.output_max < 127;
  s.output_min = static_cast<int8_t>(p.output_min);
  s.output_max = static_cast<int8_t>(p.output_max);
  return s;
}

struct AxisExact512 {
  __m512i multiplier, round, offset, zero, low, high;
  __m512i reflect_low, span, double_span, period, low_half;
  __m512d inverse_period;
  __m512i shift;  // a vector count: one uop
  bool left, reflect;
};

ETKIT_AVX512 inline AxisExact512 axis_exact_registers(const AxisExact& a) {
  return {_mm512_set1_epi64(a.multiplier),
          _mm512_set1_epi64(a.round),
          _mm512_set1_epi64(a.offset),
          _mm512_set1_epi64(a.zero),
          _mm512_set1_epi64(a.low),
          _mm512_set1_epi64(a.high),
          _mm512_set1_epi64(a.reflect_low),
          _mm512_set1_epi64(a.span),
          _mm512_set1_epi64(2 * a.span),
          _mm512_set1_epi64(a.period),
          _mm512_set1_epi64(0xffffffffLL),
          _mm512_set1_pd(a.inverse_period),
          _mm512_set1_epi64(a.shift > 0 ? a.shift : -a.shift),
          a.shift <= 0,
          a.reflect};
}

// Eight grid values (int32 lanes) to eight Q (kNearest: nearest indexes).
template <bool kNearest>
ETKIT_AVX512 inline __m256i exact_tap8(__m256i q, const AxisExact512& a) {
  const __m512i d = _mm512_sub_epi64(_mm512_cvtepi32_epi64(q), a.zero);
  const __m512i product = _mm512_mullo_epi64(d, a.multiplier);
  __m512i p = a.left ? _mm512_sllv_epi64(product, a.shift)
                     : _mm512_srav_epi64(_mm512_add_epi64(product, a.round), a.shift);
  p = _mm512_add_epi64(p, a.offset);
  if (a.reflect) {
    const __m512i distance = _mm512_abs_epi64(_mm512_sub_epi64(p, a.reflect_low));
    const __m512i whole = _mm512_srli_epi64(distance, 32);
    const __m512i quotient = _mm512_cvt_roundpd_epi64(
        _mm512_mul_pd(_mm512_cvtepi64_pd(whole), a.inverse_period),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512i rest = _mm512_sub_epi64(whole, _mm512_mul_epu32(quotient, a.period));
    rest = _mm512_mask_add_epi64(rest, _mm512_cmplt_epi64_mask(rest, _mm512_setzero_si512()),
                                 rest, a.period);
    rest = _mm512_mask_sub_epi64(rest, _mm512_cmpge_epi64_mask(rest, a.period), rest, a.period);
    __m512i folded =
        _mm512_or_si512(_mm512_slli_epi64(rest, 32), _mm512_and_si512(distance, a.low_half));
    folded = _mm512_mask_sub_epi64(folded, _mm512_cmpgt_epi64_mask(folded, a.span),
                                   a.double_span, folded);
    p = _mm512_add_epi64(folded, a.reflect_low);
  }
  p = _mm512_min_epi64(_mm512_max_epi64(p, a.low), a.high);
  if constexpr (kNearest) {
    // round_half_even(P / 2^32): up when the fraction passes 1/2, or is 1/2 and the whole odd
    const __m512i whole = _mm512_srai_epi64(p, 32);
    const __m512i fraction = _mm512_and_si512(p, a.low_half);
    const __m512i half = _mm512_set1_epi64(int64_t(1) << 31);
    const __mmask8 up = _mm512_cmpgt_epi64_mask(fraction, half) |
                        (_mm512_cmpeq_epi64_mask(fraction, half) &
                         _mm512_test_epi64_mask(whole, _mm512_set1_epi64(1)));
    return _mm512_cvtepi64_epi32(_mm512_mask_add_epi64(whole, up, whole, _mm512_set1_epi64(1)));
  } else {
    return _mm512_cvtepi64_epi32(
        _mm512_srai_epi64(_mm512_add_epi64(p, _mm512_set1_epi64(int64_t(1) << 16)), 17));
  }
}

template <bool kNearest>
ETKIT_AVX512 inline __m512i exact_tap(__m512i q, const AxisExact512& a) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(exact_tap8<kNearest>(_mm512_castsi512_si256(q), a)),
      exact_tap8<kNearest>(_mm512_extracti64x4_epi64(q, 1), a), 1);
}

struct AxisNearest512 {
  __m512i multiplier, constant, below_shift, tie_limit, low, high;
  __m512i shift;
};

ETKIT_AVX512 inline AxisNearest512 axis_nearest_registers(const AxisNearest& a) {
  return {_mm512_set1_epi64(a.multiplier),
          _mm512_set1_epi64(a.constant),
          _mm512_set1_epi64(static_cast<int64_t>((uint64_t(1) << a.shift) - 1)),
          _mm512_set1_epi64(a.tie_limit),
          _mm512_set1_epi32(a.low),
          _mm512_set1_epi32(a.high),
          _mm512_set1_epi64(a.shift)};
}

// The nearest index of the grid values in the even (kOdd: odd) 32-bit lanes of q, as 64-bit
// lanes.
ETKIT_AVX512 inline __m512i nearest_index8(__m512i q, const AxisNearest512& a) {
  const __m512i x = _mm512_add_epi64(_mm512_mul_epi32(q, a.multiplier), a.constant);
  const __m512i up = _mm512_srav_epi64(x, a.shift);
  const __m512i one = _mm512_set1_epi64(1);
  const __mmask8 tie = _mm512_cmplt_epi64_mask(_mm512_and_si512(x, a.below_shift), a.tie_limit);
  return _mm512_mask_sub_epi64(up, tie & _mm512_test_epi64_mask(up, one), up, one);
}

// The nearest indexes of sixteen grid values (int32 lanes).
ETKIT_AVX512 inline __m512i nearest_tap(__m512i q, const AxisNearest512& a) {
  const __m512i even = nearest_index8(q, a);
  const __m512i odd = nearest_index8(_mm512_srli_epi64(q, 32), a);
  const __m512i index = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  return _mm512_min_epi32(_mm512_max_epi32(index, a.low), a.high);
}

// ---- AVX2 forms (quantized_x86.cpp derives them) ----

struct AxisRegisters {
  __m256d scale, round, offset, low, high;
};

ETKIT_AVX2 inline AxisRegisters axis_registers(const AxisVector& axis) {
  return {_mm256_set1_pd(axis.scale), _mm256_set1_pd(axis.round), _mm256_set1_pd(axis.offset),
          _mm256_set1_pd(axis.low), _mm256_set1_pd(axis.high)};
}

ETKIT_AVX2 inline __m128i floor_p16(__m128i d, const AxisRegisters& axis) {
  __m256d p = _mm256_floor_pd(_mm256_fmadd_pd(_mm256_cvtepi32_pd(d), axis.scale, axis.round));
  p = _mm256_min_pd(_mm256_max_pd(_mm256_add_pd(p, axis.offset), axis.low), axis.high);
  return _mm256_cvtpd_epi32(p);  // an integer below 2^30: exact
}

// Q (see scalar_tap) of eight grid values d = q - zero.
ETKIT_AVX2 inline __m256i vector_tap(__m256i d, const AxisRegisters& axis) {
  const __m256i p16 = _mm256_setr_m128i(floor_p16(_mm256_castsi256_si128(d), axis),
                                        floor_p16(_mm256_extracti128_si256(d, 1), axis));
  // round(P / 2^17) = floor((floor(P / 2^16) + 1) / 2)
  return _mm256_srai_epi32(_mm256_add_epi32(p16, _mm256_set1_epi32(1)), 1);
}

// Q of eight grid values q (sign-extended in 32-bit lanes), in the integer form.
struct AxisInteger256 {
  __m256i multiplier, constant, low, high;
  __m256i even_shift, odd_shift;  // S, and 32 - S: the odd lanes' Q lands in the upper half
};

ETKIT_AVX2 inline AxisInteger256 axis_integer_registers_avx2(const AxisInteger& axis) {
  return {_mm256_set1_epi64x(axis.multiplier), _mm256_set1_epi64x(axis.constant),
          _mm256_set1_epi32(axis.low),         _mm256_set1_epi32(axis.high),
          _mm256_set1_epi64x(axis.shift),      _mm256_set1_epi64x(32 - axis.shift)};
}

ETKIT_AVX2 inline __m256i integer_tap_avx2(__m256i q, const AxisInteger256& axis) {
  const __m256i even = _mm256_add_epi64(_mm256_mul_epi32(q, axis.multiplier), axis.constant);
  const __m256i odd = _mm256_add_epi64(
      _mm256_mul_epi32(_mm256_srli_epi64(q, 32), axis.multiplier), axis.constant);
  const __m256i taps = _mm256_blend_epi32(_mm256_srlv_epi64(even, axis.even_shift),
                                          _mm256_sllv_epi64(odd, axis.odd_shift), 0xAA);
  return _mm256_min_epi32(_mm256_max_epi32(taps, axis.low), axis.high);
}

struct AxisSplit256 {
  __m256i high_multiplier, low_multiplier, high_constant, low_constant, low, high;
  __m256i shift;
};

ETKIT_AVX2 inline AxisSplit256 axis_split_registers_avx2(const AxisSplit& a, int half) {
  const int up = 16 * half;
  return {_mm256_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(a.high_multiplier) & 0xFFFF) << up)),
          _mm256_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(a.low_multiplier) & 0xFFFF) << up)),
          _mm256_set1_epi32(a.high_constant),
          _mm256_set1_epi32(a.low_constant),
          _mm256_set1_epi32(a.low),
          _mm256_set1_epi32(a.high),
          _mm256_set1_epi32(a.shift)};
}

ETKIT_AVX2 inline __m256i split_tap_avx2(__m256i xy, const AxisSplit256& a) {
  const __m256i high = _mm256_add_epi32(_mm256_madd_epi16(xy, a.high_multiplier), a.high_constant);
  const __m256i low = _mm256_add_epi32(_mm256_madd_epi16(xy, a.low_multiplier), a.low_constant);
  const __m256i taps = _mm256_add_epi32(high, _mm256_srav_epi32(low, a.shift));
  return _mm256_min_epi32(_mm256_max_epi32(taps, a.low), a.high);
}

struct RequantRegisters {
  bool narrow;         // the 32-bit form applies (see narrow_requant)
  bool narrow_unit;    // and m = 1
  __m256i narrow_multiplier;  // epi32: M >> t
  __m128i narrow_shift;       // k - t
  __m256i narrow_round;       // epi32: 2^(k-t-1) - 1
  __m256i multiplier;  // epi64
  __m128i shift;       // k
  __m128i shift_high;  // k - 32
  __m256i round;       // epi64: 2^(k-1) - 1
  __m256i zero_point, min, max;  // epi16
};

// Step 5 for eight values, without the zero point: shift_round_half_even(value * M, k). The
// product (below 2^55) is formed in 64-bit lanes; halves to even is
// (x + 2^(k-1) - 1 + bit k of x) >> k, and as k >= 32 that shift is an arithmetic shift of the
// upper 32 bits by k - 32.
ETKIT_AVX2 inline __m256i requantize8(__m256i value, const RequantRegisters& r) {
  if (r.narrow) {
    // M = m * 2^t with m < 2^8: value * m (|value| < 2^23) and the rounding stay in 32 bits.
    const __m256i x = r.narrow_unit ? value : _mm256_mullo_epi32(value, r.narrow_multiplier);
    const __m256i odd_bit =
        _mm256_and_si256(_mm256_srl_epi32(x, r.narrow_shift), _mm256_set1_epi32(1));
    return _mm256_sra_epi32(_mm256_add_epi32(x, _mm256_add_epi32(r.narrow_round, odd_bit)),
                            r.narrow_shift);
  }
  const __m256i one = _mm256_set1_epi64x(1);
  __m256i even = _mm256_mul_epi32(value, r.multiplier);
  __m256i odd = _mm256_mul_epi32(_mm256_srli_epi64(value, 32), r.multiplier);
  even = _mm256_add_epi64(
      even, _mm256_add_epi64(r.round, _mm256_and_si256(_mm256_srl_epi64(even, r.shift), one)));
  odd = _mm256_add_epi64(
      odd, _mm256_add_epi64(r.round, _mm256_and_si256(_mm256_srl_epi64(odd, r.shift), one)));
  const __m256i even_q = _mm256_sra_epi32(_mm256_srli_epi64(even, 32), r.shift_high);
  const __m256i odd_q = _mm256_sra_epi32(odd, r.shift_high);
  return _mm256_blend_epi32(even_q, odd_q, 0xAA);
}

// Packs two vectors of requantize8 results (|q| <= 2^13 with ratio <= 32: no saturation) to
// 16 bits, adds the output zero point and clamps, 16 lanes at a time.
ETKIT_AVX2 inline __m256i finish16(__m256i q0, __m256i q1, const RequantRegisters& r) {
  const __m256i q = _mm256_add_epi16(_mm256_packs_epi32(q0, q1), r.zero_point);
  return _mm256_min_epi16(_mm256_max_epi16(q, r.min), r.max);
}

}  // namespace etkit::gridsampler::x86

#endif
