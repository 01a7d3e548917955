// The vectorized x86 kernel for every configuration the 4-channel bilinear one
// (quantized_x86.cpp) leaves: nearest sampling, every channel count and both layouts, with
// AVX-512 (F, BW, DQ, VL, VBMI, VNNI), sixteen output pixels at a time, and with AVX2, eight
// (below, "AVX2"). Every step gives the bits of the scalar steps (quantized_steps.h); the
// comments say why each rewrite is exact.
//
// Each block of up to 256 output pixels (an output row, or several: rows that follow each other
// in the grid and in the output are one run) takes two passes:
//
// 1. Steps 1 to 3 of each axis (they do not depend on the channels): Q = round(P / 2^17) for
//    bilinear (x0 = Q >> 15, wx = Q & 0x7fff, as scalar_tap), the pixel index for nearest. Int16
//    grids take the integer or float64 forms (quantized_forms.h, quantized_x86_common.h) where
//    they apply (zeros and border padding), else the exact 64-bit form (any padding); int8 grids
//    read a table of the scalar steps' result for each of the 256 grid values.
// 2. Per layout, the taps, steps 4 and 5 and the stores:
//    - planar images (NCHW, or one channel): per channel plane, the two taps of a row are one
//      32-bit gather (the upper and the lower row: two), their four bytes one 32-bit lane
//      [q00, q01, q10, q11]. Taps outside the image need no scalar steps: a tap outside reads the
//      image zero point (v = q - zero = 0, as the scalar steps' zero), so every pixel stays on
//      the vector path, in every padding mode. The gather reads the row's taps at a clamped
//      position, shifted into place;
//    - 2 channels (channels-last): the same with 16-bit taps, the lane of channel c picked from
//      the gathered words;
//    - 3, 8 and multiples of 16 channels (channels-last): the pixel's taps are loaded (64-bit
//      gathers for 3, 16-byte loads for 8, 32-byte loads per 16 channels); pixels with a tap
//      outside the image that carries weight are redone by the scalar steps, as in
//      quantized_x86.cpp;
//    - nearest, every layout: the source pixel's bytes (a gather or a load), the image zero
//      point where it is outside the image, then step 5 as a 256-entry table of the scalar
//      requantization of each int8 value (vpermt2b), or the float32 product.
//    Step 4 is the byte dot products of quantized_x86.cpp's AVX-512 pass (VNNI) over the lanes
//    [q00, q01, q10, q11], step 5 its 32-bit requantization where that applies and a 64-bit one
//    otherwise.
//
// The kinds, the set-up and the rows loop are quantized_core.h's; pass 1 and the nearest pass
// are written once with NEON (quantized_pass1.h, quantized_nearest.h), x86's part of the nearest
// pass and the planar passes' taps once for both targets (quantized_x86_pass2.h), over the
// Avx512 and Avx2 traits below; what is written here per target is where their instructions
// differ (step 4 and 5 of bilinear, the channels-last passes).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quantized_steps.h"
#include "quantized_x86.h"
#include "quantized_x86_common.h"

namespace etkit::gridsampler {

#ifdef ETKIT_HAVE_X86_KERNEL

namespace {

using namespace x86;  // NOLINT: the shared forms (quantized_x86_common.h)

using core::Kind;
using core::kRun;

enum class Requant { kFolded, kNarrow, kWide, kFloat };

// Everything both passes need, derived once per call: the core's set-up and x86's own forms.
struct Setup : core::Setup {
  AxisSplit split_x, split_y;
  AxisVector float_x, float_y;
  Requant requant;
  WideSample sample;
};

// Pass 1's result for a block.
struct Coords {
  alignas(64) int32_t x[kRun];
  alignas(64) int32_t y[kRun];
  // Where a block spans batch elements (a run of whole outputs, see rows_any): each pixel's
  // image offset from the run's plane, and the largest.
  bool batched;
  int32_t plane_max;
  alignas(64) int32_t plane[kRun];
};

// ---- pass 2: shared pieces ----

inline __m128i load16(const int8_t* bytes) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
}

inline __mmask16 lane_mask(int64_t left) {
  return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
}

inline __mmask64 byte_mask(int64_t bytes) {
  return bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
}

// Step 4's weights of sixteen pixels in the dot products' form (see quantized_x86.cpp's AVX-512
// pass): per pixel, the low and the high bytes of c00, c01, c10, c11 and the cross term l.
struct Weights {
  __m512i low, high, cross;
};

// kBelowFull: wx, wy < 2^15 (no edge form), so that one 16-bit multiply-add forms their product.
template <bool kBelowFull = false>
ETKIT_AVX512 inline Weights pixel_weights(__m512i wx, __m512i wy) {
  static constexpr std::array<uint8_t, 64> kLowIndex = weight_byte_index(0);
  static constexpr std::array<uint8_t, 64> kHighIndex = weight_byte_index(1);
  const __m512i full = _mm512_set1_epi32(1 << kWeightBits);
  // at most 2^30; the upper 16 bits of wx and wy are 0
  const __m512i product = kBelowFull ? _mm512_madd_epi16(wx, wy) : _mm512_mullo_epi32(wx, wy);
  const __m512i h = _mm512_srli_epi32(product, kWeightBits);
  const __m512i c01 = _mm512_sub_epi32(wx, h), c10 = _mm512_sub_epi32(wy, h);
  const __m512i c00 = _mm512_sub_epi32(_mm512_sub_epi32(full, wx), c10);
  const __m512i pairs_0 = _mm512_packus_epi32(c00, c01), pairs_1 = _mm512_packus_epi32(c10, h);
  return {_mm512_permutex2var_epi8(pairs_0, _mm512_loadu_si512(kLowIndex.data()), pairs_1),
          _mm512_permutex2var_epi8(pairs_0, _mm512_loadu_si512(kHighIndex.data()), pairs_1),
          _mm512_and_si512(product, _mm512_set1_epi32(0x7fff))};
}

// Step 4 for sixteen lanes of taps [q00, q01, q10, q11] (raw int8) with their weights: the value
// with 15 fractional bits, less the image zero point, plus `init` * 2^8 (WideSample).
ETKIT_AVX512 inline __m512i blend(__m512i q, const Weights& w, __m512i init) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i signs = _mm512_set1_epi32(0x01FFFF01);  // bytes 1, -1, -1, 1
  const __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(q, bias), signs);
  const __m512i rounded_bl = _mm512_mulhrs_epi16(b, w.cross);
  const __m512i high = _mm512_dpbusd_epi32(init, w.high, q);
  const __m512i linear = _mm512_dpbusd_epi32(_mm512_slli_epi32(high, 8), w.low, q);
  return _mm512_dpwssd_epi32(linear, rounded_bl, _mm512_set1_epi32(1));
}

// Step 5's constants in registers.
struct Finish {
  Requant requant;
  __m512i init;
  __m512i multiplier, add, after_zero, below_step, not_one;
  __m512i shift;  // a vector count (one uop, where an xmm count takes two)
  __m512i wide_multiplier, wide_round, one64;
  __m128i wide_shift;
  __m512i output_zero;
  __m128i output_min, output_max;
  bool clamp;
  __m512 float_scale;
  __m512i image_zero;
  bool identity_table;
  __m512i table[4];  // output_table: raw values 0..63, 64..127, -128..-65, -64..-1
};

// (always inlined: each block builds them once, in registers, as it did before the set-up moved
// to quantized_core.h; GCC then stopped inlining it on its own, measured 5-7% on small blocks)
ETKIT_AVX512 __attribute__((always_inline)) inline Finish finish_registers(const Setup& s) {
  Finish f{};
  f.requant = s.requant;
  f.init = _mm512_set1_epi32(s.sample.init);
  f.multiplier = _mm512_set1_epi32(s.sample.multiplier);
  f.add = _mm512_set1_epi32(s.sample.add);
  f.after_zero = _mm512_set1_epi32(s.sample.after_zero_point);
  f.below_step = _mm512_set1_epi32(
      static_cast<int32_t>((int64_t(1) << std::min(s.sample.shift, 31)) - 1));
  f.not_one = _mm512_set1_epi32(~1);
  f.shift = _mm512_set1_epi32(s.sample.shift);
  f.wide_multiplier = _mm512_set1_epi64(s.wide_multiplier);
  f.wide_round = _mm512_set1_epi64((int64_t(1) << (s.wide_shift - 1)) - 1);
  f.one64 = _mm512_set1_epi64(1);
  f.wide_shift = _mm_cvtsi64_si128(s.wide_shift);
  f.output_zero = _mm512_set1_epi32(s.output_zero_point);
  f.output_min = _mm_set1_epi8(s.output_min);
  f.output_max = _mm_set1_epi8(s.output_max);
  f.clamp = s.output_min > -128 || s.output_max < 127;
  f.float_scale = _mm512_set1_ps(s.float_scale);
  f.image_zero = _mm512_set1_epi32(s.image_zero_point);
  f.identity_table = s.identity_table;
  for (int k = 0; k < 4; ++k) {
    f.table[k] = _mm512_loadu_si512(s.output_table + 64 * k);
  }
  return f;
}

// Step 5 for sixteen values from blend (int8 output): the output, before its clamp.
ETKIT_AVX512 inline __m512i requantize(__m512i value, const Finish& f) {
  if (f.requant == Requant::kWide) {
    // shift_round_half_even(value * M, k) in 64-bit lanes: (x + 2^(k-1) - 1 + bit k of x) >> k
    __m512i even = _mm512_mul_epi32(value, f.wide_multiplier);
    __m512i odd = _mm512_mul_epi32(_mm512_srli_epi64(value, 32), f.wide_multiplier);
    even = _mm512_add_epi64(
        even, _mm512_add_epi64(f.wide_round,
                               _mm512_and_si512(_mm512_srl_epi64(even, f.wide_shift), f.one64)));
    odd = _mm512_add_epi64(
        odd, _mm512_add_epi64(f.wide_round,
                              _mm512_and_si512(_mm512_srl_epi64(odd, f.wide_shift), f.one64)));
    const __m512i q =
        _mm512_mask_blend_epi32(0xAAAA, _mm512_sra_epi64(even, f.wide_shift),
                                _mm512_slli_epi64(_mm512_sra_epi64(odd, f.wide_shift), 32));
    return _mm512_add_epi32(q, f.output_zero);
  }
  // the 32-bit form of quantized_x86.cpp: halves up, then a tie (nothing below the step) made
  // even
  const __m512i y = f.requant == Requant::kFolded
                        ? value
                        : _mm512_add_epi32(_mm512_mullo_epi32(value, f.multiplier), f.add);
  __m512i q = _mm512_srav_epi32(y, f.shift);
  q = _mm512_mask_and_epi32(q, _mm512_testn_epi32_mask(y, f.below_step), q, f.not_one);
  return f.requant == Requant::kFolded ? q : _mm512_add_epi32(q, f.after_zero);
}

// Sixteen requantized values (int32 lanes) to sixteen int8 outputs: saturated, then clamped to
// the output range (the clamp of step 5, as the range lies within int8).
ETKIT_AVX512 inline __m128i to_bytes(__m512i q, const Finish& f) {
  __m128i bytes = _mm512_cvtsepi32_epi8(q);
  if (f.clamp) {
    bytes = _mm_min_epi8(_mm_max_epi8(bytes, f.output_min), f.output_max);
  }
  return bytes;
}

// Sixteen values from blend to the output: `count` of them (from the first) stored at `out`.
template <typename OutT>
ETKIT_AVX512 inline void store_values(__m512i value, const Finish& f, OutT* out, __mmask16 lanes) {
  if constexpr (std::is_same_v<OutT, int8_t>) {
    _mm_mask_storeu_epi8(out, lanes, to_bytes(requantize(value, f), f));
  } else {
    _mm512_mask_storeu_ps(out, lanes, _mm512_mul_ps(_mm512_cvtepi32_ps(value), f.float_scale));
  }
}

// Nearest, step 5: 64 raw image values (int8) to their int8 outputs, by the table.
ETKIT_AVX512 inline __m512i table_lookup(__m512i raw, const Finish& f) {
  if (f.identity_table) {
    return raw;
  }
  // vpermt2b reads 7 index bits: 0..127 from table[0..1], and the same bits from table[2..3]
  // for the negative values (bit 7 set)
  const __m512i positive = _mm512_permutex2var_epi8(f.table[0], raw, f.table[1]);
  const __m512i negative = _mm512_permutex2var_epi8(f.table[2], raw, f.table[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(raw), positive, negative);
}

// One run of output pixels of batch element n: what the second pass needs besides the block.
struct Run {
  const int8_t* plane;  // image data of batch element n
  int64_t plane_offset;  // its offset in the image, bytes
  const void* grid;      // the run's first grid point (GridT)
  void* out;             // the run's first output pixel (OutT)
  int64_t output_c, output_x;
};

// ---- pass 2, nearest: step 5 and the byte orders per target ----

// 3 channels: the first three bytes of each 32-bit lane.
constexpr std::array<uint8_t, 64> compress3_index() {
  std::array<uint8_t, 64> index{};
  for (int g = 0; g < 48; ++g) {
    index[g] = static_cast<uint8_t>(4 * (g / 3) + g % 3);
  }
  return index;
}

// ---- AVX2: eight pixels at a time; its forms of pass 1 and step 5 ----
//
// The same passes with 256-bit lanes. AVX2 has neither byte dot products nor 64-bit shifts,
// compares or byte permutes across 128-bit halves, so:
// - steps 1 to 3: the integer and float64 forms of quantized_x86.cpp for bilinear zeros and
//   border, the nearest integer form with the arithmetic shift as a logical one of X + 2^62
//   (X + 2^62 >= 0; 2^62 is a multiple of 2^S, so neither the quotient less 2^(62 - S) nor the
//   low bits change), int8 tables, and the scalar steps elsewhere (reflection);
// - step 4 from the lanes [q00, q01, q10, q11] in 16-bit multiply-adds: with the words
//   [q00, q10], d = [q01 - q00, q11 - q10] = [a, a'] and b = a' - a, the value
//   (q00 - zero) * 2^15 + a * wx + e * wy + b * h + (b * l + 2^14) >> 15 (quantized_x86.cpp's
//   AVX2 step 4) is (q00 - zero) * 2^15 + madd([q00, q10], [-wy, wy]) + madd(d, [wx - h, h])
//   + (madd(d, [-l, l]) + 2^14) >> 15, every factor within 16 bits;
// - step 5 of nearest: the arithmetic of quantized_x86.cpp's requantize8 on each value
//   (v * 2^15), not a table.

struct AxisNearest256 {
  __m256i multiplier, constant, below_shift, tie_limit, bias, unbias;
  __m256i low, high;
  __m128i shift;
};

ETKIT_AVX2 inline AxisNearest256 axis_nearest_registers_avx2(const AxisNearest& a) {
  return {_mm256_set1_epi64x(a.multiplier),
          _mm256_set1_epi64x(a.constant),
          _mm256_set1_epi64x(static_cast<int64_t>((uint64_t(1) << a.shift) - 1)),
          _mm256_set1_epi64x(a.tie_limit),
          _mm256_set1_epi64x(int64_t(1) << 62),
          _mm256_set1_epi64x(int64_t(1) << (62 - a.shift)),
          _mm256_set1_epi32(a.low),
          _mm256_set1_epi32(a.high),
          _mm_cvtsi32_si128(a.shift)};
}

ETKIT_AVX2 inline __m256i nearest_index4(__m256i q, const AxisNearest256& a) {
  const __m256i x = _mm256_add_epi64(_mm256_mul_epi32(q, a.multiplier), a.constant);
  const __m256i up =
      _mm256_sub_epi64(_mm256_srl_epi64(_mm256_add_epi64(x, a.bias), a.shift), a.unbias);
  const __m256i tie = _mm256_cmpgt_epi64(a.tie_limit, _mm256_and_si256(x, a.below_shift));
  return _mm256_sub_epi64(up, _mm256_and_si256(_mm256_and_si256(tie, up), _mm256_set1_epi64x(1)));
}

ETKIT_AVX2 inline __m256i nearest_tap_avx2(__m256i q, const AxisNearest256& a) {
  const __m256i even = nearest_index4(q, a);
  const __m256i odd = nearest_index4(_mm256_srli_epi64(q, 32), a);
  const __m256i index = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  return _mm256_min_epi32(_mm256_max_epi32(index, a.low), a.high);
}

ETKIT_AVX2 inline RequantRegisters requant_registers_avx2(const Setup& s) {
  const NarrowRequant& narrow = s.narrow;
  return {narrow.applies,
          narrow.multiplier == 1,
          _mm256_set1_epi32(narrow.multiplier),
          _mm_cvtsi64_si128(narrow.shift),
          _mm256_set1_epi32(static_cast<int32_t>((int64_t(1) << (narrow.shift - 1)) - 1)),
          _mm256_set1_epi64x(s.wide_multiplier),
          _mm_cvtsi64_si128(s.wide_shift),
          _mm_cvtsi64_si128(s.wide_shift - 32),
          _mm256_set1_epi64x((int64_t(1) << (s.wide_shift - 1)) - 1),
          _mm256_set1_epi16(static_cast<int16_t>(s.output_zero_point)),
          _mm256_set1_epi16(static_cast<int16_t>(s.output_min)),
          _mm256_set1_epi16(static_cast<int16_t>(s.output_max))};
}

// Sixteen values (two vectors of eight: step 4's, with 15 fractional bits, less the image zero
// point) to the output: `count` of them stored at `out`.
template <typename OutT>
ETKIT_AVX2 inline void store16_avx2(__m256i first, __m256i second, const RequantRegisters& r,
                                    __m256 float_scale, OutT* out, int64_t count) {
  if constexpr (std::is_same_v<OutT, int8_t>) {
    // [first 0-3, second 0-3 | first 4-7, second 4-7] in 16-bit lanes -> bytes in order
    __m256i words = finish16(requantize8(first, r), requantize8(second, r), r);
    words = _mm256_permute4x64_epi64(words, 0xD8);
    const __m256i bytes = _mm256_packs_epi16(words, words);
    const __m128i ordered = _mm_unpacklo_epi64(_mm256_castsi256_si128(bytes),
                                               _mm256_extracti128_si256(bytes, 1));
    if (count >= 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), ordered);
    } else {
      alignas(16) int8_t staged[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(staged), ordered);
      std::memcpy(out, staged, static_cast<size_t>(count));
    }
  } else {
    const __m256 values[2] = {_mm256_mul_ps(_mm256_cvtepi32_ps(first), float_scale),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(second), float_scale)};
    for (int k = 0; k < 2; ++k) {
      const int64_t left = count - 8 * k;
      if (left >= 8) {
        _mm256_storeu_ps(out + 8 * k, values[k]);
      } else if (left > 0) {
        const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left)),
                                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(out + 8 * k, lanes, values[k]);
      }
    }
  }
}

// Step 5 of nearest (Avx2::step5): the requantization in registers, and the set-up.
struct Finish256 {
  RequantRegisters requant;
  const Setup* setup;
};

// Nearest: `bytes` raw image values in output order (at most 32, staged at `raw`) to the output,
// by the arithmetic of requantize8 on each value (v * 2^15). (Called with the staged bytes, not
// inlined: as a vector argument, or inlined, it measured 5-18% slower on the nearest passes.)
template <typename OutT>
ETKIT_AVX2 __attribute__((noinline)) void store_raw_avx2(const int8_t* raw, int64_t bytes,
                                                         const Setup& s,
                                                         const RequantRegisters& r, OutT* out) {
  if (std::is_same_v<OutT, int8_t> && s.identity_table) {
    std::memcpy(out, raw, static_cast<size_t>(bytes));
    return;
  }
  const __m256i zero_point = _mm256_set1_epi32(s.image_zero_point);
  const __m256 float_scale = _mm256_set1_ps(s.float_scale);
  for (int64_t k = 0; k < bytes; k += 16) {
    __m256i values[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(raw + k + 8 * h)));
      values[h] = _mm256_slli_epi32(_mm256_sub_epi32(v, zero_point), kWeightBits);
    }
    store16_avx2(values[0], values[1], r, float_scale, out + k, std::min<int64_t>(16, bytes - k));
  }
}

// AVX2's pack: per 128-bit half, the first k bytes of each 32-bit lane (shuffle indexes), then
// the k words of each half joined (lane indexes).
constexpr std::array<int8_t, 32> pick_bytes(int k) {
  std::array<int8_t, 32> index{};
  for (int half = 0; half < 2; ++half) {
    for (int b = 0; b < 16; ++b) {
      index[16 * half + b] = static_cast<int8_t>(b < 4 * k ? 4 * (b / k) + b % k : -1);
    }
  }
  return index;
}

constexpr std::array<int32_t, 8> join_halves(int k) {
  std::array<int32_t, 8> index{};
  for (int w = 0; w < 8; ++w) {
    index[w] = w < k ? w : (w < 2 * k ? 4 + w - k : 0);
  }
  return index;
}

// ---- the traits: pass 1 and the nearest pass (quantized_pass1.h, quantized_nearest.h, shared
// with NEON) and the shared parts of pass 2 (quantized_x86_pass2.h) are written once over them ----

// AVX-512: sixteen lanes; every coordinate form.
struct Avx512 {
  static constexpr int kLanes = 16;
  static constexpr int kNearestGroup = kLanes;  // nearest: pixels per group
  static constexpr int kNearestPlanes = 1;        // planar: channel planes per walk
  static constexpr bool kNearestStrided = false;  // (other layouts: the scalar steps)
  using I = __m512i;
  struct Float {  // AxisVector's registers and the grid zero point
    AxisRegisters512 axis;
    I zero;
  };
  struct Table {  // the axis' table and the bias of its index
    const int32_t* table;
    I bias;
  };

  static constexpr int kPadTo = 1;        // pass 2 reads the block's lanes alone
  static constexpr bool kGathers = true;  // (the table form: one gather per axis)
  template <Coordinates>
  static constexpr bool kStoreEachAxis = false;  // (no tap_store)
  template <Coordinates kForm, bool kNearest, typename Registers>
  static void tap_store(I, const Registers&, int32_t*);
  ETKIT_AVX512 static I load(const int32_t* values) { return _mm512_load_si512(values); }
  ETKIT_AVX512 static void store(int32_t* values, I v) { _mm512_store_si512(values, v); }

  // The (x, y) pairs of sixteen grid points (grid_x is 2), each axis sign-extended to int32
  // lanes: masked loads, for any count of lanes left.
  static constexpr bool kPairLoads = true;
  static constexpr bool kPairLoadsMasked = true;
  template <typename GridT>
  ETKIT_AVX512 static void load_pairs_xy(const GridT* grid, int64_t, int64_t i, int64_t count,
                                         I* gx, I* gy) {
    if constexpr (std::is_same_v<GridT, int16_t>) {
      const I xy = _mm512_maskz_loadu_epi32(lane_mask(count - i), grid + i * 2);
      *gx = _mm512_srai_epi32(_mm512_slli_epi32(xy, 16), 16);
      *gy = _mm512_srai_epi32(xy, 16);
    } else {
      const I xy =
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lane_mask(count - i), grid + i * 2));
      *gx = _mm512_srai_epi32(_mm512_slli_epi32(xy, 24), 24);
      *gy = _mm512_srai_epi32(_mm512_slli_epi32(xy, 16), 24);
    }
  }

  template <typename GridT>
  ETKIT_AVX512 static I load_pairs(const GridT* grid, int64_t i, int64_t count) {
    return _mm512_maskz_loadu_epi32(lane_mask(count - i), grid + i * 2);
  }

  // A form's registers for axis 0 (x) or 1 (y).
  template <Coordinates kForm>
  ETKIT_AVX512 static auto registers(const Setup& s, int axis) {
    if constexpr (kForm == Coordinates::kInteger) {
      return axis_integer_registers(axis == 0 ? s.integer_x : s.integer_y);
    } else if constexpr (kForm == Coordinates::kSplit) {
      return axis_split_registers(axis == 0 ? s.split_x : s.split_y, axis);
    } else if constexpr (kForm == Coordinates::kFloat) {
      return Float{axis_registers_avx512(axis == 0 ? s.float_x : s.float_y),
                   _mm512_set1_epi32(s.grid_zero_point)};
    } else if constexpr (kForm == Coordinates::kExact) {
      return axis_exact_registers(axis == 0 ? s.exact_x : s.exact_y);
    } else if constexpr (kForm == Coordinates::kNearest) {
      return axis_nearest_registers(axis == 0 ? s.nearest_x : s.nearest_y);
    } else if constexpr (kForm == Coordinates::kTable) {
      return Table{axis == 0 ? s.table_x : s.table_y, _mm512_set1_epi32(128)};
    } else {
      return 0;  // the scalar steps
    }
  }

  // The form's Q (bilinear) or nearest index of sixteen grid values (kSplit: (x, y) pairs).
  template <Coordinates kForm, bool kNearest, typename Registers>
  ETKIT_AVX512 static I tap(I g, const Registers& r) {
    if constexpr (kForm == Coordinates::kInteger) {
      return integer_tap(g, r);
    } else if constexpr (kForm == Coordinates::kSplit) {
      return split_tap(g, r);
    } else if constexpr (kForm == Coordinates::kFloat) {
      return vector_tap_avx512(_mm512_sub_epi32(g, r.zero), r.axis);
    } else if constexpr (kForm == Coordinates::kExact) {
      return exact_tap<kNearest>(g, r);
    } else if constexpr (kForm == Coordinates::kNearest) {
      return nearest_tap(g, r);
    } else {
      return _mm512_i32gather_epi32(_mm512_add_epi32(g, r.bias), r.table, 4);
    }
  }

  template <typename GridT, typename Body>
  static void with_form(Coordinates form, bool nearest, const Body& body) {
    using C = Coordinates;
    core::with_form<GridT, C::kTable, C::kSplit, C::kInteger, C::kFloat, C::kNearest, C::kExact,
                    C::kScalar>(form, nearest, body);
  }

  // ---- pass 2 (quantized_x86_pass2.h): lane masks are mask registers ----
  using M = __mmask16;

  ETKIT_AVX512 static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  ETKIT_AVX512 static I set1_bytes(int8_t v) { return _mm512_set1_epi8(v); }
  ETKIT_AVX512 static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  ETKIT_AVX512 static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  ETKIT_AVX512 static I min(I a, I b) { return _mm512_min_epi32(a, b); }
  ETKIT_AVX512 static I max(I a, I b) { return _mm512_max_epi32(a, b); }
  ETKIT_AVX512 static I bit_and(I a, I b) { return _mm512_and_si512(a, b); }
  template <int kBits>
  ETKIT_AVX512 static I slli(I a) { return _mm512_slli_epi32(a, kBits); }
  template <int kBits>
  ETKIT_AVX512 static I srai(I a) { return _mm512_srai_epi32(a, kBits); }
  ETKIT_AVX512 static I srlv(I a, I bits) { return _mm512_srlv_epi32(a, bits); }
  ETKIT_AVX512 static I sllv(I a, I bits) { return _mm512_sllv_epi32(a, bits); }
  // v * stride for lanes v in [0, 2^15) (others: anything): one 16-bit multiply-add where the
  // stride is below 2^15 (`stride` then holds it in the lower 16 bits of each lane).
  ETKIT_AVX512 static I times_stride(I v, I stride, bool small) {
    return small ? _mm512_madd_epi16(v, stride) : _mm512_mullo_epi32(v, stride);
  }

  ETKIT_AVX512 static M lanes(int64_t left) { return lane_mask(left); }
  ETKIT_AVX512 static M at_most(I v, I last) { return _mm512_cmple_epu32_mask(v, last); }
  ETKIT_AVX512 static M both(M a, M b) { return static_cast<M>(a & b); }
  ETKIT_AVX512 static bool all(M m) { return m == 0xFFFF; }
  ETKIT_AVX512 static int bits(M m) { return m; }
  ETKIT_AVX512 static bool any(I v) { return _mm512_test_epi32_mask(v, v) != 0; }
  ETKIT_AVX512 static I zero_unless(M m, I v) { return _mm512_maskz_mov_epi32(m, v); }
  // a + b where m, else 0
  ETKIT_AVX512 static I add_where(M m, I a, I b) { return _mm512_maskz_add_epi32(m, a, b); }
  // (m0 ? b0 : 0) | (m1 ? b1 : 0) per lane
  ETKIT_AVX512 static I bytes_where(M m0, int32_t b0, M m1, int32_t b1) {
    const I first = _mm512_maskz_mov_epi32(m0, _mm512_set1_epi32(b0));
    return _mm512_mask_or_epi32(first, m1, first, _mm512_set1_epi32(b1));
  }

  ETKIT_AVX512 static I gather32(I offsets, const int8_t* base) {
    return _mm512_i32gather_epi32(offsets, base, 1);
  }
  ETKIT_AVX512 static I gather32(I src, M m, I offsets, const int8_t* base) {
    return _mm512_mask_i32gather_epi32(src, m, offsets, base, 1);
  }
  // The 64-bit words at the offsets of lanes 0-7 (kHalf 0) or 8-15 (1).
  template <int kHalf>
  ETKIT_AVX512 static I gather64(I src, M m, I offsets, const int8_t* base) {
    const __m256i at =
        kHalf == 0 ? _mm512_castsi512_si256(offsets) : _mm512_extracti64x4_epi64(offsets, 1);
    return _mm512_mask_i32gather_epi64(src, static_cast<__mmask8>(m >> (8 * kHalf)), at,
                                       reinterpret_cast<const long long*>(base), 1);
  }
  // The first kBytes bytes of each 32-bit lane, in order from byte 0.
  template <int kBytes>
  ETKIT_AVX512 static I pack(I raw) {
    if constexpr (kBytes == 1) {
      return _mm512_castsi128_si512(_mm512_cvtepi32_epi8(raw));
    } else if constexpr (kBytes == 2) {
      return _mm512_castsi256_si512(_mm512_cvtepi32_epi16(raw));
    } else {
      static constexpr std::array<uint8_t, 64> kCompress3 = compress3_index();
      return _mm512_permutexvar_epi8(_mm512_loadu_si512(kCompress3.data()), raw);
    }
  }
  ETKIT_AVX512 static __m128i low128(I v) { return _mm512_castsi512_si128(v); }
  ETKIT_AVX512 static I from128(__m128i v) { return _mm512_castsi128_si512(v); }

  ETKIT_AVX512 __attribute__((always_inline)) static Finish step5(const Setup& s) {
    return finish_registers(s);
  }
  static constexpr bool kStagedRaw = false;  // (whole vectors of raw bytes: store_raw)
  static void store_bytes(int8_t*, I);
  template <typename OutT>
  static void store_staged(const int8_t*, const Finish&, OutT*, int64_t);
  // Nearest: `bytes` raw image values in output order (at most 64, in `raw`) to the output.
  template <typename OutT>
  ETKIT_AVX512 static void store_raw(I raw, const Finish& f, OutT* out, int64_t bytes) {
    if constexpr (std::is_same_v<OutT, int8_t>) {
      _mm512_mask_storeu_epi8(out, byte_mask(bytes), table_lookup(raw, f));
    } else {
      // value = (q - zero) * 2^15, exact in float32; one product, as to_output<float>
      alignas(64) int8_t values[64];
      _mm512_store_si512(values, raw);
      for (int64_t k = 0; k < bytes; k += 16) {
        const __m128i raw16 = _mm_load_si128(reinterpret_cast<const __m128i*>(values + k));
        const __m512i v = _mm512_slli_epi32(
            _mm512_sub_epi32(_mm512_cvtepi8_epi32(raw16), f.image_zero), kWeightBits);
        _mm512_mask_storeu_ps(out + k, lane_mask(bytes - k),
                              _mm512_mul_ps(_mm512_cvtepi32_ps(v), f.float_scale));
      }
    }
  }
};

// AVX2: eight lanes; no split form (its 16-bit multiply-adds are AVX-512's here: the integer one
// instead) and no exact one (it needs 64-bit lane operations AVX2 lacks: the scalar steps).
struct Avx2 {
  static constexpr int kLanes = 8;
  static constexpr int kNearestGroup = kLanes;
  static constexpr int kNearestPlanes = 1;
  static constexpr bool kNearestStrided = false;
  using I = __m256i;
  struct Float {
    AxisRegisters axis;
    I zero;
  };
  struct Table {
    const int32_t* table;
    I bias;
  };

  static constexpr int kPadTo = 1;
  static constexpr bool kGathers = true;
  template <Coordinates>
  static constexpr bool kStoreEachAxis = false;  // (no tap_store)
  template <Coordinates kForm, bool kNearest, typename Registers>
  static void tap_store(I, const Registers&, int32_t*);
  ETKIT_AVX2 static I load(const int32_t* values) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(values));
  }
  ETKIT_AVX2 static void store(int32_t* values, I v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(values), v);
  }

  static constexpr bool kPairLoads = false;  // (the grid values are staged)
  static constexpr bool kPairLoadsMasked = false;
  template <typename GridT>
  static void load_pairs_xy(const GridT*, int64_t, int64_t, int64_t, I*, I*);
  template <typename GridT>
  static I load_pairs(const GridT*, int64_t, int64_t);  // (no split form)

  template <Coordinates kForm>
  ETKIT_AVX2 static auto registers(const Setup& s, int axis) {
    if constexpr (kForm == Coordinates::kInteger) {
      return axis_integer_registers_avx2(axis == 0 ? s.integer_x : s.integer_y);
    } else if constexpr (kForm == Coordinates::kFloat) {
      return Float{axis_registers(axis == 0 ? s.float_x : s.float_y),
                   _mm256_set1_epi32(s.grid_zero_point)};
    } else if constexpr (kForm == Coordinates::kNearest) {
      return axis_nearest_registers_avx2(axis == 0 ? s.nearest_x : s.nearest_y);
    } else if constexpr (kForm == Coordinates::kTable) {
      return Table{axis == 0 ? s.table_x : s.table_y, _mm256_set1_epi32(128)};
    } else {
      return 0;  // the scalar steps
    }
  }

  template <Coordinates kForm, bool kNearest, typename Registers>
  ETKIT_AVX2 static I tap(I g, const Registers& r) {
    if constexpr (kForm == Coordinates::kInteger) {
      return integer_tap_avx2(g, r);
    } else if constexpr (kForm == Coordinates::kFloat) {
      return vector_tap(_mm256_sub_epi32(g, r.zero), r.axis);
    } else if constexpr (kForm == Coordinates::kNearest) {
      return nearest_tap_avx2(g, r);
    } else {
      return _mm256_i32gather_epi32(r.table, _mm256_add_epi32(g, r.bias), 4);
    }
  }

  template <typename GridT, typename Body>
  static void with_form(Coordinates form, bool nearest, const Body& body) {
    using C = Coordinates;
    const C own = form == C::kSplit ? C::kInteger : (form == C::kExact ? C::kScalar : form);
    core::with_form<GridT, C::kTable, C::kInteger, C::kFloat, C::kNearest, C::kScalar>(
        own, nearest, body);
  }

  // ---- pass 2 (quantized_x86_pass2.h): lane masks are lanes of all ones ----
  using M = __m256i;

  ETKIT_AVX2 static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  ETKIT_AVX2 static I set1_bytes(int8_t v) { return _mm256_set1_epi8(v); }
  ETKIT_AVX2 static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  ETKIT_AVX2 static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  ETKIT_AVX2 static I min(I a, I b) { return _mm256_min_epi32(a, b); }
  ETKIT_AVX2 static I max(I a, I b) { return _mm256_max_epi32(a, b); }
  ETKIT_AVX2 static I bit_and(I a, I b) { return _mm256_and_si256(a, b); }
  template <int kBits>
  ETKIT_AVX2 static I slli(I a) { return _mm256_slli_epi32(a, kBits); }
  template <int kBits>
  ETKIT_AVX2 static I srai(I a) { return _mm256_srai_epi32(a, kBits); }
  ETKIT_AVX2 static I srlv(I a, I bits) { return _mm256_srlv_epi32(a, bits); }
  ETKIT_AVX2 static I sllv(I a, I bits) { return _mm256_sllv_epi32(a, bits); }
  // as Avx512::times_stride
  ETKIT_AVX2 static I times_stride(I v, I stride, bool small) {
    return small ? _mm256_madd_epi16(v, stride) : _mm256_mullo_epi32(v, stride);
  }

  ETKIT_AVX2 static M lanes(int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::min<int64_t>(left, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  ETKIT_AVX2 static M at_most(I v, I last) {  // 0 <= v <= last
    return _mm256_cmpeq_epi32(_mm256_min_epu32(v, last), v);
  }
  ETKIT_AVX2 static M both(M a, M b) { return _mm256_and_si256(a, b); }
  ETKIT_AVX2 static bool all(M m) { return _mm256_movemask_ps(_mm256_castsi256_ps(m)) == 0xFF; }
  ETKIT_AVX2 static int bits(M m) { return _mm256_movemask_ps(_mm256_castsi256_ps(m)); }
  ETKIT_AVX2 static bool any(I v) { return !_mm256_testz_si256(v, v); }
  ETKIT_AVX2 static I zero_unless(M m, I v) { return _mm256_and_si256(m, v); }
  // a + b where m, else 0 (a is 0 where m is not)
  ETKIT_AVX2 static I add_where(M m, I a, I b) {
    return _mm256_add_epi32(a, _mm256_and_si256(m, b));
  }
  ETKIT_AVX2 static I bytes_where(M m0, int32_t b0, M m1, int32_t b1) {
    return _mm256_or_si256(_mm256_and_si256(m0, _mm256_set1_epi32(b0)),
                           _mm256_and_si256(m1, _mm256_set1_epi32(b1)));
  }

  ETKIT_AVX2 static I gather32(I offsets, const int8_t* base) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), offsets, 1);
  }
  ETKIT_AVX2 static I gather32(I src, M m, I offsets, const int8_t* base) {
    return _mm256_mask_i32gather_epi32(src, reinterpret_cast<const int*>(base), offsets, m, 1);
  }
  template <int kHalf>
  ETKIT_AVX2 static I gather64(I src, M m, I offsets, const int8_t* base) {
    const __m128i at =
        kHalf == 0 ? _mm256_castsi256_si128(offsets) : _mm256_extracti128_si256(offsets, 1);
    const __m256i mask = _mm256_cvtepi32_epi64(kHalf == 0 ? _mm256_castsi256_si128(m)
                                                          : _mm256_extracti128_si256(m, 1));
    return _mm256_mask_i32gather_epi64(src, reinterpret_cast<const long long*>(base), at, mask,
                                       1);
  }
  // Byte shuffles stay within 128-bit halves: each half's bytes, then the halves joined.
  template <int kBytes>
  ETKIT_AVX2 static I pack(I raw) {
    static constexpr std::array<int8_t, 32> kPick = pick_bytes(kBytes);
    static constexpr std::array<int32_t, 8> kJoin = join_halves(kBytes);
    const I pick = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kPick.data()));
    const I join = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kJoin.data()));
    return _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(raw, pick), join);
  }
  ETKIT_AVX2 static __m128i low128(I v) { return _mm256_castsi256_si128(v); }
  ETKIT_AVX2 static I from128(__m128i v) { return _mm256_castsi128_si256(v); }

  ETKIT_AVX2 __attribute__((always_inline)) static Finish256 step5(const Setup& s) {
    return {requant_registers_avx2(s), &s};
  }
  // The 8- and 16k-channel nearest passes stage a block's raw bytes and requantize them in one
  // call (store_staged); one call per vector of them measured 5-8 % slower (kernel_ab_bench,
  // a quiet machine, GCC 12 and 13).
  static constexpr bool kStagedRaw = true;
  ETKIT_AVX2 static void store_bytes(int8_t* staged, I raw) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(staged), raw);
  }
  template <typename OutT>
  ETKIT_AVX2 static void store_staged(const int8_t* staged, const Finish256& f, OutT* out,
                                      int64_t bytes) {
    store_raw_avx2(staged, bytes, *f.setup, f.requant, out);
  }
  template <typename OutT>
  ETKIT_AVX2 static void store_raw(I raw, const Finish256& f, OutT* out, int64_t bytes) {
    alignas(32) int8_t staged[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(staged), raw);
    store_raw_avx2(staged, bytes, *f.setup, f.requant, out);
  }
};

namespace avx512 {
using V = Avx512;
#define ETKIT_TARGET ETKIT_AVX512
#include "quantized_pass1.h"
#include "quantized_x86_pass2.h"
#include "quantized_nearest.h"
#undef ETKIT_TARGET
}  // namespace avx512

namespace avx2 {
using V = Avx2;
#define ETKIT_TARGET ETKIT_AVX2
#include "quantized_pass1.h"
#include "quantized_x86_pass2.h"
#include "quantized_nearest.h"
#undef ETKIT_TARGET
}  // namespace avx2

// ---- pass 2, bilinear, planar images and 2 channels: every pixel on the vector path ----

// Byte indexes into [U | L] giving per lane [U byte a, U byte b, L byte a, L byte b].
constexpr std::array<uint8_t, 64> quad_index(int a, int b) {
  std::array<uint8_t, 64> index{};
  for (int lane = 0; lane < 16; ++lane) {
    index[4 * lane + 0] = static_cast<uint8_t>(4 * lane + a);
    index[4 * lane + 1] = static_cast<uint8_t>(4 * lane + b);
    index[4 * lane + 2] = static_cast<uint8_t>(64 + 4 * lane + a);
    index[4 * lane + 3] = static_cast<uint8_t>(64 + 4 * lane + b);
  }
  return index;
}

// kBytes = 1 (planar: per channel plane) or 2 (two channels-last): the bytes of one tap.
template <int kBytes, typename OutT>
ETKIT_AVX512 __attribute__((noinline)) void bilinear_masked_block(const Coords& c, int64_t count,
                                                                  const Setup& s, const Run& r,
                                                                  int64_t first) {
  const Finish f = finish_registers(s);
  static constexpr std::array<uint8_t, 64> kQuad0 = quad_index(0, kBytes);
  static constexpr std::array<uint8_t, 64> kQuad1 = quad_index(1, 3);
  static constexpr std::array<int32_t, 16> kInterleave0 = {0, 16, 1, 17, 2, 18, 3, 19,
                                                           4, 20, 5, 21, 6, 22, 7, 23};
  static constexpr std::array<int32_t, 16> kInterleave1 = {8,  24, 9,  25, 10, 26, 11, 27,
                                                           12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i quad0 = _mm512_loadu_si512(kQuad0.data());
  const __m512i quad1 = _mm512_loadu_si512(kQuad1.data());
  const __m512i weight_mask = _mm512_set1_epi32(0x7fff);
  const __m512i zero_bytes = _mm512_set1_epi8(static_cast<char>(s.image_zero_point));
  const int channels = kBytes == 1 ? s.channels : 1;
  // A plane may end less than 4 bytes after a row's last tap (the image's last): its gathers
  // clamp their addresses (gather_row).
  const int64_t row_reach = (s.height - 1) * s.stride_y + (s.width - 2) * kBytes + 4;
  const avx512::PlanarBounds bounds = avx512::planar_bounds(s);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = lane_mask(count - i);
    const __m512i qx = _mm512_load_si512(c.x + i), qy = _mm512_load_si512(c.y + i);
    const Weights w = pixel_weights<true>(_mm512_and_si512(qx, weight_mask),
                                          _mm512_and_si512(qy, weight_mask));
    const avx512::PlanarTaps t = avx512::planar_taps<kBytes>(c, i, bounds);
    // Where the sixteen pixels' taps of each row lie within 64 bytes (a smooth warp: neighbours
    // sample neighbours), two 64-byte loads and a byte permute replace the two gathers: lane
    // [q00, q01, q10, q11] takes bytes du, du + kBytes of the upper row's load and dl,
    // dl + kBytes of the lower's, du and dl its offsets from the first pixel's. The loads are
    // masked at the image's end (masked bytes read nothing). (Measured: it pays where several
    // channel planes share the indexes; with one plane the gathers are as fast.)
    int32_t span_upper = 0, span_lower = 0;
    __m512i span_index[2];
    bool span = false;
    if (channels > 1 && !t.shifted) {
      span_upper = _mm_cvtsi128_si32(_mm512_castsi512_si128(t.upper));
      span_lower = _mm_cvtsi128_si32(_mm512_castsi512_si128(t.lower));
      const __m512i du = _mm512_sub_epi32(t.upper, _mm512_set1_epi32(span_upper));
      const __m512i dl = _mm512_sub_epi32(t.lower, _mm512_set1_epi32(span_lower));
      const __m512i reach = _mm512_set1_epi32(64 - 2 * kBytes);
      span = static_cast<__mmask16>(~lanes | (_mm512_cmple_epu32_mask(du, reach) &
                                              _mm512_cmple_epu32_mask(dl, reach))) == 0xFFFF;
      if (span) {
        // bytes [du, du, dl, dl] plus [k, k + kBytes, 64 + k, 64 + k + kBytes] (du, dl < 64)
        const __m512i both = _mm512_or_si512(du, _mm512_slli_epi32(dl, 16));
        const __m512i doubled = _mm512_or_si512(both, _mm512_slli_epi32(both, 8));
        for (int k = 0; k < kBytes; ++k) {
          span_index[k] = _mm512_add_epi32(
              doubled, _mm512_set1_epi32(k | (k + kBytes) << 8 | (64 + k) << 16 |
                                         (64 + k + kBytes) << 24));
        }
      }
    }
    for (int ch = 0; ch < channels; ++ch) {
      const int64_t plane_offset = r.plane_offset + ch * s.stride_c;
      const int8_t* const plane = r.plane + ch * s.stride_c;
      __m512i up, down;
      if (span) {
        const int64_t left = s.extent - plane_offset;
        up = _mm512_maskz_loadu_epi8(byte_mask(left - span_upper), plane + span_upper);
        down = _mm512_maskz_loadu_epi8(byte_mask(left - span_lower), plane + span_lower);
      } else {
        const bool clamp_end = plane_offset + c.plane_max + row_reach > s.extent;
        const __m512i limit = _mm512_set1_epi32(
            static_cast<int32_t>(std::min<int64_t>(s.extent - plane_offset - 4, INT32_MAX)));
        up = avx512::gather_row(plane, t.upper, t.shift_bits, t.shifted, limit, clamp_end);
        down = avx512::gather_row(plane, t.lower, t.shift_bits, t.shifted, limit, clamp_end);
      }
      __m512i values[2];
      for (int k = 0; k < kBytes; ++k) {
        __m512i q = span ? _mm512_permutex2var_epi8(up, span_index[k], down)
                         : _mm512_permutex2var_epi8(up, k == 0 ? quad0 : quad1, down);
        if (!t.all_inside) {
          q = _mm512_ternarylogic_epi32(t.inside, q, zero_bytes, 0xCA);  // inside ? q : zero
        }
        values[k] = blend(q, w, f.init);
      }
      if constexpr (kBytes == 1) {
        store_values(values[0], f, static_cast<OutT*>(r.out) + (first + i) + ch * r.output_c,
                     lanes);
      } else {
        OutT* const out = static_cast<OutT*>(r.out) + (first + i) * 2;
        if constexpr (std::is_same_v<OutT, int8_t>) {
          const __m128i c0 = to_bytes(requantize(values[0], f), f);
          const __m128i c1 = to_bytes(requantize(values[1], f), f);
          const __m256i both = _mm256_inserti128_si256(
              _mm256_castsi128_si256(_mm_unpacklo_epi8(c0, c1)), _mm_unpackhi_epi8(c0, c1), 1);
          _mm256_mask_storeu_epi8(out, static_cast<__mmask32>(byte_mask(2 * (count - i))), both);
        } else {
          const __m512 c0 = _mm512_mul_ps(_mm512_cvtepi32_ps(values[0]), f.float_scale);
          const __m512 c1 = _mm512_mul_ps(_mm512_cvtepi32_ps(values[1]), f.float_scale);
          const int64_t left = 2 * (count - i);
          _mm512_mask_storeu_ps(
              out, lane_mask(left),
              _mm512_permutex2var_ps(c0, _mm512_loadu_si512(kInterleave0.data()), c1));
          if (left > 16) {
            _mm512_mask_storeu_ps(
                out + 16, lane_mask(left - 16),
                _mm512_permutex2var_ps(c0, _mm512_loadu_si512(kInterleave1.data()), c1));
          }
        }
      }
    }
  }
}

// ---- pass 2, bilinear, 3, 8 and 16k channels-last: taps inside the image ----

// The taps of sixteen pixels in the edge form of quantized_x86.cpp's AVX-512 pass (x0 = width - 1
// with wx = 0 as x0 = width - 2 with wx = 2^15: the same taps and weights), their byte offsets
// (0 off the vector path) and which pixels are on it: every tap inside the image, and a lower
// row offset at most `limit`.
struct EdgeTaps {
  __m512i offsets;
  Weights weights;
  __mmask16 inside;
};

ETKIT_AVX512 inline EdgeTaps edge_taps(const Coords& c, int64_t i, __mmask16 lanes,
                                       const Setup& s, int64_t limit) {
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  const __m512i qx = _mm512_load_si512(c.x + i), qy = _mm512_load_si512(c.y + i);
  // quantized_x86.cpp's edge form wherever Q is a whole pixel but 0: x0 = max(Q - 1, 0) >> 15,
  // wx = Q - x0 * 2^15, on the vector path exactly when 0 <= Q <= (size - 1) * 2^15
  const __m512i x0 =
      _mm512_srai_epi32(_mm512_max_epi32(_mm512_sub_epi32(qx, one), zero), kWeightBits);
  const __m512i y0 =
      _mm512_srai_epi32(_mm512_max_epi32(_mm512_sub_epi32(qy, one), zero), kWeightBits);
  const __m512i wx = _mm512_sub_epi32(qx, _mm512_slli_epi32(x0, kWeightBits));
  const __m512i wy = _mm512_sub_epi32(qy, _mm512_slli_epi32(y0, kWeightBits));
  const bool small = s.stride_y < (1 << 15) && s.stride_x < (1 << 15);
  const __m512i offsets = _mm512_add_epi32(
      Avx512::times_stride(y0, _mm512_set1_epi32(static_cast<int32_t>(s.stride_y)), small),
      Avx512::times_stride(x0, _mm512_set1_epi32(static_cast<int32_t>(s.stride_x)), small));
  __mmask16 inside =
      lanes &
      _mm512_cmple_epu32_mask(qx, _mm512_set1_epi32((s.width - 1) << kWeightBits)) &
      _mm512_cmple_epu32_mask(qy, _mm512_set1_epi32((s.height - 1) << kWeightBits));
  if (limit < INT32_MAX) {
    inside &= _mm512_cmple_epi32_mask(offsets, _mm512_set1_epi32(static_cast<int32_t>(limit)));
  }
  return {_mm512_maskz_mov_epi32(inside, offsets), pixel_weights(wx, wy), inside};
}

// 3 channels: [lanes 0-7: channel k of pixels 0-7 | lanes 8-15: channel k + 1] from a pair of
// 64-bit gathers (pixel p's taps at bytes 8p .. 8p + 5 of the upper and, + 64, the lower row).
constexpr std::array<uint8_t, 64> triple_index(bool third) {
  std::array<uint8_t, 64> index{};
  for (int lane = 0; lane < 16; ++lane) {
    const int pixel = lane % 8, channel = third ? 2 : lane / 8;
    index[4 * lane + 0] = static_cast<uint8_t>(8 * pixel + channel);
    index[4 * lane + 1] = static_cast<uint8_t>(8 * pixel + 3 + channel);
    index[4 * lane + 2] = static_cast<uint8_t>(64 + 8 * pixel + channel);
    index[4 * lane + 3] = static_cast<uint8_t>(64 + 8 * pixel + 3 + channel);
  }
  return index;
}

// The 48 output bytes (pixel * 3 + channel) of [A | B | C | -], 16 bytes each: A holds channels
// 0 and 1 of pixels 0-7, B of pixels 8-15, C channel 2 of pixels 0-15.
constexpr std::array<uint8_t, 64> triple_output_index() {
  std::array<uint8_t, 64> index{};
  for (int g = 0; g < 48; ++g) {
    const int pixel = g / 3, channel = g % 3;
    index[g] = static_cast<uint8_t>(channel == 2 ? 32 + pixel
                                                 : (pixel < 8 ? 0 : 16) + 8 * channel + pixel % 8);
  }
  return index;
}

// The same for float32 values, 16 per output vector k (0..2): from `first` (A for k < 2, B for
// k = 2) and C (indexes 16 + lane); for k = 1 also `second` (B), marked by `from_second`.
constexpr std::array<int32_t, 16> triple_float_index(int k, bool second) {
  std::array<int32_t, 16> index{};
  for (int e = 0; e < 16; ++e) {
    const int g = 16 * k + e, pixel = g / 3, channel = g % 3;
    if (channel == 2) {
      index[e] = 16 + pixel;
    } else if (pixel < 8) {
      index[e] = second ? 0 : 8 * channel + pixel;
    } else {
      index[e] = 8 * channel + pixel - 8;
    }
  }
  return index;
}

constexpr __mmask16 triple_second_mask() {
  __mmask16 mask = 0;
  for (int e = 0; e < 16; ++e) {
    const int g = 16 + e;
    if (g % 3 != 2 && g / 3 >= 8) {
      mask = static_cast<__mmask16>(mask | (1 << e));
    }
  }
  return mask;
}

ETKIT_AVX512 inline Weights half_weights(const Weights& w, int control) {
  if (control == 0x44) {
    return {_mm512_shuffle_i64x2(w.low, w.low, 0x44), _mm512_shuffle_i64x2(w.high, w.high, 0x44),
            _mm512_shuffle_i64x2(w.cross, w.cross, 0x44)};
  }
  return {_mm512_shuffle_i64x2(w.low, w.low, 0xEE), _mm512_shuffle_i64x2(w.high, w.high, 0xEE),
          _mm512_shuffle_i64x2(w.cross, w.cross, 0xEE)};
}

template <typename OutT>
ETKIT_AVX512 __attribute__((noinline)) void bilinear_triples_block(const Coords& c, int64_t count,
                                                                   const Setup& s, const Run& r,
                                                                   int64_t first,
                                                                   uint16_t* outside) {
  const Finish f = finish_registers(s);
  static constexpr std::array<uint8_t, 64> kPairIndex = triple_index(false);
  static constexpr std::array<uint8_t, 64> kThirdIndex = triple_index(true);
  static constexpr std::array<uint8_t, 64> kOutputIndex = triple_output_index();
  static constexpr std::array<int32_t, 16> kFloat0 = triple_float_index(0, false);
  static constexpr std::array<int32_t, 16> kFloat1a = triple_float_index(1, false);
  static constexpr std::array<int32_t, 16> kFloat1b = triple_float_index(1, true);
  static constexpr std::array<int32_t, 16> kFloat2 = triple_float_index(2, false);
  const __m512i pair_index = _mm512_loadu_si512(kPairIndex.data());
  const __m512i third_index = _mm512_loadu_si512(kThirdIndex.data());
  // the lower row's 8-byte load ends 2 bytes past the pixel's taps: it must stay in the image
  const int64_t limit = s.extent - r.plane_offset - s.stride_y - 8;
  const long long* const upper_base = reinterpret_cast<const long long*>(r.plane);
  const long long* const lower_base = reinterpret_cast<const long long*>(r.plane + s.stride_y);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = lane_mask(count - i);
    if (limit < 0) {  // even pixel (0, 0)'s loads would pass the image's end: all scalar
      outside[i / 16] = lanes;
      continue;
    }
    const EdgeTaps t = edge_taps(c, i, lanes, s, limit);
    outside[i / 16] = static_cast<uint16_t>(lanes & ~t.inside);
    const __m256i first_offsets = _mm512_castsi512_si256(t.offsets);
    const __m256i second_offsets = _mm512_extracti64x4_epi64(t.offsets, 1);
    const __m512i up0 = _mm512_i32gather_epi64(first_offsets, upper_base, 1);
    const __m512i down0 = _mm512_i32gather_epi64(first_offsets, lower_base, 1);
    const __m512i up1 = _mm512_i32gather_epi64(second_offsets, upper_base, 1);
    const __m512i down1 = _mm512_i32gather_epi64(second_offsets, lower_base, 1);
    const __m512i a = _mm512_permutex2var_epi8(up0, pair_index, down0);
    const __m512i b = _mm512_permutex2var_epi8(up1, pair_index, down1);
    const __m512i third =
        _mm512_mask_blend_epi32(0xFF00, _mm512_permutex2var_epi8(up0, third_index, down0),
                                _mm512_permutex2var_epi8(up1, third_index, down1));
    const __m512i value_a = blend(a, half_weights(t.weights, 0x44), f.init);
    const __m512i value_b = blend(b, half_weights(t.weights, 0xEE), f.init);
    const __m512i value_c = blend(third, t.weights, f.init);
    const int64_t left = 3 * std::min<int64_t>(16, count - i);
    OutT* const out = static_cast<OutT*>(r.out) + (first + i) * 3;
    if constexpr (std::is_same_v<OutT, int8_t>) {
      __m512i bytes = _mm512_castsi128_si512(to_bytes(requantize(value_a, f), f));
      bytes = _mm512_inserti32x4(bytes, to_bytes(requantize(value_b, f), f), 1);
      bytes = _mm512_inserti32x4(bytes, to_bytes(requantize(value_c, f), f), 2);
      const __m512i order = _mm512_loadu_si512(kOutputIndex.data());
      _mm512_mask_storeu_epi8(out, byte_mask(left), _mm512_permutexvar_epi8(order, bytes));
    } else {
      const __m512 fa = _mm512_mul_ps(_mm512_cvtepi32_ps(value_a), f.float_scale);
      const __m512 fb = _mm512_mul_ps(_mm512_cvtepi32_ps(value_b), f.float_scale);
      const __m512 fc = _mm512_mul_ps(_mm512_cvtepi32_ps(value_c), f.float_scale);
      _mm512_mask_storeu_ps(out, lane_mask(left),
                            _mm512_permutex2var_ps(fa, _mm512_loadu_si512(kFloat0.data()), fc));
      if (left > 16) {
        const __m512 from_a = _mm512_permutex2var_ps(fa, _mm512_loadu_si512(kFloat1a.data()), fc);
        const __m512 from_b = _mm512_permutex2var_ps(fb, _mm512_loadu_si512(kFloat1b.data()), fc);
        _mm512_mask_storeu_ps(out + 16, lane_mask(left - 16),
                              _mm512_mask_blend_ps(triple_second_mask(), from_a, from_b));
      }
      if (left > 32) {
        _mm512_mask_storeu_ps(out + 32, lane_mask(left - 32),
                              _mm512_permutex2var_ps(fb, _mm512_loadu_si512(kFloat2.data()), fc));
      }
    }
  }
}

// 8 channels, two pixels a vector: bytes [U0 | L0 | U1 | L1] (16 each: the upper and lower
// row's taps of pixel 0 then 1, channels 0-7 of x0, then of x0 + 1) to lanes
// [pixel 0: channels 0-7 | pixel 1: channels 0-7].
constexpr std::array<uint8_t, 64> eight_index() {
  std::array<uint8_t, 64> index{};
  for (int lane = 0; lane < 16; ++lane) {
    const int pixel = lane / 8, channel = lane % 8;
    for (int k = 0; k < 4; ++k) {
      index[4 * lane + k] = static_cast<uint8_t>(32 * pixel + 8 * k + channel);
    }
  }
  return index;
}

// 16 channels: [U | L] (32 bytes each: channels 0-15 of x0, then of x0 + 1) to lanes of
// channels 0-15.
constexpr std::array<uint8_t, 64> sixteen_index() {
  std::array<uint8_t, 64> index{};
  for (int lane = 0; lane < 16; ++lane) {
    for (int k = 0; k < 4; ++k) {
      index[4 * lane + k] = static_cast<uint8_t>(16 * k + lane);
    }
  }
  return index;
}

template <typename OutT>
ETKIT_AVX512 __attribute__((noinline)) void bilinear_wide_block(const Coords& c, int64_t count,
                                                                const Setup& s, const Run& r,
                                                                int64_t first,
                                                                uint16_t* outside) {
  const Finish f = finish_registers(s);
  static constexpr std::array<uint8_t, 64> kEightIndex = eight_index();
  static constexpr std::array<uint8_t, 64> kSixteenIndex = sixteen_index();
  const __m512i eight = _mm512_loadu_si512(kEightIndex.data());
  const __m512i sixteen = _mm512_loadu_si512(kSixteenIndex.data());
  const int64_t channels = s.channels, stride_y = s.stride_y;
  alignas(64) int32_t offsets[16], low[16], high[16], cross[16];
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = lane_mask(count - i);
    const EdgeTaps t = edge_taps(c, i, lanes, s, INT32_MAX);
    outside[i / 16] = static_cast<uint16_t>(lanes & ~t.inside);
    _mm512_store_si512(offsets, t.offsets);
    _mm512_store_si512(low, t.weights.low);
    _mm512_store_si512(high, t.weights.high);
    _mm512_store_si512(cross, t.weights.cross);
    const int64_t n = std::min<int64_t>(16, count - i);
    OutT* const out = static_cast<OutT*>(r.out) + (first + i) * channels;
    if (channels == 8) {
      for (int64_t j = 0; j < n; j += 2) {
        const int64_t k = std::min<int64_t>(j + 1, n - 1);
        const int8_t* const p0 = r.plane + offsets[j];
        const int8_t* const p1 = r.plane + offsets[k];
        __m512i bytes = _mm512_castsi128_si512(load16(p0));
        bytes = _mm512_inserti32x4(bytes, load16(p0 + stride_y), 1);
        bytes = _mm512_inserti32x4(bytes, load16(p1), 2);
        bytes = _mm512_inserti32x4(bytes, load16(p1 + stride_y), 3);
        const Weights w{_mm512_mask_set1_epi32(_mm512_set1_epi32(low[j]), 0xFF00, low[k]),
                        _mm512_mask_set1_epi32(_mm512_set1_epi32(high[j]), 0xFF00, high[k]),
                        _mm512_mask_set1_epi32(_mm512_set1_epi32(cross[j]), 0xFF00, cross[k])};
        const __m512i value = blend(_mm512_permutexvar_epi8(eight, bytes), w, f.init);
        store_values(value, f, out + j * 8, k > j ? __mmask16(0xFFFF) : __mmask16(0x00FF));
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const int8_t* const pixel = r.plane + offsets[j];
        const Weights w{_mm512_set1_epi32(low[j]), _mm512_set1_epi32(high[j]),
                        _mm512_set1_epi32(cross[j])};
        for (int64_t h = 0; h < channels; h += 16) {
          __m512i bytes;
          if (channels == 16) {
            bytes = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pixel))),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pixel + stride_y)), 1);
          } else {
            const int8_t* const at = pixel + h;
            bytes = _mm512_castsi128_si512(load16(at));
            bytes = _mm512_inserti32x4(bytes, load16(at + channels), 1);
            bytes = _mm512_inserti32x4(bytes, load16(at + stride_y), 2);
            bytes = _mm512_inserti32x4(bytes, load16(at + stride_y + channels), 3);
          }
          const __m512i value = blend(_mm512_permutexvar_epi8(sixteen, bytes), w, f.init);
          store_values(value, f, out + j * channels + h, __mmask16(0xFFFF));
        }
      }
    }
  }
}

// ---- pass 2, AVX2: bilinear (step 4 in 16-bit multiply-adds) ----

// Step 4's weights of eight pixels in the 16-bit multiply-adds' form (see above):
// w1 = [-wy, wy], w2 = [wx - h, h], w3 = [-l, l].
struct Weights256 {
  __m256i w1, w2, w3;
};

ETKIT_AVX2 inline Weights256 pixel_weights_avx2(__m256i wx, __m256i wy) {
  const __m256i weight_mask = _mm256_set1_epi32(0x7fff), zero = _mm256_setzero_si256();
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256i product = _mm256_madd_epi16(wx, wy);  // upper halves are zero: wx * wy
  const __m256i h = _mm256_srli_epi32(product, kWeightBits);
  const __m256i l = _mm256_and_si256(product, weight_mask);
  return {_mm256_or_si256(_mm256_and_si256(_mm256_sub_epi32(zero, wy), low16),
                          _mm256_slli_epi32(wy, 16)),
          _mm256_or_si256(_mm256_sub_epi32(wx, h), _mm256_slli_epi32(h, 16)),
          _mm256_or_si256(_mm256_and_si256(_mm256_sub_epi32(zero, l), low16),
                          _mm256_slli_epi32(l, 16))};
}

// Step 4 of eight lanes [q00, q01, q10, q11] (see above).
ETKIT_AVX2 inline __m256i blend_avx2(__m256i quad, const Weights256& t, __m256i zero_point) {
  const __m256i low = _mm256_srai_epi16(_mm256_slli_epi16(quad, 8), 8);  // [q00, q10]
  const __m256i high = _mm256_srai_epi16(quad, 8);                       // [q01, q11]
  const __m256i d = _mm256_sub_epi16(high, low);
  const __m256i v00 =
      _mm256_sub_epi32(_mm256_srai_epi32(_mm256_slli_epi32(quad, 24), 24), zero_point);
  const __m256i cross = _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(d, t.w3), _mm256_set1_epi32(1 << 14)), kWeightBits);
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_slli_epi32(v00, kWeightBits), _mm256_madd_epi16(low, t.w1)),
      _mm256_add_epi32(_mm256_madd_epi16(d, t.w2), cross));
}

template <typename OutT>
ETKIT_AVX2 __attribute__((noinline)) void planar_block_avx2(const Coords& c, int64_t count,
                                                            const Setup& s, const Run& r,
                                                            int64_t first) {
  const RequantRegisters requant = requant_registers_avx2(s);
  const __m256 float_scale = _mm256_set1_ps(s.float_scale);
  const __m256i zero_point = _mm256_set1_epi32(s.image_zero_point);
  const __m256i zero_bytes = _mm256_set1_epi8(static_cast<char>(s.image_zero_point));
  const int64_t row_reach = (s.height - 1) * s.stride_y + (s.width - 2) + 4;
  const __m256i weight_mask = _mm256_set1_epi32(0x7fff);
  const avx2::PlanarBounds bounds = avx2::planar_bounds(s);
  for (int64_t i = 0; i < count; i += 16) {
    avx2::PlanarTaps taps[2];
    Weights256 weights[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i qx = _mm256_load_si256(reinterpret_cast<const __m256i*>(c.x + i + 8 * k));
      const __m256i qy = _mm256_load_si256(reinterpret_cast<const __m256i*>(c.y + i + 8 * k));
      weights[k] = pixel_weights_avx2(_mm256_and_si256(qx, weight_mask),
                                      _mm256_and_si256(qy, weight_mask));
      taps[k] = avx2::planar_taps<1>(c, i + 8 * k, bounds);
    }
    for (int64_t ch = 0; ch < s.channels; ++ch) {
      const int64_t plane_offset = r.plane_offset + ch * s.stride_c;
      const int8_t* const plane = r.plane + ch * s.stride_c;
      const bool clamp_end = plane_offset + c.plane_max + row_reach > s.extent;
      const __m256i limit = _mm256_set1_epi32(
          static_cast<int32_t>(std::min<int64_t>(s.extent - plane_offset - 4, INT32_MAX)));
      __m256i values[2];
      for (int k = 0; k < 2; ++k) {
        const avx2::PlanarTaps& t = taps[k];
        const __m256i up =
            avx2::gather_row(plane, t.upper, t.shift_bits, t.shifted, limit, clamp_end);
        const __m256i down =
            avx2::gather_row(plane, t.lower, t.shift_bits, t.shifted, limit, clamp_end);
        __m256i quad = _mm256_blend_epi16(up, _mm256_slli_epi32(down, 16), 0xAA);
        if (!t.all_inside) {
          quad = _mm256_blendv_epi8(zero_bytes, quad, t.inside);
        }
        values[k] = blend_avx2(quad, weights[k], zero_point);
      }
      store16_avx2(values[0], values[1], requant, float_scale,
                   static_cast<OutT*>(r.out) + (first + i) + ch * r.output_c,
                   std::min<int64_t>(16, count - i));
    }
  }
}

// Bilinear, channels-last, any channel count: per channel, each tap's byte is one 32-bit gather
// (byte 0 of the word at the tap), four per channel of eight pixels, then step 4 as for planar
// images; the values go out through a small transpose. A pixel is on the vector path when its
// taps are inside the image or carry weight 0 (x0 = width - 1 with wx = 0, y0 = height - 1 with
// wy = 0: the tap past the edge is read, from a valid address, and weighs nothing: with wx = 0,
// h = l = 0 and its difference terms vanish), and its last read stays inside the image; the
// others are redone by the scalar steps.
template <typename OutT>
ETKIT_AVX2 __attribute__((noinline)) void channels_block_avx2(const Coords& c, int64_t count,
                                                              const Setup& s, const Run& r,
                                                              int64_t first, uint16_t* outside) {
  const RequantRegisters requant = requant_registers_avx2(s);
  const __m256 float_scale = _mm256_set1_ps(s.float_scale);
  const __m256i zero_point = _mm256_set1_epi32(s.image_zero_point);
  const __m256i weight_mask = _mm256_set1_epi32(0x7fff), zero = _mm256_setzero_si256();
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const int64_t channels = s.channels, stride_y = s.stride_y;
  // the largest offset whose reads stay in the image: the last gather reads 4 bytes at the
  // lower row's x0 + 1 tap of the last channel, offset + stride_y + 2 * channels - 1
  const int64_t limit = s.extent - r.plane_offset - stride_y - 2 * channels - 3;
  alignas(32) int32_t values[16][8] = {};
  for (int64_t i = 0; i < count; i += 8) {
    const int64_t n = std::min<int64_t>(8, count - i);
    const __mmask16 all_lanes = static_cast<__mmask16>((1u << n) - 1);
    if (i % 16 == 0) {
      outside[i / 16] = 0;
    }
    if (limit < 0) {  // even pixel (0, 0)'s reads would pass the image's end: all scalar
      outside[i / 16] = static_cast<uint16_t>(outside[i / 16] | (all_lanes << (i % 16)));
      continue;
    }
    const __m256i qx = _mm256_load_si256(reinterpret_cast<const __m256i*>(c.x + i));
    const __m256i qy = _mm256_load_si256(reinterpret_cast<const __m256i*>(c.y + i));
    const __m256i x0 = _mm256_srai_epi32(qx, kWeightBits), y0 = _mm256_srai_epi32(qy, kWeightBits);
    const __m256i wx = _mm256_and_si256(qx, weight_mask), wy = _mm256_and_si256(qy, weight_mask);
    const __m256i edge_x = _mm256_and_si256(
        _mm256_cmpeq_epi32(x0, _mm256_set1_epi32(s.width - 1)), _mm256_cmpeq_epi32(wx, zero));
    const __m256i edge_y = _mm256_and_si256(
        _mm256_cmpeq_epi32(y0, _mm256_set1_epi32(s.height - 1)), _mm256_cmpeq_epi32(wy, zero));
    const __m256i offsets = _mm256_add_epi32(
        _mm256_mullo_epi32(y0, _mm256_set1_epi32(static_cast<int32_t>(stride_y))),
        _mm256_mullo_epi32(x0, _mm256_set1_epi32(static_cast<int32_t>(channels))));
    const __m256i lanes = Avx2::lanes(n);
    const __m256i inside = _mm256_and_si256(
        _mm256_and_si256(
            lanes, _mm256_andnot_si256(
                       _mm256_cmpgt_epi32(offsets, _mm256_set1_epi32(static_cast<int32_t>(limit))),
                       _mm256_cmpgt_epi32(offsets, _mm256_set1_epi32(-1)))),
        _mm256_and_si256(
            _mm256_or_si256(Avx2::at_most(x0, _mm256_set1_epi32(s.width - 2)), edge_x),
            _mm256_or_si256(Avx2::at_most(y0, _mm256_set1_epi32(s.height - 2)), edge_y)));
    const int inside_bits = _mm256_movemask_ps(_mm256_castsi256_ps(inside));
    outside[i / 16] = static_cast<uint16_t>(outside[i / 16] |
                                            ((all_lanes & ~inside_bits) << (i % 16)));
    const __m256i at = _mm256_and_si256(inside, offsets);
    const Weights256 t = pixel_weights_avx2(wx, wy);
    OutT* const out = static_cast<OutT*>(r.out) + (first + i) * channels;
    for (int64_t ch0 = 0; ch0 < channels; ch0 += 16) {
      const int64_t chunk = std::min<int64_t>(16, channels - ch0);
      for (int64_t k = 0; k < chunk; ++k) {
        const int64_t ch = ch0 + k;
        const auto tap = [&](int64_t offset) ETKIT_AVX2 {
          return _mm256_and_si256(
              _mm256_i32gather_epi32(reinterpret_cast<const int*>(r.plane + offset), at, 1), byte);
        };
        const __m256i q00 = tap(ch), q01 = tap(ch + channels);
        const __m256i q10 = tap(ch + stride_y), q11 = tap(ch + stride_y + channels);
        const __m256i quad = _mm256_or_si256(
            _mm256_or_si256(q00, _mm256_slli_epi32(q01, 8)),
            _mm256_or_si256(_mm256_slli_epi32(q10, 16), _mm256_slli_epi32(q11, 24)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(values[k]), blend_avx2(quad, t, zero_point));
      }
      // step 5 sixteen values at a time, then values[k][pixel] -> out[pixel * channels + ch0 + k]
      alignas(32) OutT done[16 * 8];
      const int32_t* const flat = values[0];
      for (int64_t v = 0; v < chunk * 8; v += 16) {
        store16_avx2(_mm256_load_si256(reinterpret_cast<const __m256i*>(flat + v)),
                     _mm256_load_si256(reinterpret_cast<const __m256i*>(flat + v + 8)), requant,
                     float_scale, done + v, 16);
      }
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t k = 0; k < chunk; ++k) {
          out[j * channels + ch0 + k] = done[k * 8 + j];
        }
      }
    }
  }
}

// ---- the driver ----

// Requests the image lines of every eighth pixel of a block (pass 1's result): the top-left tap
// and the row below it, in every channel plane.
void prefetch_block(const Coords& c, int64_t count, const Setup& s, const Run& r) {
  const bool planar = s.kind == Kind::kPlanar || s.kind == Kind::kNearPlanar;
  const int64_t planes = planar ? s.channels : 1;
  const int shift = s.nearest ? 0 : kWeightBits;
  for (int64_t j = 0; j < count; j += 8) {
    const int64_t x = std::min<int64_t>(std::max(c.x[j] >> shift, 0), s.width - 1);
    const int64_t y = std::min<int64_t>(std::max(c.y[j] >> shift, 0), s.height - 1);
    const int8_t* const at =
        r.plane + (c.batched ? c.plane[j] : 0) + y * s.stride_y + x * s.stride_x;
    for (int64_t ch = 0; ch < planes; ++ch) {
      __builtin_prefetch(at + ch * s.stride_c);
      if (!s.nearest && y + 1 < s.height) {
        __builtin_prefetch(at + ch * s.stride_c + s.stride_y);
      }
    }
  }
}

// Pass 2 of a block by its kind: AVX-512 (`wide`) or AVX2. Returns whether pixels were left
// to the scalar steps (their bits in `outside`).
template <typename OutT>
__attribute__((always_inline)) inline bool second_pass_block(const Coords& c, int64_t block,
                                                             const Setup& s, const Run& run,
                                                             int64_t first, bool wide,
                                                             uint16_t* outside) {
  if (core::is_nearest(s.kind)) {
    if (wide) {
      avx512::nearest_pass<OutT>(c, block, s, run, first);
    } else {
      avx2::nearest_pass<OutT>(c, block, s, run, first);
    }
    return false;
  }
  if (!wide) {
    if (s.kind == Kind::kPlanar) {
      planar_block_avx2<OutT>(c, block, s, run, first);
      return false;
    }
    channels_block_avx2<OutT>(c, block, s, run, first, outside);  // kChannels
    return true;
  }
  switch (s.kind) {
    case Kind::kPlanar:
      bilinear_masked_block<1, OutT>(c, block, s, run, first);
      return false;
    case Kind::kPairs:
      bilinear_masked_block<2, OutT>(c, block, s, run, first);
      return false;
    case Kind::kTriples:
      bilinear_triples_block<OutT>(c, block, s, run, first, outside);
      return true;
    case Kind::kEights:
    case Kind::kSixteens:
      bilinear_wide_block<OutT>(c, block, s, run, first, outside);
      return true;
    default:  // select_kind returns no other bilinear kind for AVX-512
      return false;
  }
}

// Which second pass applies, if any (see x86_any_applies).
template <typename OutT>
bool select_kind(const View4<const int8_t>& image, const View4<OutT>& output,
                 const QuantizedPlan& plan, bool wide, Kind* kind) {
  const core::Layout l = core::layout_of(image, output);
  const int64_t* const is = image.strides;
  if (!core::vector_limits_hold<OutT>(l, plan) ||
      (l.height - 1) * is[2] + (l.width + 1) * is[3] + 64 >= (int64_t(1) << 31)) {
    return false;
  }
  *kind = core::natural_kind(l, plan.params.mode == Mode::kNearest);
  switch (*kind) {
    case Kind::kNearPlanar:
    case Kind::kNear2:
    case Kind::kNear3:
      return l.extent >= 4;  // 32-bit gathers
    case Kind::kNear4:
    case Kind::kNear8:
    case Kind::kNear16:
      return true;
    case Kind::kNearStrided:
      return false;
    default:
      break;
  }
  if (l.width < 2) {
    return false;
  }
  if (*kind == Kind::kPlanar) {
    return l.extent >= 4;
  }
  if (!wide) {  // AVX2: planar and channels-last bilinear (4 channels: quantized_x86.cpp)
    *kind = Kind::kChannels;
    return l.channels_last && l.channels >= 2 && l.height >= 2;
  }
  switch (*kind) {
    case Kind::kPairs:
      return true;
    case Kind::kTriples:
    case Kind::kEights:
    case Kind::kSixteens:
      return l.height >= 2;
    default:
      return false;  // 4 channels: quantized_x86.cpp; others: AVX2
  }
}

// x86's coordinate forms: the split, float64 and scalar ones besides the core's.
constexpr core::FormSet kFormSet{true, true, true, 0, 0, 0};

template <typename GridT, typename OutT>
void make_setup(const View4<const int8_t>& image, const View4<const GridT>& grid,
                const QuantizedPlan& p, Kind kind, Setup* s) {
  constexpr bool kInt16 = std::is_same_v<GridT, int16_t>;
  constexpr bool kFloatOutput = std::is_same_v<OutT, float>;
  core::make_setup<GridT, OutT>(image, grid, p, kind, kFormSet, s);
  const Padding padding = p.params.padding;
  s->float_x = plan_axis_vector(p.x, p.grid_zero_point, padding, kInt16);
  s->float_y = plan_axis_vector(p.y, p.grid_zero_point, padding, kInt16);
  using C = Coordinates;
  if (s->coordinates == C::kInteger) {
    s->split_x = plan_axis_split(s->integer_x);
    s->split_y = plan_axis_split(s->integer_y);
    // the split form reads (x, y) pairs; the AVX2 pass takes the integer one
    if (s->pairs && s->split_x.applies && s->split_y.applies) {
      s->coordinates = C::kSplit;
    }
  } else if (kInt16 && !s->nearest && s->float_x.applies && s->float_y.applies) {
    s->coordinates = C::kFloat;  // before the exact form
  }
  const bool narrow_form = !kFloatOutput && s->narrow.applies;
  s->sample = plan_wide_sample(p, s->narrow, !narrow_form);
  const Requant narrow_kind = s->sample.folded ? Requant::kFolded : Requant::kNarrow;
  s->requant = kFloatOutput ? Requant::kFloat : (narrow_form ? narrow_kind : Requant::kWide);
}

template <typename GridT, typename OutT>
void rows_any(const View4<const int8_t>& image, const View4<const GridT>& grid,
              const View4<OutT>& output, const QuantizedPlan& plan, Kind kind, bool wide,
              int64_t row_begin, int64_t row_end) {
  const QuantizedPlan p = plan;
  Setup s;
  make_setup<GridT, OutT>(image, grid, p, kind, &s);
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  const int64_t output_x = output.strides[3];
  // Small outputs (a correlation lookup samples 9 x 9 pixels per image) run many batch elements
  // at a time where the masked and nearest passes serve them: each pixel then carries its
  // element's image offset (32 bits).
  const int64_t batch = image.sizes[0], image_n = image.strides[0];
  const int64_t plane_reach = (image.sizes[2] - 1) * image.strides[2] +
                              (image.sizes[3] + 1) * image.strides[3] + 64;
  const bool flat_batch = batch > 1 && kind != Kind::kTriples && kind != Kind::kEights &&
                          kind != Kind::kSixteens && kind != Kind::kChannels &&
                          core::batches_flat(grid, output) &&
                          (batch - 1) * image_n + plane_reach < (int64_t(1) << 31);
  steps::Plane plane{nullptr,          image.sizes[1],   image.sizes[2],  image.sizes[3],
                     image.strides[1], image.strides[2], image.strides[3]};
  Coords coords[2];
  for (Coords& c : coords) {
    c.batched = false;
    c.plane_max = 0;
  }
  uint16_t outside[kRun / 16];
  core::for_each_run(grid, output, row_begin, row_end, flat_batch, [&](const auto& run) {
    plane.data = image.data + run.n * image_n;
    const Run r{plane.data, run.n * image_n, run.grid, run.out, output.strides[1], output_x};
    // Pass 1 runs a block ahead of pass 2; where a block spans batch elements, it prefetches the
    // image lines of its pixels, whose addresses are no stream the hardware prefetchers follow.
    const auto first_pass = [&](int64_t first, int64_t block, Coords* c) {
      // the grid points two blocks on, as quantized_x86.cpp does
      if (s.pairs && first + 2 * kRun < run.count) {
        const char* const ahead = reinterpret_cast<const char*>(run.grid + (first + 2 * kRun) * 2);
        const int64_t bytes =
            std::min(kRun, run.count - first - 2 * kRun) * 2 * int64_t(sizeof(GridT));
        for (int64_t b = 0; b < bytes; b += 64) {
          _mm_prefetch(ahead + b, _MM_HINT_T0);
        }
      }
      if (wide) {
        avx512::coordinates(run.grid + first * grid_x, grid_x, grid_axis, block, s, p, c);
      } else {
        avx2::coordinates(run.grid + first * grid_x, grid_x, grid_axis, block, s, p, c);
      }
      if (flat_batch) {
        // each pixel's batch element, from n; the lanes past the block read its last element
        c->plane_max = static_cast<int32_t>(
            core::element_offsets(run.n, run.oy, first, block, out_height, out_width, image_n,
                                  run.n * image_n, (block + 15) / 16 * 16, c->plane));
        c->batched = true;
        // (measured: on rows of a near-identity warp the prefetches cost more than they save)
        prefetch_block(*c, block, s, r);
      }
    };
    const auto second_pass = [&](int64_t first, int64_t block, const Coords& c) {
      if (second_pass_block<OutT>(c, block, s, r, first, wide, outside)) {
        core::redo_outside(outside, first, block, run.grid, grid_x, grid_axis, plane, run.out,
                           output_x, output.strides[1], p);
      }
    };
    core::run_blocks<true>(run.count, coords, first_pass, second_pass);
  });
}

}  // namespace

template <typename OutT>
bool x86_any_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                     const QuantizedPlan& plan, bool avx512) {
  Kind kind;
  return (avx512 ? avx512_supported() : avx2_supported()) &&
         select_kind(image, output, plan, avx512, &kind);
}

template <typename GridT, typename OutT>
void grid_sample_quantized_x86_any(const View4<const int8_t>& image,
                                   const View4<const GridT>& grid, const View4<OutT>& output,
                                   const QuantizedPlan& plan, int64_t row_begin, int64_t row_end,
                                   bool avx512) {
  Kind kind;
  if (!x86_any_applies(image, output, plan, avx512) ||
      !select_kind(image, output, plan, avx512, &kind)) {
    std::abort();  // callers check x86_any_applies
  }
  rows_any(image, grid, output, plan, kind, avx512, row_begin, row_end);
}

#else  // no vectorized kernel on this architecture

template <typename OutT>
bool x86_any_applies(const View4<const int8_t>&, const View4<OutT>&, const QuantizedPlan&,
                     bool) {
  return false;
}

template <typename GridT, typename OutT>
void grid_sample_quantized_x86_any(const View4<const int8_t>&, const View4<const GridT>&,
                                   const View4<OutT>&, const QuantizedPlan&, int64_t, int64_t,
                                   bool) {
  std::abort();  // unreachable: x86_any_applies is false
}

#endif

template bool x86_any_applies<int8_t>(const View4<const int8_t>&, const View4<int8_t>&,
                                      const QuantizedPlan&, bool);
template bool x86_any_applies<float>(const View4<const int8_t>&, const View4<float>&,
                                     const QuantizedPlan&, bool);
#define ETKIT_INSTANTIATE(GridT, OutT)                                           \
  template void grid_sample_quantized_x86_any<GridT, OutT>(                     \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&, \
      const QuantizedPlan&, int64_t, int64_t, bool);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE

}  // namespace etkit::gridsampler