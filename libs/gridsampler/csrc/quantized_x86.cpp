// The vectorized x86 kernel: docs/contract.md's integer steps for a 4-channel channels-last
// int8 image, where one pixel is one 32-bit word and its two horizontal bilinear taps one 64-bit
// load. Each block of up to 256 output pixels of a row takes two passes: the taps and weights
// (steps 1 to 3), then the gathers, the interpolation and the requantization (steps 4 and 5);
// AVX2 does eight pixels at a time, AVX-512 sixteen. Every step gives the bits of the scalar
// steps (quantized_steps.h); the comments say why each rewrite is exact. Pixels with a tap
// outside the image that carries weight are redone by the scalar steps. The first pass runs a
// block ahead of the second and prefetches the image lines it will gather; the second gathers
// one step ahead of its arithmetic.
#include "quantized_x86.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "quantized_steps.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ETKIT_HAVE_X86_KERNEL 1
#include <immintrin.h>
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector idiom.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace etkit::gridsampler {

#ifdef ETKIT_HAVE_X86_KERNEL

bool avx2_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return supported;
}

bool avx512_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return avx2_supported() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return supported;
}

namespace {

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

AxisVector plan_axis_vector(const AxisPlan& axis, int64_t grid_zero_point, Padding padding,
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

// The tap coordinate and weight of one axis as one int32, Q = round(P / 2^17) (halves up) with
// P clamped as AxisVector says: x0 = Q >> 15 and w = Q & 0x7fff. Where the scalar weight is 2^15
// (the upper tap alone), Q names the upper tap with weight 0: the same value, and 15-bit weights.
inline int32_t scalar_tap(int64_t coord, int64_t size) {
  const int64_t clamped = std::min(std::max(coord, -2 * steps::kOne), size * steps::kOne);
  return static_cast<int32_t>(steps::shift_round(clamped, 17));
}

struct AxisRegisters {
  __m256d scale, round, offset, low, high;
};

ETKIT_AVX2 AxisRegisters axis_registers(const AxisVector& axis) {
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

// Step 4, exactly, in 16-bit lanes. With the raw int8 taps, a = v01 - v00, e = v10 - v00 and
// b = v11 - v10 - v01 + v00, the scalar value shift_round(top * 2^15 + (bottom - top) * wy, 15)
// is v00 * 2^15 + a * wx + e * wy + shift_round(b * wx * wy, 15), since the other terms are
// multiples of 2^15; and with wx * wy = h * 2^15 + l, shift_round(b * wx * wy, 15) is
// b * h + (b * l + 2^14) >> 15. Every factor fits 16 bits (|a|, |e| <= 255, |b| <= 510, the
// weights and h, l <= 2^15 - 1), so three pairwise multiply-adds (madd) give the value:
//   madd([a, e], [wx, wy]) + madd([b, 2 (v00 - zero)], [h, 2^14]) + madd([b, 1], [l, 2^14]) >> 15
// which also subtracts the image zero point (v = q - zero is affine in q).
struct PixelWeights {
  __m256i wx_wy, h_half, l_half;  // per pixel: wx | wy << 16, h | 2^14 << 16, l | 2^14 << 16
};

ETKIT_AVX2 inline PixelWeights pixel_weights(__m256i wx, __m256i wy) {
  const __m256i product = _mm256_madd_epi16(wx, wy);  // upper halves are zero: wx * wy
  const __m256i half = _mm256_set1_epi32(1 << 30);    // 2^14 in the upper 16 bits
  return {_mm256_or_si256(wx, _mm256_slli_epi32(wy, 16)),
          _mm256_or_si256(_mm256_srli_epi32(product, kWeightBits), half),
          _mm256_or_si256(_mm256_and_si256(product, _mm256_set1_epi32(0x7fff)), half)};
}

// Four pixels' taps as 16-bit lanes (pixel-major, 4 channels each): the difference terms of
// one row pair.
struct GroupTaps {
  __m256i a_e_lo, a_e_hi, b_z_lo, b_z_hi, b_1_lo, b_1_hi;
};

// upper, lower: four gathered 64-bit words each, [v00 | v01] and [v10 | v11] per pixel.
ETKIT_AVX2 inline GroupTaps group_taps(__m256i upper, __m256i lower, __m256i zero_16) {
  // [v00 | v01] per pixel -> [v00 of the four pixels | v01 of the four pixels]
  const __m256i split = _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15, 0,
                                         1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  const __m256i up = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(upper, split), 0xD8);
  const __m256i down = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(lower, split), 0xD8);
  const __m256i v00 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(up));
  const __m256i v01 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(up, 1));
  const __m256i v10 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(down));
  const __m256i v11 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(down, 1));
  const __m256i a = _mm256_sub_epi16(v01, v00);
  const __m256i e = _mm256_sub_epi16(v10, v00);
  const __m256i b = _mm256_sub_epi16(_mm256_sub_epi16(v11, v10), a);
  const __m256i z = _mm256_slli_epi16(_mm256_sub_epi16(v00, zero_16), 1);
  const __m256i one = _mm256_set1_epi16(1);
  // unpacklo takes pixels 0 and 2 of the group, unpackhi pixels 1 and 3
  return {_mm256_unpacklo_epi16(a, e), _mm256_unpackhi_epi16(a, e),
          _mm256_unpacklo_epi16(b, z), _mm256_unpackhi_epi16(b, z),
          _mm256_unpacklo_epi16(b, one), _mm256_unpackhi_epi16(b, one)};
}

// The values of two pixels (8 lanes, 4 channels each) from their pair terms and weights
// (already repeated per channel).
ETKIT_AVX2 inline __m256i pair_value(__m256i a_e, __m256i b_z, __m256i b_1, __m256i wx_wy,
                                     __m256i h_half, __m256i l_half) {
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(a_e, wx_wy), _mm256_madd_epi16(b_z, h_half)),
      _mm256_srai_epi32(_mm256_madd_epi16(b_1, l_half), kWeightBits));
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

// The requantization multiplier and shift reduced to M = m * 2^t, k - t, when m < 2^8 and
// k - t <= 24 (for example, equal image and output scales: m = 1, k - t = 15); then
// |value * m| + 2^(k-t-1) < 2^31 and requantize8 stays in 32-bit lanes.
struct NarrowRequant {
  bool applies;
  int32_t multiplier;
  int64_t shift;
};

NarrowRequant narrow_requant(int64_t multiplier, int64_t shift) {
  while (multiplier > 0 && (multiplier & 1) == 0 && shift > 1) {
    multiplier >>= 1;
    --shift;
  }
  return {multiplier > 0 && multiplier < 256 && shift <= 24, static_cast<int32_t>(multiplier),
          shift};
}

constexpr int64_t kBlock = 256;

// Steps 1 to 3 for a block of pixels: what the second pass needs, per pixel. A pixel is on the
// vector path when its taps are inside the image or have weight 0: x0 = width - 1 with wx = 0
// (and y0 = height - 1 with wy = 0), as border and reflection padding give at the far edges.
// There the upper row's 64-bit load starts 4 bytes early and is shifted right by 32 bits (v00 is
// pixel x0, v01 reads 0 with weight 0), and the lower row's load reads row y0 again (weight 0).
struct TapBlock {
  alignas(64) int32_t offsets[kBlock];        // upper row: bytes from the plane to tap (x0, y0)
  alignas(64) int32_t lower_offsets[kBlock];  // lower row: bytes from the plane's second row
  alignas(64) int32_t shifts[kBlock];         // 32 at x0 = width - 1, else 0
  alignas(64) int32_t wx_wy[kBlock];          // PixelWeights
  alignas(64) int32_t h_half[kBlock];
  alignas(64) int32_t l_half[kBlock];
  int inside[kBlock / 8];  // per 8 pixels, bit i: pixel i is on the vector path; 0 offsets if not
};

struct TapParams {
  AxisVector x, y;
  int32_t grid_zero_point, last_x0, last_y0, stride_y;  // last: size - 2
  bool vector_coordinates;  // int16 grid values in (x, y) pairs, and both axes apply
};

ETKIT_AVX2 inline __m256i load8(const int32_t* values) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(values));
}

ETKIT_AVX2 inline __m128i load4(const int32_t* values) {
  return _mm_load_si128(reinterpret_cast<const __m128i*>(values));
}

// The block's taps, eight pixels at a time; `grid` points at the block's first grid point.
template <typename GridT>
ETKIT_AVX2 void taps_block_avx2(const GridT* grid, int64_t grid_x, int64_t grid_axis,
                                int64_t count, const TapParams& t, const QuantizedPlan& p,
                                TapBlock* block) {
  const AxisRegisters regs_x = axis_registers(t.x), regs_y = axis_registers(t.y);
  const __m256i grid_zero = _mm256_set1_epi32(t.grid_zero_point);
  const __m256i weight_mask = _mm256_set1_epi32(0x7fff);
  const __m256i last_x0 = _mm256_set1_epi32(t.last_x0), last_y0 = _mm256_set1_epi32(t.last_y0);
  const __m256i stride_y = _mm256_set1_epi32(t.stride_y);
  const __m256i last_x1 = _mm256_set1_epi32(t.last_x0 + 1);
  const __m256i last_y1 = _mm256_set1_epi32(t.last_y0 + 1);
  const __m256i four = _mm256_set1_epi32(4);
  const __m256i thirty_two = _mm256_set1_epi32(32);
  for (int64_t i = 0; i < count; i += 8) {
    __m256i qx = _mm256_setzero_si256(), qy = _mm256_setzero_si256();
    if constexpr (std::is_same_v<GridT, int16_t>) {
      if (t.vector_coordinates) {
        const __m256i xy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grid + i * 2));
        qx = vector_tap(
            _mm256_sub_epi32(_mm256_srai_epi32(_mm256_slli_epi32(xy, 16), 16), grid_zero),
            regs_x);
        qy = vector_tap(_mm256_sub_epi32(_mm256_srai_epi32(xy, 16), grid_zero), regs_y);
      }
    }
    if (!t.vector_coordinates) {
      alignas(32) int32_t tx[8], ty[8];
      for (int k = 0; k < 8; ++k) {
        const GridT* const grid_point = grid + (i + k) * grid_x;
        tx[k] = scalar_tap(steps::pixel_coordinate(grid_point[0], p, p.x), p.x.size);
        ty[k] = scalar_tap(steps::pixel_coordinate(grid_point[grid_axis], p, p.y), p.y.size);
      }
      qx = load8(tx);
      qy = load8(ty);
    }
    const __m256i x0 = _mm256_srai_epi32(qx, kWeightBits), wx = _mm256_and_si256(qx, weight_mask);
    const __m256i y0 = _mm256_srai_epi32(qy, kWeightBits), wy = _mm256_and_si256(qy, weight_mask);
    // On the vector path (TapBlock): 0 <= x0 <= width - 2 (an unsigned compare) or the edge
    // x0 = width - 1 with wx = 0; the same for y.
    const __m256i zero = _mm256_setzero_si256();
    const __m256i edge_x = _mm256_and_si256(_mm256_cmpeq_epi32(x0, last_x1),
                                            _mm256_cmpeq_epi32(wx, zero));
    const __m256i edge_y = _mm256_and_si256(_mm256_cmpeq_epi32(y0, last_y1),
                                            _mm256_cmpeq_epi32(wy, zero));
    const __m256i inside = _mm256_and_si256(
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_min_epu32(x0, last_x0), x0), edge_x),
        _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_min_epu32(y0, last_y0), y0), edge_y));
    const __m256i upper = _mm256_sub_epi32(
        _mm256_add_epi32(_mm256_mullo_epi32(y0, stride_y), _mm256_slli_epi32(x0, 2)),
        _mm256_and_si256(edge_x, four));
    const __m256i lower = _mm256_sub_epi32(upper, _mm256_and_si256(edge_y, stride_y));
    // Pixels off the vector path read pixel (0, 0), and the scalar steps redo them.
    const PixelWeights weights = pixel_weights(wx, wy);
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->offsets + i),
                       _mm256_and_si256(inside, upper));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->lower_offsets + i),
                       _mm256_and_si256(inside, lower));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->shifts + i),
                       _mm256_and_si256(_mm256_and_si256(inside, edge_x), thirty_two));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->wx_wy + i), weights.wx_wy);
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->h_half + i), weights.h_half);
    _mm256_store_si256(reinterpret_cast<__m256i*>(block->l_half + i), weights.l_half);
    block->inside[i / 8] = _mm256_movemask_ps(_mm256_castsi256_ps(inside));
  }
}

// The subsets avx512_supported requires, for both AVX-512 passes.
#define ETKIT_AVX512 \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512vnni")))

// AxisVector in registers: the clamp bounds less the offset, and the offset plus 1 (see
// floor_p16_plus_1).
struct AxisRegisters512 {
  __m512d scale, round, low, high;
  __m256i offset_plus_1;
};

ETKIT_AVX512 AxisRegisters512 axis_registers_avx512(const AxisVector& axis) {
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

// taps_block_avx2 for int16 grids on the vector coordinate path, sixteen pixels at a time: the
// same steps, the same bits.
ETKIT_AVX512 __attribute__((noinline)) void taps_block_avx512(const int16_t* grid, int64_t count,
                                                              const TapParams& t,
                                                              TapBlock* block) {
  const AxisRegisters512 axis_x = axis_registers_avx512(t.x), axis_y = axis_registers_avx512(t.y);
  const __m512i grid_zero = _mm512_set1_epi32(t.grid_zero_point);
  const __m512i weight_mask = _mm512_set1_epi32(0x7fff);
  const __m512i last_x0 = _mm512_set1_epi32(t.last_x0), last_y0 = _mm512_set1_epi32(t.last_y0);
  const __m512i stride_y = _mm512_set1_epi32(t.stride_y);
  const __m512i half = _mm512_set1_epi32(1 << 30);
  const __m512i one = _mm512_set1_epi32(1), four = _mm512_set1_epi32(4);
  const __m512i thirty_two = _mm512_set1_epi32(32);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = count - i >= 16 ? 0xFFFF : 0x00FF;  // count is a multiple of 8
    const __m512i xy = _mm512_maskz_loadu_epi32(lanes, grid + i * 2);
    const __m512i qx = vector_tap_avx512(
        _mm512_sub_epi32(_mm512_srai_epi32(_mm512_slli_epi32(xy, 16), 16), grid_zero), axis_x);
    const __m512i qy =
        vector_tap_avx512(_mm512_sub_epi32(_mm512_srai_epi32(xy, 16), grid_zero), axis_y);
    const __m512i x0 = _mm512_srai_epi32(qx, kWeightBits), wx = _mm512_and_si512(qx, weight_mask);
    const __m512i y0 = _mm512_srai_epi32(qy, kWeightBits), wy = _mm512_and_si512(qy, weight_mask);
    const __m512i zero = _mm512_setzero_si512();
    const __mmask16 edge_x = _mm512_cmpeq_epi32_mask(x0, _mm512_add_epi32(last_x0, one)) &
                             _mm512_cmpeq_epi32_mask(wx, zero);
    const __mmask16 edge_y = _mm512_cmpeq_epi32_mask(y0, _mm512_add_epi32(last_y0, one)) &
                             _mm512_cmpeq_epi32_mask(wy, zero);
    const __mmask16 inside = (_mm512_cmple_epu32_mask(x0, last_x0) | edge_x) &
                             (_mm512_cmple_epu32_mask(y0, last_y0) | edge_y);
    __m512i upper = _mm512_add_epi32(_mm512_mullo_epi32(y0, stride_y), _mm512_slli_epi32(x0, 2));
    upper = _mm512_mask_sub_epi32(upper, edge_x, upper, four);
    const __m512i lower = _mm512_mask_sub_epi32(upper, edge_y, upper, stride_y);
    const __m512i product = _mm512_madd_epi16(wx, wy);
    _mm512_mask_store_epi32(block->offsets + i, lanes, _mm512_maskz_mov_epi32(inside, upper));
    _mm512_mask_store_epi32(block->lower_offsets + i, lanes,
                            _mm512_maskz_mov_epi32(inside, lower));
    _mm512_mask_store_epi32(block->shifts + i, lanes,
                            _mm512_maskz_mov_epi32(inside & edge_x, thirty_two));
    _mm512_mask_store_epi32(block->wx_wy + i, lanes,
                            _mm512_or_si512(wx, _mm512_slli_epi32(wy, 16)));
    _mm512_mask_store_epi32(block->h_half + i, lanes,
                            _mm512_or_si512(_mm512_srli_epi32(product, kWeightBits), half));
    _mm512_mask_store_epi32(
        block->l_half + i, lanes,
        _mm512_or_si512(_mm512_and_si512(product, weight_mask), half));
    block->inside[i / 8] = inside & 0xFF;
    if (lanes == 0xFFFF) {
      block->inside[i / 8 + 1] = inside >> 8;
    }
  }
}

// Steps 4 and 5 (the second pass) for pixels [0, count) of a block, count a multiple of 16,
// sixteen pixels at a time: the arithmetic of group_taps, pair_value and requantize8 (32-bit
// form) in 512-bit lanes, with one byte permutation (VBMI) per row of taps and fused
// multiply-adds (VNNI). `requant` is the narrow form; unused for float output.
template <typename OutT>
ETKIT_AVX512 __attribute__((noinline)) void sample_block_avx512(
    const TapBlock& block, int64_t count, const long long* upper_base,
    const long long* lower_base, OutT* out, const QuantizedPlan& p,
    const NarrowRequant& requant) {
  // [v00 | v01] of eight pixels -> [v00 of the eight pixels | v01 of the eight pixels]
  alignas(64) static const uint8_t split_bytes[64] = {
      0,  1,  2,  3,  8,  9,  10, 11, 16, 17, 18, 19, 24, 25, 26, 27, 32, 33, 34, 35, 40, 41,
      42, 43, 48, 49, 50, 51, 56, 57, 58, 59, 4,  5,  6,  7,  12, 13, 14, 15, 20, 21, 22, 23,
      28, 29, 30, 31, 36, 37, 38, 39, 44, 45, 46, 47, 52, 53, 54, 55, 60, 61, 62, 63};
  const __m512i split = _mm512_load_si512(split_bytes);
  const __m512i zero_16 = _mm512_set1_epi16(static_cast<int16_t>(p.image_zero_point));
  const __m512i one_16 = _mm512_set1_epi16(1);
  // unpacklo takes pixels 0, 2, 4, 6 of eight, unpackhi 1, 3, 5, 7 (one per 128-bit lane)
  // (for pixels 0-7, then for 8-15)
  const __m512i pixel_index[2][2] = {
      {_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
       _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7)},
      {_mm512_setr_epi32(8, 8, 8, 8, 10, 10, 10, 10, 12, 12, 12, 12, 14, 14, 14, 14),
       _mm512_setr_epi32(9, 9, 9, 9, 11, 11, 11, 11, 13, 13, 13, 13, 15, 15, 15, 15)}};
  const __m512i half_step =
      _mm512_set1_epi32(static_cast<int32_t>(int64_t(1) << (requant.shift - 1)));
  const __m512i below_step =
      _mm512_set1_epi32(static_cast<int32_t>((int64_t(1) << requant.shift) - 1));
  const __m512i not_one = _mm512_set1_epi32(~1);
  const __m512i requant_multiplier = _mm512_set1_epi32(requant.multiplier);
  const __m128i requant_shift = _mm_cvtsi64_si128(requant.shift);
  const __m512i output_zero = _mm512_set1_epi16(static_cast<int16_t>(p.output_zero_point));
  const __m512i output_min = _mm512_set1_epi16(static_cast<int16_t>(p.output_min));
  const __m512i output_max = _mm512_set1_epi16(static_cast<int16_t>(p.output_max));
  const __m512 float_scale = _mm512_set1_ps(p.float_output_scale);
  // [p0 p2 p4 p6] and [p1 p3 p5 p7] (128-bit chunks) -> [p0 p1 p2 p3] and [p4 p5 p6 p7]
  const __m512i first_half =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second_half =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);

  const auto requantize16 = [&](__m512i value) ETKIT_AVX512 {
    const __m512i x =
        requant.multiplier == 1 ? value : _mm512_mullo_epi32(value, requant_multiplier);
    // halves up, then a tie (nothing below the step after adding the half) made even
    const __m512i y = _mm512_add_epi32(x, half_step);
    const __m512i q = _mm512_sra_epi32(y, requant_shift);
    return _mm512_mask_and_epi32(q, _mm512_testn_epi32_mask(y, below_step), q, not_one);
  };
  // The taps of sixteen pixels: [upper, lower] of pixels 0-7, then of 8-15; loaded one
  // iteration ahead, so that the gathers' latency overlaps the arithmetic.
  const auto gather_taps = [&](int64_t i, __m512i* taps) ETKIT_AVX512 {
    const __m512i offsets = _mm512_load_si512(block.offsets + i);
    const __m512i lower_offsets = _mm512_load_si512(block.lower_offsets + i);
    const __m512i shifts = _mm512_load_si512(block.shifts + i);
    for (int g = 0; g < 2; ++g) {
      const auto half_of = [g](__m512i v) ETKIT_AVX512 {
        return g == 0 ? _mm512_castsi512_si256(v) : _mm512_extracti64x4_epi64(v, 1);
      };
      const __m512i shift = _mm512_cvtepu32_epi64(half_of(shifts));
      taps[2 * g] = _mm512_permutexvar_epi8(
          split, _mm512_srlv_epi64(_mm512_i32gather_epi64(half_of(offsets), upper_base, 1), shift));
      taps[2 * g + 1] = _mm512_permutexvar_epi8(
          split,
          _mm512_srlv_epi64(_mm512_i32gather_epi64(half_of(lower_offsets), lower_base, 1), shift));
    }
  };
  __m512i taps[4], next[4];
  if (count > 0) {
    gather_taps(0, taps);
  }
  for (int64_t i = 0; i < count; i += 16) {
    if (i + 16 < count) {
      gather_taps(i + 16, next);
    }
    const __m512i wx_wy = _mm512_load_si512(block.wx_wy + i);
    const __m512i h_half = _mm512_load_si512(block.h_half + i);
    const __m512i l_half = _mm512_load_si512(block.l_half + i);
    for (int g = 0; g < 2; ++g) {
      const __m512i up = taps[2 * g], down = taps[2 * g + 1];
      const __m512i v00 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(up));
      const __m512i v01 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(up, 1));
      const __m512i v10 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(down));
      const __m512i v11 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(down, 1));
      const __m512i a = _mm512_sub_epi16(v01, v00);
      const __m512i e = _mm512_sub_epi16(v10, v00);
      const __m512i b = _mm512_sub_epi16(_mm512_sub_epi16(v11, v10), a);
      const __m512i z = _mm512_slli_epi16(_mm512_sub_epi16(v00, zero_16), 1);
      __m512i values[2];
      for (int half = 0; half < 2; ++half) {
        const __m512i pixels = pixel_index[g][half];
        const __m512i a_e =
            half == 0 ? _mm512_unpacklo_epi16(a, e) : _mm512_unpackhi_epi16(a, e);
        const __m512i b_z =
            half == 0 ? _mm512_unpacklo_epi16(b, z) : _mm512_unpackhi_epi16(b, z);
        const __m512i b_1 =
            half == 0 ? _mm512_unpacklo_epi16(b, one_16) : _mm512_unpackhi_epi16(b, one_16);
        const __m512i low = _mm512_srai_epi32(
            _mm512_madd_epi16(b_1, _mm512_permutexvar_epi32(pixels, l_half)), kWeightBits);
        values[half] = _mm512_dpwssd_epi32(
            _mm512_dpwssd_epi32(low, a_e, _mm512_permutexvar_epi32(pixels, wx_wy)), b_z,
            _mm512_permutexvar_epi32(pixels, h_half));
      }
      OutT* const group_out = out + (i + 8 * g) * 4;
      if constexpr (std::is_same_v<OutT, int8_t>) {
        // packs works within 128-bit lanes: lane k gets pixels 2k and 2k + 1, in order
        __m512i q = _mm512_packs_epi32(requantize16(values[0]), requantize16(values[1]));
        q = _mm512_min_epi16(_mm512_max_epi16(_mm512_add_epi16(q, output_zero), output_min),
                             output_max);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(group_out), _mm512_cvtepi16_epi8(q));
      } else {
        const __m512 even = _mm512_mul_ps(_mm512_cvtepi32_ps(values[0]), float_scale);
        const __m512 odd = _mm512_mul_ps(_mm512_cvtepi32_ps(values[1]), float_scale);
        _mm512_storeu_ps(group_out, _mm512_permutex2var_ps(even, first_half, odd));
        _mm512_storeu_ps(group_out + 16, _mm512_permutex2var_ps(even, second_half, odd));
      }
    }
    for (int k = 0; k < 4; ++k) {
      taps[k] = next[k];
    }
  }
}

template <typename GridT, typename OutT>
ETKIT_AVX2 void rows_x86(const View4<const int8_t>& image, const View4<const GridT>& grid,
                          const View4<OutT>& output, const QuantizedPlan& plan, int64_t row_begin,
                          int64_t row_end, bool wide) {
  const QuantizedPlan p = plan;
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int64_t height = image.sizes[2], width = image.sizes[3];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  const int64_t output_c = output.strides[1];
  steps::Plane plane{nullptr, image.sizes[1], height, width, image.strides[1], image.strides[2],
                     image.strides[3]};
  const AxisVector axis_x = plan_axis_vector(p.x, p.grid_zero_point, p.params.padding,
                                             std::is_same_v<GridT, int16_t>);
  const AxisVector axis_y = plan_axis_vector(p.y, p.grid_zero_point, p.params.padding,
                                             std::is_same_v<GridT, int16_t>);
  const TapParams taps{axis_x,
                       axis_y,
                       static_cast<int32_t>(p.grid_zero_point),
                       static_cast<int32_t>(width - 2),
                       static_cast<int32_t>(height - 2),
                       static_cast<int32_t>(image.strides[2]),
                       axis_x.applies && axis_y.applies && grid_axis == 1 && grid_x == 2};
  const bool use_avx512 = std::is_same_v<GridT, int16_t> && taps.vector_coordinates && wide;
  const __m256i zero_16 = _mm256_set1_epi16(static_cast<int16_t>(p.image_zero_point));
  // the pixels of values[0 .. 3] below, as indexes into a vector of eight pixels' weights
  const __m256i pixel_index[4] = {_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2),
                                  _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3),
                                  _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6),
                                  _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7)};
  const NarrowRequant narrow = narrow_requant(p.requant_multiplier, p.requant_shift);
  const bool use_wide_samples = wide && (std::is_same_v<OutT, float> || narrow.applies);
  const RequantRegisters requant{
      narrow.applies,
      narrow.multiplier == 1,
      _mm256_set1_epi32(narrow.multiplier),
      _mm_cvtsi64_si128(narrow.shift),
      _mm256_set1_epi32(static_cast<int32_t>((int64_t(1) << (narrow.shift - 1)) - 1)),
      _mm256_set1_epi64x(p.requant_multiplier),
      _mm_cvtsi64_si128(p.requant_shift),
      _mm_cvtsi64_si128(p.requant_shift - 32),
      _mm256_set1_epi64x((int64_t(1) << (p.requant_shift - 1)) - 1),
      _mm256_set1_epi16(static_cast<int16_t>(p.output_zero_point)),
      _mm256_set1_epi16(static_cast<int16_t>(p.output_min)),
      _mm256_set1_epi16(static_cast<int16_t>(p.output_max))};
  const __m256 float_scale = _mm256_set1_ps(p.float_output_scale);
  const __m256i pixel_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  TapBlock blocks[2];

  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / out_height, oy = row % out_height;
    const GridT* const grid_row = grid.data + n * grid.strides[0] + oy * grid.strides[1];
    plane.data = image.data + n * image.strides[0];
    const long long* const upper_base = reinterpret_cast<const long long*>(plane.data);
    const long long* const lower_base =
        reinterpret_cast<const long long*>(plane.data + image.strides[2]);
    OutT* __restrict__ const output_row =
        output.data + n * output.strides[0] + oy * output.strides[2];
    const auto scalar_pixel = [&](int64_t ox) {
      const GridT* const grid_point = grid_row + ox * grid_x;
      steps::sample_pixel(steps::pixel_coordinate(grid_point[0], p, p.x),
                          steps::pixel_coordinate(grid_point[grid_axis], p, p.y), plane,
                          output_row + ox * output.strides[3], output_c, p);
    };
    // Blocks of pixels in two passes, so that the gathers of the second do not wait on the
    // coordinate arithmetic of the first; the first pass runs a block ahead of the second, so
    // that the image lines it prefetches have arrived when the second gathers them.
    const auto first_pass = [&](int64_t ox, TapBlock* block) ETKIT_AVX2 {
      const int64_t count = std::min<int64_t>(kBlock, (out_width - ox) / 8 * 8);
      if (use_avx512) {
        taps_block_avx512(reinterpret_cast<const int16_t*>(grid_row) + ox * 2, count, taps,
                          block);
      } else {
        taps_block_avx2(grid_row + ox * grid_x, grid_x, grid_axis, count, taps, p, block);
      }
      // The image lines the gathers will read, requested now: their addresses are not a
      // stream the hardware prefetchers follow.
      for (int64_t j = 0; j < count; j += 8) {
        _mm_prefetch(reinterpret_cast<const char*>(upper_base) + block->offsets[j], _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(lower_base) + block->lower_offsets[j],
                     _MM_HINT_T0);
      }
      return count;
    };
    const auto second_pass = [&](int64_t ox, int64_t count, const TapBlock& block) ETKIT_AVX2 {
      int64_t i = 0;
      if (use_wide_samples) {
        i = count / 16 * 16;
        sample_block_avx512(block, i, upper_base, lower_base, output_row + ox * 4, p, narrow);
      }
      // The gathered taps of four pixels, [upper, lower], one iteration ahead (as in
      // sample_block_avx512).
      const auto gather_group = [&](int64_t first, __m256i* taps) ETKIT_AVX2 {
        const __m256i shift = _mm256_cvtepu32_epi64(load4(block.shifts + first));
        taps[0] = _mm256_srlv_epi64(
            _mm256_i32gather_epi64(upper_base, load4(block.offsets + first), 1), shift);
        taps[1] = _mm256_srlv_epi64(
            _mm256_i32gather_epi64(lower_base, load4(block.lower_offsets + first), 1), shift);
      };
      __m256i taps[4], next[4];
      if (i < count) {
        gather_group(i, taps);
        gather_group(i + 4, taps + 2);
      }
      for (; i < count; i += 8) {
        if (i + 8 < count) {
          gather_group(i + 8, next);
          gather_group(i + 12, next + 2);
        }
        const __m256i wx_wy = load8(block.wx_wy + i);
        const __m256i h_half = load8(block.h_half + i);
        const __m256i l_half = load8(block.l_half + i);
        const GroupTaps groups[2] = {group_taps(taps[0], taps[1], zero_16),
                                     group_taps(taps[2], taps[3], zero_16)};
        for (int k = 0; k < 4; ++k) {
          taps[k] = next[k];
        }
        // Step 4: values[2 g] holds pixels 4g and 4g + 2, values[2 g + 1] 4g + 1 and 4g + 3.
        __m256i values[4];
        for (int g = 0; g < 2; ++g) {
          const __m256i lo = pixel_index[2 * g], hi = pixel_index[2 * g + 1];
          values[2 * g] = pair_value(groups[g].a_e_lo, groups[g].b_z_lo, groups[g].b_1_lo,
                                     _mm256_permutevar8x32_epi32(wx_wy, lo),
                                     _mm256_permutevar8x32_epi32(h_half, lo),
                                     _mm256_permutevar8x32_epi32(l_half, lo));
          values[2 * g + 1] = pair_value(groups[g].a_e_hi, groups[g].b_z_hi, groups[g].b_1_hi,
                                         _mm256_permutevar8x32_epi32(wx_wy, hi),
                                         _mm256_permutevar8x32_epi32(h_half, hi),
                                         _mm256_permutevar8x32_epi32(l_half, hi));
        }
        // Step 5 and the stores: 8 pixels x 4 channels, channels-last.
        OutT* const out = output_row + (ox + i) * 4;
        if constexpr (std::is_same_v<OutT, int8_t>) {
          const __m256i q01 =
              finish16(requantize8(values[0], requant), requantize8(values[1], requant), requant);
          const __m256i q23 =
              finish16(requantize8(values[2], requant), requantize8(values[3], requant), requant);
          // packs work within 128-bit lanes: q01 holds pixels [0, 1 | 2, 3], q23 [4, 5 | 6, 7],
          // and the bytes [0, 1, 4, 5 | 2, 3, 6, 7]; the values are within int8 already
          const __m256i bytes =
              _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), pixel_order);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
        } else {
          for (int g = 0; g < 2; ++g) {
            const __m256 even = _mm256_mul_ps(_mm256_cvtepi32_ps(values[2 * g]), float_scale);
            const __m256 odd = _mm256_mul_ps(_mm256_cvtepi32_ps(values[2 * g + 1]), float_scale);
            _mm256_storeu_ps(out + g * 16, _mm256_permute2f128_ps(even, odd, 0x20));
            _mm256_storeu_ps(out + g * 16 + 8, _mm256_permute2f128_ps(even, odd, 0x31));
          }
        }
      }
      // The pixels with a tap outside the image, by the scalar steps.
      for (int64_t j = 0; j < count; j += 8) {
        const int inside_mask = block.inside[j / 8];
        if (inside_mask != 0xFF) {
          for (int k = 0; k < 8; ++k) {
            if ((inside_mask & (1 << k)) == 0) {
              scalar_pixel(ox + j + k);
            }
          }
        }
      }
    };
    int64_t ox = 0;
    int current = 0;
    int64_t count = out_width >= 8 ? first_pass(0, &blocks[0]) : 0;
    while (count > 0) {
      const int64_t next_ox = ox + count;
      const int64_t next_count = count == kBlock && next_ox + 8 <= out_width
                                     ? first_pass(next_ox, &blocks[current ^ 1])
                                     : 0;
      second_pass(ox, count, blocks[current]);
      ox = next_ox;
      count = next_count;
      current ^= 1;
    }
    for (; ox < out_width; ++ox) {
      scalar_pixel(ox);
    }
  }
}

}  // namespace

template <typename OutT>
bool x86_kernel_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                        const QuantizedPlan& plan) {
  const int64_t height = image.sizes[2], width = image.sizes[3];
  const int64_t stride_y = image.strides[2];
  if (!avx2_supported() || plan.params.mode != Mode::kBilinear || image.sizes[1] != 4 ||
      image.strides[1] != 1 || image.strides[3] != 4 || output.strides[1] != 1 ||
      output.strides[3] != 4) {
    return false;
  }
  if (height < 2 || width < 2 || height >= (1 << 14) || width >= (1 << 14) || stride_y < 0 ||
      (height - 1) * stride_y + width * 4 >= (int64_t(1) << 31)) {
    return false;
  }
  if constexpr (std::is_same_v<OutT, int8_t>) {
    return plan.requant_shift >= 32 && plan.requant_shift <= 62 && plan.output_min >= -128 &&
           plan.output_max <= 127 && plan.output_zero_point >= -32768 &&
           plan.output_zero_point <= 32767 && plan.requant_multiplier > 0 &&
           plan.requant_multiplier < (int64_t(1) << 31);
  }
  return true;
}

template <typename GridT, typename OutT>
void grid_sample_quantized_x86(const View4<const int8_t>& image, const View4<const GridT>& grid,
                               const View4<OutT>& output, const QuantizedPlan& plan,
                               int64_t row_begin, int64_t row_end, bool avx512) {
  rows_x86(image, grid, output, plan, row_begin, row_end, avx512 && avx512_supported());
}

#else  // no vectorized kernel on this architecture

bool avx2_supported() { return false; }
bool avx512_supported() { return false; }

template <typename OutT>
bool x86_kernel_applies(const View4<const int8_t>&, const View4<OutT>&, const QuantizedPlan&) {
  return false;
}

template <typename GridT, typename OutT>
void grid_sample_quantized_x86(const View4<const int8_t>&, const View4<const GridT>&,
                               const View4<OutT>&, const QuantizedPlan&, int64_t, int64_t, bool) {
  std::abort();  // unreachable: x86_kernel_applies is false
}

#endif

template bool x86_kernel_applies<int8_t>(const View4<const int8_t>&, const View4<int8_t>&,
                                         const QuantizedPlan&);
template bool x86_kernel_applies<float>(const View4<const int8_t>&, const View4<float>&,
                                        const QuantizedPlan&);
#define ETKIT_INSTANTIATE(GridT, OutT)                                           \
  template void grid_sample_quantized_x86<GridT, OutT>(                         \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&, \
      const QuantizedPlan&, int64_t, int64_t, bool);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE

}  // namespace etkit::gridsampler
