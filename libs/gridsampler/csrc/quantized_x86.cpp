// The vectorized x86 kernel: docs/contract.md's integer steps for a 4-channel channels-last int8
// image, where one pixel is one 32-bit word and its two horizontal bilinear taps one 64-bit load.
// Each block of up to 256 output pixels of a row takes two passes: the taps and weights (steps 1 to
// 3), then the gathers, the interpolation and the requantization (steps 4 and 5). AVX2 and AVX-512
// compute coordinates in 32-bit lanes where the split product fits (quantized_x86_common.h), else
// in 64-bit integer lanes, else in float64; AVX2 does eight pixels at a time with 16-bit
// multiply-adds of tap differences, AVX-512 sixteen with byte dot products of the raw taps (VNNI). Every step gives the bits of the scalar steps
// (quantized_steps.h); the comments say why each rewrite is exact. Pixels with a tap outside the
// image that carries weight are redone by the scalar steps. The first pass runs a block ahead of
// the second and prefetches the image lines it will gather; the second gathers one step ahead of
// its arithmetic.
#include "quantized_x86.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "quantized_steps.h"
#include "quantized_x86_common.h"

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

using namespace x86;  // NOLINT: the shared forms (quantized_x86_common.h)


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
  Coordinates coordinates;
  AxisInteger x_integer, y_integer;
  AxisSplit x_split, y_split;
  AxisVector x_float, y_float;
  int32_t grid_zero_point, last_x0, last_y0, stride_y;  // last: size - 2
};

ETKIT_AVX2 inline __m256i load8(const int32_t* values) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(values));
}

ETKIT_AVX2 inline __m128i load4(const int32_t* values) {
  return _mm_load_si128(reinterpret_cast<const __m128i*>(values));
}

// Calls fill(std::integral_constant<Coordinates, C>()) with C = `coordinates` (kScalar for
// int8 grids), so that each first pass is compiled for one form of steps 1 and 2.
template <typename GridT, typename Fill>
void with_coordinates(Coordinates coordinates, const Fill& fill) {
  using C = Coordinates;
  core::with_form<GridT, C::kSplit, C::kInteger, C::kFloat, C::kScalar>(
      coordinates, false, [&](auto form, auto) { fill(form); });
}

// The block's taps, eight pixels at a time, steps 1 and 2 by `kCoordinates`; `grid` points at
// the block's first grid point.
template <typename GridT, Coordinates kCoordinates>
ETKIT_AVX2 void taps_block_avx2(const GridT* grid, int64_t grid_x, int64_t grid_axis,
                                int64_t count, const TapParams& t, const QuantizedPlan& p,
                                TapBlock* block) {
  const AxisRegisters regs_x = axis_registers(t.x_float), regs_y = axis_registers(t.y_float);
  const AxisInteger256 integer_x = axis_integer_registers_avx2(t.x_integer);
  const AxisInteger256 integer_y = axis_integer_registers_avx2(t.y_integer);
  const AxisSplit256 split_x = axis_split_registers_avx2(t.x_split, 0);
  const AxisSplit256 split_y = axis_split_registers_avx2(t.y_split, 1);
  const __m256i grid_zero = _mm256_set1_epi32(t.grid_zero_point);
  const __m256i weight_mask = _mm256_set1_epi32(0x7fff);
  const __m256i last_x0 = _mm256_set1_epi32(t.last_x0), last_y0 = _mm256_set1_epi32(t.last_y0);
  const __m256i stride_y = _mm256_set1_epi32(t.stride_y);
  const __m256i last_x1 = _mm256_set1_epi32(t.last_x0 + 1);
  const __m256i last_y1 = _mm256_set1_epi32(t.last_y0 + 1);
  const __m256i four = _mm256_set1_epi32(4);
  const __m256i thirty_two = _mm256_set1_epi32(32);
  for (int64_t i = 0; i < count; i += 8) {
    __m256i qx, qy;
    if constexpr (kCoordinates == Coordinates::kScalar) {
      alignas(32) int32_t tx[8], ty[8];
      for (int k = 0; k < 8; ++k) {
        const GridT* const grid_point = grid + (i + k) * grid_x;
        tx[k] = scalar_tap(steps::pixel_coordinate(grid_point[0], p, p.x), p.x.size);
        ty[k] = scalar_tap(steps::pixel_coordinate(grid_point[grid_axis], p, p.y), p.y.size);
      }
      qx = load8(tx);
      qy = load8(ty);
    } else {
      const __m256i xy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grid + i * 2));
      const __m256i gx = _mm256_srai_epi32(_mm256_slli_epi32(xy, 16), 16);
      const __m256i gy = _mm256_srai_epi32(xy, 16);
      if constexpr (kCoordinates == Coordinates::kSplit) {
        qx = split_tap_avx2(xy, split_x);
        qy = split_tap_avx2(xy, split_y);
      } else if constexpr (kCoordinates == Coordinates::kInteger) {
        qx = integer_tap_avx2(gx, integer_x);
        qy = integer_tap_avx2(gy, integer_y);
      } else {
        qx = vector_tap(_mm256_sub_epi32(gx, grid_zero), regs_x);
        qy = vector_tap(_mm256_sub_epi32(gy, grid_zero), regs_y);
      }
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


// The AVX-512 path, sixteen pixels at a time, restates steps 3 and 4 so that it needs neither
// per-pixel broadcasts nor 16-bit tap differences:
//
// - Step 3: wherever Q names a whole pixel k >= 1 (x0 = k with wx = 0), it names x0 = k - 1 with
//   wx = 2^15 instead (the same for y): the same taps with the same weights, so the value is the
//   same (below). So the far edge x0 = width - 1 needs no tap past it, every tap of a pixel on
//   the vector path is inside the image, and that holds exactly when 0 <= Q <= (width - 1) * 2^15
//   (and the same for y): x0 = max(Q - 1, 0) >> 15, wx = Q - x0 * 2^15, one unsigned compare.
// - Step 4: with h = (wx * wy) >> 15, l = (wx * wy) & 0x7fff and the tap weights
//   c00 = 2^15 - wx - wy + h, c01 = wx - h, c10 = wy - h, c11 = h (each in [0, 2^15], summing
//   to 2^15), the scalar value v00 * 2^15 + a * wx + e * wy + b * h + (b * l + 2^14) >> 15
//   (see the AVX2 step 4 above) is
//     sum(c * q) - zero * 2^15 + (b * l + 2^14) >> 15,   b = q00 - q01 - q10 + q11,
//   with q the raw int8 taps: expanding a, e and b gives the c, and the zero point drops out of b
//   and leaves -zero * sum(c). With wx = 2^15 (the edge form) h = wy and l = 0, so the weights
//   move from the tap at x0 + 2 to the tap at x0 + 1 and the last term stays 0: the same value.
//   sum(c * q) is two byte dot products (VNNI), over the low and the high bytes of the c, and b
//   a third one, of q + 128 with (1, -1, -1, 1).
// - Lanes: a vector holds one channel pair of eight pixels ([c0 of pixels 0-7 | c1 of 0-7]), so
//   the weights of eight pixels are one 256-bit broadcast load.


// What the AVX-512 sampling pass needs, per pixel.
struct WideTapBlock {
  alignas(64) int32_t offsets[kBlock];       // bytes from the plane to tap (x0, y0); 0 if not
                                             // on the vector path
  alignas(64) uint32_t low_weights[kBlock];  // bytes c00, c01, c10, c11 mod 2^8
  alignas(64) uint32_t high_weights[kBlock];  // bytes c00, c01, c10, c11 >> 8 (at most 128)
  alignas(64) int32_t cross[kBlock];          // l
  int inside[kBlock / 8];  // per 8 pixels, bit i: pixel i is on the vector path
};


// Steps 1 to 3 for a block of pixels (count a multiple of 8), sixteen at a time: Q of each axis
// by `kCoordinates` (int16 grids in (x, y) pairs for the vector forms), then the edge form, the
// offsets and the weights.
template <typename GridT, Coordinates kCoordinates>
ETKIT_AVX512 __attribute__((noinline)) void taps_block_wide(const GridT* grid, int64_t grid_x,
                                                            int64_t grid_axis, int64_t count,
                                                            const TapParams& t,
                                                            const QuantizedPlan& p,
                                                            WideTapBlock* block) {
  const AxisInteger512 integer_x = axis_integer_registers(t.x_integer);
  const AxisInteger512 integer_y = axis_integer_registers(t.y_integer);
  const AxisSplit512 split_x = axis_split_registers(t.x_split, 0);
  const AxisSplit512 split_y = axis_split_registers(t.y_split, 1);
  const AxisRegisters512 float_x = axis_registers_avx512(t.x_float);
  const AxisRegisters512 float_y = axis_registers_avx512(t.y_float);
  const __m512i grid_zero = _mm512_set1_epi32(t.grid_zero_point);
  const __m512i weight_mask = _mm512_set1_epi32(0x7fff);
  const __m512i full = _mm512_set1_epi32(1 << kWeightBits);
  const __m512i stride_y = _mm512_set1_epi32(t.stride_y);
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  // the largest Q on the vector path: (size - 1) * 2^15
  const __m512i last_qx = _mm512_set1_epi32((t.last_x0 + 1) << kWeightBits);
  const __m512i last_qy = _mm512_set1_epi32((t.last_y0 + 1) << kWeightBits);
  static constexpr std::array<uint8_t, 64> kLowIndex = weight_byte_index(0);
  static constexpr std::array<uint8_t, 64> kHighIndex = weight_byte_index(1);
  const __m512i low_index = _mm512_loadu_si512(kLowIndex.data());
  const __m512i high_index = _mm512_loadu_si512(kHighIndex.data());
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = count - i >= 16 ? 0xFFFF : 0x00FF;
    __m512i qx, qy;
    if constexpr (kCoordinates == Coordinates::kScalar) {
      alignas(64) int32_t tx[16] = {}, ty[16] = {};
      for (int64_t k = 0; k < std::min<int64_t>(16, count - i); ++k) {
        const GridT* const grid_point = grid + (i + k) * grid_x;
        tx[k] = scalar_tap(steps::pixel_coordinate(grid_point[0], p, p.x), p.x.size);
        ty[k] = scalar_tap(steps::pixel_coordinate(grid_point[grid_axis], p, p.y), p.y.size);
      }
      qx = _mm512_load_si512(tx);
      qy = _mm512_load_si512(ty);
    } else {
      const __m512i xy = _mm512_maskz_loadu_epi32(lanes, grid + i * 2);
      const __m512i gx = _mm512_srai_epi32(_mm512_slli_epi32(xy, 16), 16);
      const __m512i gy = _mm512_srai_epi32(xy, 16);
      if constexpr (kCoordinates == Coordinates::kSplit) {
        qx = split_tap(xy, split_x);
        qy = split_tap(xy, split_y);
      } else if constexpr (kCoordinates == Coordinates::kInteger) {
        qx = integer_tap(gx, integer_x);
        qy = integer_tap(gy, integer_y);
      } else {
        qx = vector_tap_avx512(_mm512_sub_epi32(gx, grid_zero), float_x);
        qy = vector_tap_avx512(_mm512_sub_epi32(gy, grid_zero), float_y);
      }
    }
    // the edge form (above), wherever Q is a whole pixel but 0
    const __m512i x0 =
        _mm512_srai_epi32(_mm512_max_epi32(_mm512_sub_epi32(qx, one), zero), kWeightBits);
    const __m512i y0 =
        _mm512_srai_epi32(_mm512_max_epi32(_mm512_sub_epi32(qy, one), zero), kWeightBits);
    const __m512i wx = _mm512_sub_epi32(qx, _mm512_slli_epi32(x0, kWeightBits));
    const __m512i wy = _mm512_sub_epi32(qy, _mm512_slli_epi32(y0, kWeightBits));
    const __mmask16 inside =
        _mm512_cmple_epu32_mask(qx, last_qx) & _mm512_cmple_epu32_mask(qy, last_qy);
    const __m512i offsets =
        _mm512_add_epi32(_mm512_mullo_epi32(y0, stride_y), _mm512_slli_epi32(x0, 2));
    const __m512i product = _mm512_mullo_epi32(wx, wy);  // at most 2^30
    const __m512i h = _mm512_srli_epi32(product, kWeightBits);
    const __m512i c01 = _mm512_sub_epi32(wx, h), c10 = _mm512_sub_epi32(wy, h);
    const __m512i c00 = _mm512_sub_epi32(_mm512_sub_epi32(full, wx), c10);
    const __m512i pairs_0 = _mm512_packus_epi32(c00, c01), pairs_1 = _mm512_packus_epi32(c10, h);
    _mm512_mask_store_epi32(block->offsets + i, lanes, _mm512_maskz_mov_epi32(inside, offsets));
    _mm512_mask_store_epi32(block->low_weights + i, lanes,
                            _mm512_permutex2var_epi8(pairs_0, low_index, pairs_1));
    _mm512_mask_store_epi32(block->high_weights + i, lanes,
                            _mm512_permutex2var_epi8(pairs_0, high_index, pairs_1));
    _mm512_mask_store_epi32(block->cross + i, lanes, _mm512_and_si512(product, weight_mask));
    block->inside[i / 8] = inside & 0xFF;
    if (lanes == 0xFFFF) {
      block->inside[i / 8 + 1] = inside >> 8;
    }
  }
}


// Byte indexes into [U | L] (the upper and lower rows' gathered taps of eight pixels, [v00 |
// v01] and [v10 | v11] per pixel) giving, per 32-bit lane, one pixel's taps of one channel
// [q00, q01, q10, q11]: lanes 0-7 channel 2 pair, pixels 0-7; lanes 8-15 channel 2 pair + 1.
constexpr std::array<uint8_t, 64> tap_byte_index(int pair) {
  std::array<uint8_t, 64> index{};
  for (int lane = 0; lane < 16; ++lane) {
    const int pixel = lane % 8, channel = 2 * pair + lane / 8;
    index[4 * lane + 0] = static_cast<uint8_t>(8 * pixel + channel);
    index[4 * lane + 1] = static_cast<uint8_t>(8 * pixel + 4 + channel);
    index[4 * lane + 2] = static_cast<uint8_t>(64 + 8 * pixel + channel);
    index[4 * lane + 3] = static_cast<uint8_t>(64 + 8 * pixel + 4 + channel);
  }
  return index;
}

// Where each output byte (pixel * 4 + channel, sixteen pixels) sits after
// packs_epi16(packs_epi32(v0, v1), packs_epi32(v2, v3)) of the four value vectors (v[2g + k]:
// pixels 8g to 8g + 7, channels 2k and 2k + 1, as tap_byte_index lays them out). The packs work
// within 128-bit lanes.
constexpr std::array<uint8_t, 64> output_byte_index() {
  std::array<uint8_t, 64> index{};
  for (int position = 0; position < 64; ++position) {
    const int lane = position / 16, t = position % 16;
    const int vector = (t < 8 ? 0 : 2) + (t % 8) / 4;  // which of v0 .. v3
    const int element = 4 * lane + t % 4;               // which 32-bit lane of it
    const int pixel = 8 * (vector / 2) + element % 8;
    const int channel = 2 * (vector % 2) + element / 8;
    index[4 * pixel + channel] = static_cast<uint8_t>(position);
  }
  return index;
}

// The float output's order: for pixels 8g + 4h to 8g + 4h + 3, element e of
// permutex2var_ps(v[2g], index, v[2g + 1]) is channel e % 4 of pixel e / 4.
constexpr std::array<int32_t, 16> float_index(int h) {
  std::array<int32_t, 16> index{};
  for (int e = 0; e < 16; ++e) {
    const int channel = e % 4, pixel = 4 * h + e / 4;
    index[e] = (channel < 2 ? 0 : 16) + 8 * (channel % 2) + pixel;
  }
  return index;
}

// Eight 32-bit values, twice.
ETKIT_AVX512 inline __m512i broadcast8(const void* eight) {
  return _mm512_broadcast_i64x4(_mm256_load_si256(static_cast<const __m256i*>(eight)));
}

// Steps 4 and 5 (the second pass) for pixels [0, count) of a block, count a multiple of 16,
// sixteen pixels at a time. kFolded: int8 output whose step 5 constants are all in `init`.
template <typename OutT, bool kFolded>
ETKIT_AVX512 __attribute__((noinline)) void sample_block_wide(const WideTapBlock& block,
                                                              int64_t count,
                                                              const long long* upper_base,
                                                              const long long* lower_base,
                                                              OutT* out, const WideSample& s) {
  static constexpr std::array<uint8_t, 64> kTapIndex0 = tap_byte_index(0);
  static constexpr std::array<uint8_t, 64> kTapIndex1 = tap_byte_index(1);
  static constexpr std::array<uint8_t, 64> kOutputIndex = output_byte_index();
  static constexpr std::array<int32_t, 16> kFloatIndex0 = float_index(0);
  static constexpr std::array<int32_t, 16> kFloatIndex1 = float_index(1);
  const __m512i tap_index[2] = {_mm512_loadu_si512(kTapIndex0.data()),
                                _mm512_loadu_si512(kTapIndex1.data())};
  const __m512i output_index = _mm512_loadu_si512(kOutputIndex.data());
  const __m512i float_order[2] = {_mm512_loadu_si512(kFloatIndex0.data()),
                                  _mm512_loadu_si512(kFloatIndex1.data())};
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i signs = _mm512_set1_epi32(0x01FFFF01);  // bytes 1, -1, -1, 1
  const __m512i lower_one = _mm512_set1_epi32(1);  // 16-bit lanes 1, 0
  const __m512i init = _mm512_set1_epi32(s.init);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i multiplier = _mm512_set1_epi32(s.multiplier);
  const __m512i add = _mm512_set1_epi32(s.add);
  const __m512i after_zero = _mm512_set1_epi32(s.after_zero_point);
  const __m512i below_step = _mm512_set1_epi32(static_cast<int32_t>((int64_t(1) << s.shift) - 1));
  const __m512i not_one = _mm512_set1_epi32(~1);
  const __m512i shift = _mm512_set1_epi32(s.shift);  // a vector count: one uop
  const __m512i output_min = _mm512_set1_epi8(s.output_min);
  const __m512i output_max = _mm512_set1_epi8(s.output_max);
  const __m512 float_scale = _mm512_set1_ps(s.float_scale);

  const auto requantize = [&](__m512i value) ETKIT_AVX512 {
    // kFolded: m = 1, and the rounding and the zero point are in the value already
    const __m512i y =
        kFolded ? value : _mm512_add_epi32(_mm512_mullo_epi32(value, multiplier), add);
    // halves up, then a tie (nothing below the step) made even
    __m512i q = _mm512_srav_epi32(y, shift);
    q = _mm512_mask_and_epi32(q, _mm512_testn_epi32_mask(y, below_step), q, not_one);
    return kFolded ? q : _mm512_add_epi32(q, after_zero);
  };
  // [upper, lower] of pixels 0-7, then of 8-15; gathered one step ahead, so that their latency
  // overlaps the arithmetic.
  const auto gather_taps = [&](int64_t i, __m512i* taps) ETKIT_AVX512 {
    const __m512i offsets = _mm512_load_si512(block.offsets + i);
    const __m256i first = _mm512_castsi512_si256(offsets);
    const __m256i second = _mm512_extracti64x4_epi64(offsets, 1);
    taps[0] = _mm512_i32gather_epi64(first, upper_base, 1);
    taps[1] = _mm512_i32gather_epi64(first, lower_base, 1);
    taps[2] = _mm512_i32gather_epi64(second, upper_base, 1);
    taps[3] = _mm512_i32gather_epi64(second, lower_base, 1);
  };
  __m512i taps[4], next[4];
  if (count > 0) {
    gather_taps(0, taps);
  }
  for (int64_t i = 0; i < count; i += 16) {
    if (i + 16 < count) {
      gather_taps(i + 16, next);
    }
    __m512i values[4];  // values[2g + k]: pixels 8g to 8g + 7, channels 2k and 2k + 1
    for (int g = 0; g < 2; ++g) {
      const __m512i low_weights = broadcast8(block.low_weights + i + 8 * g);
      const __m512i high_weights = broadcast8(block.high_weights + i + 8 * g);
      const __m512i cross = broadcast8(block.cross + i + 8 * g);
      for (int k = 0; k < 2; ++k) {
        const __m512i q = _mm512_permutex2var_epi8(taps[2 * g], tap_index[k], taps[2 * g + 1]);
        // b in the low 16 bits (|b| <= 510), its sign above, which meets cross's zero upper half:
        // mulhrs gives (b * l + 2^14) >> 15 below and 0 above, and the last multiply-add adds the
        // lower half, sign-extended
        const __m512i b = _mm512_dpbusd_epi32(zero, _mm512_xor_si512(q, bias), signs);
        const __m512i rounded_bl = _mm512_mulhrs_epi16(b, cross);
        const __m512i high = _mm512_dpbusd_epi32(init, high_weights, q);
        const __m512i linear = _mm512_dpbusd_epi32(_mm512_slli_epi32(high, 8), low_weights, q);
        values[2 * g + k] = _mm512_dpwssd_epi32(linear, rounded_bl, lower_one);
      }
    }
    if constexpr (std::is_same_v<OutT, int8_t>) {
      // saturating packs; the clamp to the output range after them gives the clamp of step 5
      __m512i bytes = _mm512_packs_epi16(
          _mm512_packs_epi32(requantize(values[0]), requantize(values[1])),
          _mm512_packs_epi32(requantize(values[2]), requantize(values[3])));
      if (s.clamp) {
        bytes = _mm512_min_epi8(_mm512_max_epi8(bytes, output_min), output_max);
      }
      _mm512_storeu_si512(out + i * 4, _mm512_permutexvar_epi8(output_index, bytes));
    } else {
      for (int g = 0; g < 2; ++g) {
        const __m512 first = _mm512_mul_ps(_mm512_cvtepi32_ps(values[2 * g]), float_scale);
        const __m512 second = _mm512_mul_ps(_mm512_cvtepi32_ps(values[2 * g + 1]), float_scale);
        for (int h = 0; h < 2; ++h) {
          _mm512_storeu_ps(out + (i + 8 * g + 4 * h) * 4,
                           _mm512_permutex2var_ps(first, float_order[h], second));
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      taps[k] = next[k];
    }
  }
}

// One output row's blocks in the two passes: first_pass(ox, block) fills a block and returns its
// pixel count, second_pass(ox, count, block) samples it; the first pass runs a block ahead, so
// that the image lines it prefetches have arrived when the second gathers them. Returns the
// first pixel left for the scalar steps.
template <typename Block, typename FirstPass, typename SecondPass>
int64_t two_pass_row(int64_t out_width, Block* blocks, const FirstPass& first_pass,
                     const SecondPass& second_pass) {
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
  return ox;
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
  constexpr bool kInt16Grid = std::is_same_v<GridT, int16_t>;
  steps::Plane plane{nullptr, image.sizes[1], height, width, image.strides[1], image.strides[2],
                     image.strides[3]};
  const AxisVector axis_x = plan_axis_vector(p.x, p.grid_zero_point, p.params.padding, kInt16Grid);
  const AxisVector axis_y = plan_axis_vector(p.y, p.grid_zero_point, p.params.padding, kInt16Grid);
  const bool pairs = grid_axis == 1 && grid_x == 2;  // (x, y) pairs, one after the other
  const AxisInteger integer_x =
      plan_axis_integer(p.x, p.grid_zero_point, p.params.padding, kInt16Grid);
  const AxisInteger integer_y =
      plan_axis_integer(p.y, p.grid_zero_point, p.params.padding, kInt16Grid);
  const AxisSplit split_x = plan_axis_split(integer_x), split_y = plan_axis_split(integer_y);
  const bool integer = integer_x.applies && integer_y.applies;
  const bool split = split_x.applies && split_y.applies;
  const TapParams taps{
      !pairs ? Coordinates::kScalar
             : (split ? Coordinates::kSplit
                      : (integer ? Coordinates::kInteger
                                 : (axis_x.applies && axis_y.applies ? Coordinates::kFloat
                                                                     : Coordinates::kScalar))),
      integer_x,
      integer_y,
      split_x,
      split_y,
      axis_x,
      axis_y,
      static_cast<int32_t>(p.grid_zero_point),
      static_cast<int32_t>(width - 2),
      static_cast<int32_t>(height - 2),
      static_cast<int32_t>(image.strides[2])};
  const NarrowRequant narrow = narrow_requant(p.requant_multiplier, p.requant_shift);
  // AVX-512 for both passes where the 32-bit requantization applies, else AVX2.
  const bool use_wide = wide && (std::is_same_v<OutT, float> || narrow.applies);
  const WideSample wide_sample = plan_wide_sample(p, narrow, std::is_same_v<OutT, float>);
  const __m256i zero_16 = _mm256_set1_epi16(static_cast<int16_t>(p.image_zero_point));
  // the pixels of values[0 .. 3] below, as indexes into a vector of eight pixels' weights
  const __m256i pixel_index[4] = {_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2),
                                  _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3),
                                  _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6),
                                  _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7)};
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
  WideTapBlock wide_blocks[2];

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
    // The pixels of a block with a tap outside the image, by the scalar steps.
    const auto redo_outside = [&](int64_t ox, int64_t count, const int* inside) {
      for (int64_t j = 0; j < count; j += 8) {
        const int inside_mask = inside[j / 8];
        if (inside_mask != 0xFF) {
          for (int k = 0; k < 8; ++k) {
            if ((inside_mask & (1 << k)) == 0) {
              scalar_pixel(ox + j + k);
            }
          }
        }
      }
    };
    // The image lines the gathers will read, requested a block ahead: their addresses are not
    // a stream the hardware prefetchers follow.
    const auto prefetch = [&](const int32_t* upper, const int32_t* lower, int64_t count) {
      for (int64_t j = 0; j < count; j += 8) {
        _mm_prefetch(reinterpret_cast<const char*>(upper_base) + upper[j], _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(lower_base) + lower[j], _MM_HINT_T0);
      }
    };
    // The grid points two blocks on (the first pass reads the next block's): while the gathers
    // run, the hardware prefetchers fall behind on the grid's stream (measured: 1.03x with the
    // data in cache, 1.1-1.2x where other work has evicted it). A prefetch never faults, so
    // one past the grid's end is harmless.
    const auto prefetch_grid = [&](int64_t ox, int64_t count) {
      if (!pairs) {
        return;
      }
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(grid_row) +
                              static_cast<uintptr_t>(ox + 2 * kBlock) * 2 * sizeof(GridT);
      for (int64_t b = 0; b < count * 2 * int64_t(sizeof(GridT)); b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + b), _MM_HINT_T0);
      }
    };
    const auto block_count = [&](int64_t ox) {
      return std::min<int64_t>(kBlock, (out_width - ox) / 8 * 8);
    };
    const auto wide_first_pass = [&](int64_t ox, WideTapBlock* block) ETKIT_AVX2 {
      const int64_t count = block_count(ox);
      const GridT* const first = grid_row + ox * grid_x;
      with_coordinates<GridT>(taps.coordinates, [&](auto form) ETKIT_AVX2 {
        taps_block_wide<GridT, decltype(form)::value>(first, grid_x, grid_axis, count, taps, p,
                                                      block);
      });
      prefetch(block->offsets, block->offsets, count);
      prefetch_grid(ox, count);
      return count;
    };
    const auto wide_second_pass = [&](int64_t ox, int64_t count, const WideTapBlock& block) {
      const int64_t vector_count = count / 16 * 16;
      OutT* const out = output_row + ox * 4;
      if (std::is_same_v<OutT, float> || wide_sample.folded) {
        sample_block_wide<OutT, true>(block, vector_count, upper_base, lower_base, out,
                                      wide_sample);
      } else {
        sample_block_wide<OutT, false>(block, vector_count, upper_base, lower_base, out,
                                       wide_sample);
      }
      for (int64_t k = vector_count; k < count; ++k) {
        scalar_pixel(ox + k);  // the last 8 of a row (count is a multiple of 8)
      }
      redo_outside(ox, vector_count, block.inside);
    };
    const auto first_pass = [&](int64_t ox, TapBlock* block) ETKIT_AVX2 {
      const int64_t count = block_count(ox);
      with_coordinates<GridT>(taps.coordinates, [&](auto form) ETKIT_AVX2 {
        taps_block_avx2<GridT, decltype(form)::value>(grid_row + ox * grid_x, grid_x, grid_axis,
                                                      count, taps, p, block);
      });
      prefetch(block->offsets, block->lower_offsets, count);
      prefetch_grid(ox, count);
      return count;
    };
    const auto second_pass = [&](int64_t ox, int64_t count, const TapBlock& block) ETKIT_AVX2 {
      // The gathered taps of four pixels, [upper, lower], one iteration ahead.
      const auto gather_group = [&](int64_t first, __m256i* taps) ETKIT_AVX2 {
        const __m256i shift = _mm256_cvtepu32_epi64(load4(block.shifts + first));
        taps[0] = _mm256_srlv_epi64(
            _mm256_i32gather_epi64(upper_base, load4(block.offsets + first), 1), shift);
        taps[1] = _mm256_srlv_epi64(
            _mm256_i32gather_epi64(lower_base, load4(block.lower_offsets + first), 1), shift);
      };
      __m256i taps[4], next[4];
      if (count > 0) {
        gather_group(0, taps);
        gather_group(4, taps + 2);
      }
      for (int64_t i = 0; i < count; i += 8) {
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
      redo_outside(ox, count, block.inside);
    };
    int64_t ox = use_wide ? two_pass_row(out_width, wide_blocks, wide_first_pass, wide_second_pass)
                          : two_pass_row(out_width, blocks, first_pass, second_pass);
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
  return core::requant_fits_lanes<OutT>(plan);
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
