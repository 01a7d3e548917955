// The integer grid sampler's hot case in Google Highway (1.0.3 API), one source for AVX2,
// AVX-512 (AVX3, AVX3_DL), SSE4 and NEON: bilinear, 4-channel channels-last int8 image, int16
// grid, int8 output. It follows the hand-written AVX2 kernel's plan (quantized_x86.cpp): per
// block of up to 256 output pixels of a row, a first pass computes steps 1 to 3 (taps and
// weights, one pixel per 32-bit lane) and prefetches the image lines, a second pass gathers each
// pixel's taps as two 64-bit words (upper row [v00 | v01], lower row [v10 | v11]) into one
// 128-bit block and computes steps 4 and 5 for the four channels there with 16-bit pairwise
// multiply-adds. Every rewrite gives the scalar steps' bits (quantized_steps.h); a pixel with a
// tap outside the image that carries weight is redone by the scalar steps.
//
// Step 4 as computed here. With the taps u = q + 128 (the bytes XOR 0x80, zero-extended: the
// bias cancels in every difference), a = v01 - v00, e = v10 - v00, e' = v11 - v01, b = e' - e and
// wx * wy = h * 2^15 + l (h, l < 2^15), the scalar value
//   shift_round(top * 2^15 + (bottom - top) * wy, 15)
//     = (v00 - zero) * 2^15 + a * wx + e * wy + b * h + ((b * l + 2^14) >> 15)
// (the other terms are multiples of 2^15), and each product is one 16-bit pairwise multiply-add:
//   [u00, u00].[2^14, 2^14] + [a, e].[wx, wy] + [e', e].[h, -h] + ([e', e].[l, -l] + 2^14) >> 15
// less (128 + zero) * 2^15. Weights stay below 2^15: at the far edges x0 = width - 1 with wx = 0
// the upper word is loaded 4 bytes early and shifted right by 32 bits (v01 reads 0, weight 0), and
// y0 = height - 1 with wy = 0 reads row y0 again for the lower row (weight 0), as in the AVX2
// kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "hwy_sampler.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off: foreach_target.h must come first
#include "hwy/highway.h"
#include "hwy/cache_control.h"
// clang-format on

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "hwy_sampler.h"
#include "quantized_forms.h"
#include "quantized_steps.h"

#ifndef ETKIT_HWY_PLAN_ONCE
#define ETKIT_HWY_PLAN_ONCE
namespace etkit::hwybench {
namespace gs = gridsampler;

// Steps 1 and 2 and step 3's Q (x0 << 15 | w) for an int16 grid with zeros or border padding, in
// 64-bit integer lanes: Q = clamp(floor((q * M + C) / 2^S), low, high), derived by
// quantized_forms.h (the library's AxisInteger, as the hand-written kernels use it).
using AxisInt = gs::AxisInteger;

// Everything the passes need beyond the scalar plan.
struct HwyPlan {
  bool integer_coords;  // both axes in AxisInt form, (x, y) pairs one after the other
  AxisInt x, y;
  int32_t last_x0, last_y0, stride_y;  // width - 2, height - 2, the row stride in bytes
  int32_t value_constant;              // -(128 + image zero point) * 2^15
  // step 5: narrow (m < 2^8, s <= 24: 32-bit lanes) or wide (64-bit products)
  bool narrow;
  int32_t narrow_multiplier;
  int narrow_shift;
  int32_t narrow_round;  // 2^(s-1) - 1
  int32_t wide_multiplier;
  int wide_shift;
  int64_t wide_round;  // 2^(k-1) - 1
  int32_t output_zero, output_min, output_max;
};

// Q of a pixel coordinate from the scalar steps (reflection padding, strided grids):
// gs::scalar_tap.
using gs::scalar_tap;

inline HwyPlan make_plan(const View4<const int8_t>& image, const View4<const int16_t>& grid,
                         const QuantizedPlan& p) {
  HwyPlan t{};
  t.x = gs::plan_axis_integer(p.x, p.grid_zero_point, p.params.padding, true);
  t.y = gs::plan_axis_integer(p.y, p.grid_zero_point, p.params.padding, true);
  t.integer_coords = t.x.applies && t.y.applies && grid.strides[2] == 2 && grid.strides[3] == 1;
  t.last_x0 = static_cast<int32_t>(image.sizes[3] - 2);
  t.last_y0 = static_cast<int32_t>(image.sizes[2] - 2);
  t.stride_y = static_cast<int32_t>(image.strides[2]);
  t.value_constant = static_cast<int32_t>(-(128 + p.image_zero_point) * 32768);
  int64_t m = p.requant_multiplier, s = p.requant_shift;
  while (m > 0 && (m & 1) == 0 && s > 1) {
    m >>= 1;
    --s;
  }
  t.narrow = m > 0 && m < 256 && s <= 24;
  t.narrow_multiplier = static_cast<int32_t>(m);
  t.narrow_shift = static_cast<int>(s);
  t.narrow_round = static_cast<int32_t>((int64_t(1) << (s - 1)) - 1);
  t.wide_multiplier = static_cast<int32_t>(p.requant_multiplier);
  t.wide_shift = static_cast<int>(p.requant_shift);
  t.wide_round = (int64_t(1) << (p.requant_shift - 1)) - 1;
  t.output_zero = static_cast<int32_t>(p.output_zero_point);
  t.output_min = static_cast<int32_t>(p.output_min);
  t.output_max = static_cast<int32_t>(p.output_max);
  return t;
}

constexpr int64_t kBlock = 256;
constexpr int64_t kPad = 64;  // lanes read past a block's last pixel
constexpr int64_t kStep = 16;  // a block's pixel count is a multiple of this and of the lanes

// A block's first-pass results.
struct Block {
  alignas(64) int32_t pairs[2 * (kBlock + kPad)];   // [upper, lower] byte offsets per pixel
  alignas(64) int32_t shifts[2 * (kBlock + kPad)];  // [32, 32] at x0 = width - 1, else [0, 0]
  alignas(64) int32_t wxy[kBlock + kPad];           // wx | wy << 16
  alignas(64) int32_t hmh[kBlock + kPad];           // h | -h << 16
  alignas(64) int32_t lml[kBlock + kPad];           // l | -l << 16
  alignas(64) int32_t inside[kBlock + kPad];        // -1: on the vector path; 0: redo
  bool all_inside[kBlock];                          // per vector of the first pass
};

}  // namespace etkit::hwybench
#endif  // ETKIT_HWY_PLAN_ONCE

HWY_BEFORE_NAMESPACE();
namespace etkit::hwybench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace gs = gridsampler;

#if HWY_TARGET != HWY_SCALAR  // HWY_SCALAR (one lane, the x86 SSE2 baseline) has no byte tables
using D32 = hn::ScalableTag<int32_t>;
using V32 = hn::Vec<D32>;

// Q of a vector of grid values q (sign-extended int32 lanes): even lanes through 64-bit
// products shifted right by S, odd lanes shifted left by 32 - S so that Q lands in the upper half.
HWY_INLINE V32 IntegerTap(D32 d, V32 q, const AxisInt& a) {
  const hn::Repartition<int64_t, D32> d64;
  const hn::Repartition<uint64_t, D32> du64;
  const auto multiplier = hn::Set(d, a.multiplier);
  const auto constant = hn::Set(d64, a.constant);
  const auto even = hn::Add(hn::MulEven(q, multiplier), constant);
  const auto q_odd = hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(du64, q)));
  const auto odd = hn::Add(hn::MulEven(q_odd, multiplier), constant);
  const auto even_q = hn::BitCast(d, hn::ShiftRightSame(hn::BitCast(du64, even), a.shift));
  const auto odd_q = hn::BitCast(d, hn::ShiftLeftSame(hn::BitCast(du64, odd), 32 - a.shift));
  return hn::Min(hn::Max(hn::OddEven(odd_q, even_q), hn::Set(d, a.low)), hn::Set(d, a.high));
}

// Steps 1 to 3 for pixels [0, count) of a block (count a multiple of kStep).
template <bool kInteger>
HWY_NOINLINE void FirstPass(const int16_t* grid, int64_t grid_x, int64_t grid_axis, int64_t count,
                            const HwyPlan& t, const QuantizedPlan& p, Block* b) {
  const D32 d;
  const hn::RebindToUnsigned<D32> du;
  const hn::Repartition<int16_t, D32> d16;
  const size_t n = hn::Lanes(d);
  const auto weight_mask = hn::Set(d, 0x7fff);
  const auto zero = hn::Zero(d);
  const auto last_x0 = hn::Set(du, static_cast<uint32_t>(t.last_x0));
  const auto last_y0 = hn::Set(du, static_cast<uint32_t>(t.last_y0));
  const auto last_x1 = hn::Set(d, t.last_x0 + 1), last_y1 = hn::Set(d, t.last_y0 + 1);
  const auto stride_y = hn::Set(d, t.stride_y);
  const auto four = hn::Set(d, 4), thirty_two = hn::Set(d, 32);
  for (int64_t i = 0; i < count; i += static_cast<int64_t>(n)) {
    V32 qx, qy;
    if constexpr (kInteger) {
      const V32 xy = hn::BitCast(d, hn::LoadU(d16, grid + 2 * i));
      qx = IntegerTap(d, hn::ShiftRight<16>(hn::ShiftLeft<16>(xy)), t.x);
      qy = IntegerTap(d, hn::ShiftRight<16>(xy), t.y);
    } else {
      HWY_ALIGN int32_t tx[HWY_MAX_BYTES / 4], ty[HWY_MAX_BYTES / 4];
      for (size_t k = 0; k < n; ++k) {
        const int16_t* const point = grid + (i + static_cast<int64_t>(k)) * grid_x;
        tx[k] = scalar_tap(gs::steps::pixel_coordinate(point[0], p, p.x), p.x.size);
        ty[k] = scalar_tap(gs::steps::pixel_coordinate(point[grid_axis], p, p.y), p.y.size);
      }
      qx = hn::Load(d, tx);
      qy = hn::Load(d, ty);
    }
    const auto x0 = hn::ShiftRight<15>(qx), wx = hn::And(qx, weight_mask);
    const auto y0 = hn::ShiftRight<15>(qy), wy = hn::And(qy, weight_mask);
    const auto edge_x = hn::And(hn::Eq(x0, last_x1), hn::Eq(wx, zero));
    const auto edge_y = hn::And(hn::Eq(y0, last_y1), hn::Eq(wy, zero));
    const auto x0u = hn::BitCast(du, x0), y0u = hn::BitCast(du, y0);
    const auto in_x = hn::RebindMask(d, hn::Eq(hn::Min(x0u, last_x0), x0u));
    const auto in_y = hn::RebindMask(d, hn::Eq(hn::Min(y0u, last_y0), y0u));
    const auto inside = hn::And(hn::Or(in_x, edge_x), hn::Or(in_y, edge_y));
    const auto upper = hn::Sub(hn::Add(hn::Mul(y0, stride_y), hn::ShiftLeft<2>(x0)),
                               hn::IfThenElseZero(edge_x, four));
    const auto lower = hn::Add(upper, hn::IfThenZeroElse(edge_y, stride_y));
    hn::StoreInterleaved2(hn::IfThenElseZero(inside, upper), hn::IfThenElseZero(inside, lower), d,
                          b->pairs + 2 * i);
    const auto shift = hn::IfThenElseZero(hn::And(inside, edge_x), thirty_two);
    hn::StoreInterleaved2(shift, shift, d, b->shifts + 2 * i);
    const auto product = hn::Mul(wx, wy);  // at most (2^15 - 1)^2
    const auto h = hn::ShiftRight<15>(product), l = hn::And(product, weight_mask);
    hn::Store(hn::Or(wx, hn::ShiftLeft<16>(wy)), d, b->wxy + i);
    hn::Store(hn::Or(h, hn::ShiftLeft<16>(hn::Neg(h))), d, b->hmh + i);
    hn::Store(hn::Or(l, hn::ShiftLeft<16>(hn::Neg(l))), d, b->lml + i);
    hn::Store(hn::VecFromMask(d, inside), d, b->inside + i);
    b->all_inside[i / static_cast<int64_t>(n)] = hn::AllTrue(d, inside);
  }
}

// A per-lane logical right shift (SVE's sizeless vectors have no operator>> in 1.0.3).
template <class V>
HWY_INLINE V ShiftRightLanes(V v, V bits) {
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || \
    HWY_TARGET == HWY_SVE2_128
  return hn::Shr(v, bits);
#else
  return v >> bits;
#endif
}

// The 16-bit pairwise multiply-add sum of adjacent products, a[2i] b[2i] + a[2i+1] b[2i+1].
template <class V16>
HWY_INLINE V32 Madd(D32 d, V16 a, V16 b) {
  auto sum1 = hn::Zero(d);
  const auto sum0 = hn::ReorderWidenMulAccumulate(d, a, b, hn::Zero(d), sum1);
  return hn::RearrangeToOddPlusEven(sum0, sum1);
}

// How step 5 runs: narrow with m = 1, narrow, or wide (see HwyPlan).
enum Requant { kNarrowUnit = 0, kNarrow = 1, kWide = 2 };

// Step 5 of value vectors (4 channels of one pixel per 128-bit block).
template <int kRequant>
HWY_INLINE V32 Requantize(D32 d, V32 value, const HwyPlan& t) {
  V32 q;
  if constexpr (kRequant != kWide) {
    const auto x =
        kRequant == kNarrowUnit ? value : hn::Mul(value, hn::Set(d, t.narrow_multiplier));
    const auto odd_bit = hn::And(hn::ShiftRightSame(x, t.narrow_shift), hn::Set(d, 1));
    q = hn::ShiftRightSame(hn::Add(x, hn::Add(hn::Set(d, t.narrow_round), odd_bit)),
                           t.narrow_shift);
  } else {
    const hn::Repartition<uint64_t, D32> du64;
    const auto multiplier = hn::Set(d, t.wide_multiplier);
    const auto round = hn::Set(du64, static_cast<uint64_t>(t.wide_round));
    const auto one = hn::Set(du64, 1);
    const auto rounded = [&](V32 lanes) {
      const auto x = hn::BitCast(du64, hn::MulEven(lanes, multiplier));
      return hn::Add(x, hn::Add(round, hn::And(hn::ShiftRightSame(x, t.wide_shift), one)));
    };
    const auto even = rounded(value);
    const auto odd = rounded(hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(du64, value))));
    // k >= 32: the upper 32 bits shifted arithmetically by k - 32
    q = hn::ShiftRightSame(
        hn::OddEven(hn::BitCast(d, odd), hn::BitCast(d, hn::ShiftRight<32>(even))),
        t.wide_shift - 32);
  }
  q = hn::Add(q, hn::Set(d, t.output_zero));
  return hn::Min(hn::Max(q, hn::Set(d, t.output_min)), hn::Set(d, t.output_max));
}

// Steps 4 and 5 for pixels [0, count) of a block: P = lanes / 4 pixels per vector, one per
// 128-bit block; four vectors per iteration, their gathers first.
template <int kRequant>
HWY_NOINLINE void SecondPass(const Block& b, int64_t count, const int8_t* plane, int8_t* out,
                             const HwyPlan& plan) {
  const HwyPlan t = plan;  // locals: the int8 stores may alias anything
  const D32 d;
  const hn::Repartition<int64_t, D32> d64;
  const hn::Repartition<uint64_t, D32> du64;
  const hn::Rebind<int32_t, decltype(d64)> dh32;
  const hn::Rebind<uint32_t, decltype(d64)> dhu32;
  const hn::Repartition<uint8_t, D32> du8;
  const hn::Repartition<int16_t, D32> d16;
  const hn::Rebind<int8_t, D32> d8;
  const int64_t pixels = static_cast<int64_t>(hn::Lanes(d) / 4);
  // Per block: bytes 0-3 v00, 4-7 v01, 8-11 v10, 12-15 v11 (channels 0-3); 0x80 reads 0.
  alignas(16) static constexpr uint8_t kX0[16] = {0, 128, 0, 128, 1, 128, 1, 128,
                                                  2, 128, 2, 128, 3, 128, 3, 128};  // [u00, u00]
  alignas(16) static constexpr uint8_t kX1[16] = {4, 128, 8,  128, 5, 128, 9,  128,
                                                  6, 128, 10, 128, 7, 128, 11, 128};  // [u01, u10]
  alignas(16) static constexpr uint8_t kX2[16] = {4, 128, 0, 128, 5, 128, 1, 128,
                                                  6, 128, 2, 128, 7, 128, 3, 128};  // [u01, u00]
  alignas(16) static constexpr uint8_t kX3[16] = {12, 128, 8,  128, 13, 128, 9,  128,
                                                  14, 128, 10, 128, 15, 128, 11, 128};  // [u11, u10]
  const auto x0_index = hn::LoadDup128(du8, kX0), x1_index = hn::LoadDup128(du8, kX1);
  const auto x2_index = hn::LoadDup128(du8, kX2), x3_index = hn::LoadDup128(du8, kX3);
  HWY_ALIGN int32_t spread[HWY_MAX_BYTES / 4];
  for (size_t k = 0; k < hn::Lanes(d); ++k) {
    spread[k] = static_cast<int32_t>(k / 4);  // pixel k / 4's weights into block k / 4
  }
  const auto spread_index = hn::SetTableIndices(d, spread);
  const auto bias = hn::Set(du8, 0x80);
  const auto half_pair = hn::BitCast(d16, hn::Set(d, (1 << 14) | (1 << 30)));  // [2^14, 2^14]
  const auto constant = hn::Set(d, t.value_constant);
  const auto round = hn::Set(d, 1 << 14);
  const int64_t* const base = reinterpret_cast<const int64_t*>(plane);
  const auto gather = [&](int64_t i) {
    const auto offsets = hn::PromoteTo(d64, hn::LoadU(dh32, b.pairs + 2 * i));
    const auto shifts = hn::PromoteTo(
        du64, hn::LoadU(dhu32, reinterpret_cast<const uint32_t*>(b.shifts) + 2 * i));
    return ShiftRightLanes(hn::BitCast(du64, hn::GatherOffset(d64, base, offsets)), shifts);
  };
  const auto sample = [&](int64_t i, hn::Vec<decltype(du64)> taps) {
    const auto bytes = hn::Xor(hn::BitCast(du8, taps), bias);
    const auto x0 = hn::BitCast(d16, hn::TableLookupBytesOr0(bytes, x0_index));
    const auto x1 = hn::BitCast(d16, hn::TableLookupBytesOr0(bytes, x1_index));
    const auto x2 = hn::BitCast(d16, hn::TableLookupBytesOr0(bytes, x2_index));
    const auto x3 = hn::BitCast(d16, hn::TableLookupBytesOr0(bytes, x3_index));
    const auto a_e = hn::Sub(x1, x0);   // [a, e]
    const auto e1_e = hn::Sub(x3, x2);  // [e', e]: [h, -h] gives b h
    const auto wxy = hn::TableLookupLanes(hn::LoadU(d, b.wxy + i), spread_index);
    const auto hmh = hn::TableLookupLanes(hn::LoadU(d, b.hmh + i), spread_index);
    const auto lml = hn::TableLookupLanes(hn::LoadU(d, b.lml + i), spread_index);
    const auto linear = hn::Add(Madd(d, x0, half_pair), Madd(d, a_e, hn::BitCast(d16, wxy)));
    const auto cross = hn::Add(Madd(d, e1_e, hn::BitCast(d16, hmh)), constant);
    const auto rounded = hn::ShiftRight<15>(hn::Add(Madd(d, e1_e, hn::BitCast(d16, lml)), round));
    const auto value = hn::Add(hn::Add(linear, cross), rounded);
    hn::StoreU(hn::DemoteTo(d8, Requantize<kRequant>(d, value, t)), d8, out + 4 * i);
  };
  for (int64_t i = 0; i < count; i += 4 * pixels) {  // count: a multiple of the lanes, 4 P
    const auto taps0 = gather(i), taps1 = gather(i + pixels);
    const auto taps2 = gather(i + 2 * pixels), taps3 = gather(i + 3 * pixels);
    sample(i, taps0);
    sample(i + pixels, taps1);
    sample(i + 2 * pixels, taps2);
    sample(i + 3 * pixels, taps3);
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// Rows [row_begin, row_end), blocks in two passes, the first a block ahead of the second.
HWY_NOINLINE void SampleRows(const View4<const int8_t>& image, const View4<const int16_t>& grid,
                             const View4<int8_t>& output, const QuantizedPlan& plan,
                             const HwyPlan& t, int64_t row_begin, int64_t row_end) {
  const QuantizedPlan p = plan;
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  (void)t;  // unused on HWY_SCALAR
  gs::steps::Plane plane{nullptr,          image.sizes[1],   image.sizes[2],  image.sizes[3],
                         image.strides[1], image.strides[2], image.strides[3]};
#if HWY_TARGET != HWY_SCALAR
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t step = std::max(kStep, lanes);  // a block's pixel count is a multiple of this
  static thread_local Block blocks[2];
#endif
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / out_height, oy = row % out_height;
    const int16_t* const grid_row = grid.data + n * grid.strides[0] + oy * grid.strides[1];
    plane.data = image.data + n * image.strides[0];
    int8_t* const output_row = output.data + n * output.strides[0] + oy * output.strides[2];
    const auto scalar_pixel = [&](int64_t ox) {
      const int16_t* const point = grid_row + ox * grid_x;
      gs::steps::sample_pixel(gs::steps::pixel_coordinate(point[0], p, p.x),
                              gs::steps::pixel_coordinate(point[grid_axis], p, p.y), plane,
                              output_row + ox * output.strides[3], output.strides[1], p);
    };
    int64_t ox = 0;
#if HWY_TARGET != HWY_SCALAR
    const auto first_pass = [&](int64_t ox, Block* b) {
      const int64_t count = std::min<int64_t>(kBlock, (out_width - ox) / step * step);
      const int16_t* const first = grid_row + ox * grid_x;
      if (t.integer_coords) {
        FirstPass<true>(first, grid_x, grid_axis, count, t, p, b);
      } else {
        FirstPass<false>(first, grid_x, grid_axis, count, t, p, b);
      }
      // the image lines the gathers will read: not a stream the hardware prefetchers follow
      for (int64_t j = 0; j < count; j += 8) {
        hwy::Prefetch(plane.data + b->pairs[2 * j]);
        hwy::Prefetch(plane.data + b->pairs[2 * j + 1]);
      }
      return count;
    };
    int current = 0;
    int64_t count = out_width >= step ? first_pass(0, &blocks[0]) : 0;
    while (count > 0) {
      const int64_t next_ox = ox + count;
      const int64_t next_count = count == kBlock && next_ox + step <= out_width
                                     ? first_pass(next_ox, &blocks[current ^ 1])
                                     : 0;
      const Block& b = blocks[current];
      int8_t* const out = output_row + ox * 4;
      if (t.narrow && t.narrow_multiplier == 1) {
        SecondPass<kNarrowUnit>(b, count, plane.data, out, t);
      } else if (t.narrow) {
        SecondPass<kNarrow>(b, count, plane.data, out, t);
      } else {
        SecondPass<kWide>(b, count, plane.data, out, t);
      }
      for (int64_t v = 0; v < count / lanes; ++v) {
        if (!b.all_inside[v]) {
          for (int64_t k = v * lanes; k < (v + 1) * lanes; ++k) {
            if (b.inside[k] == 0) {
              scalar_pixel(ox + k);
            }
          }
        }
      }
      ox = next_ox;
      count = next_count;
      current ^= 1;
    }
#endif
    for (; ox < out_width; ++ox) {
      scalar_pixel(ox);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace etkit::hwybench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace etkit::hwybench {

HWY_EXPORT(SampleRows);

namespace {
#if HWY_TARGETS & (HWY_TARGETS - 1)  // more than one target: dynamic dispatch (libhwy)
int64_t supported() { return hwy::SupportedTargets(); }
#else  // one static target (e.g. NEON from headers alone): no libhwy needed
int64_t supported() { return HWY_STATIC_TARGET; }
#endif

int64_t target_bit(Target target) {
  switch (target) {
    case Target::kBest:
      return 0;
    case Target::kAvx2:
      return HWY_AVX2;
    case Target::kAvx3:
      return HWY_AVX3;
    case Target::kAvx3Dl:
      return HWY_AVX3_DL;
    case Target::kSse4:
      return HWY_SSE4;
    case Target::kNeon:
      return HWY_NEON;
    case Target::kSve:
      return HWY_SVE;
    case Target::kEmu128:
      return HWY_EMU128;
  }
  return 0;
}
}  // namespace

bool target_available(Target target) {
  if (target == Target::kBest) {
    return true;
  }
  const int64_t bit = target_bit(target);
  return (HWY_TARGETS & bit) != 0 && (supported() & bit) != 0;
}

const char* best_target_name() {
  const int64_t usable = HWY_TARGETS & supported();
  return hwy::TargetName(usable & -usable);  // the lowest bit is the best target
}

bool hwy_applies(const View4<const int8_t>& image, const View4<int8_t>& output,
                 const QuantizedPlan& plan) {
  const int64_t height = image.sizes[2], width = image.sizes[3], stride_y = image.strides[2];
  return plan.params.mode == gridsampler::Mode::kBilinear && image.sizes[1] == 4 &&
         image.strides[1] == 1 && image.strides[3] == 4 && stride_y % 4 == 0 &&
         output.strides[1] == 1 && output.strides[3] == 4 && height >= 2 && width >= 2 &&
         height < (1 << 14) && width < (1 << 14) && stride_y >= 0 &&
         (height - 1) * stride_y + width * 4 < (int64_t(1) << 31) &&
         plan.image_zero_point >= -128 && plan.image_zero_point <= 127 &&
         plan.requant_shift >= 32 && plan.requant_shift <= 62 && plan.output_min >= -128 &&
         plan.output_max <= 127 && plan.requant_multiplier > 0 &&
         plan.requant_multiplier < (int64_t(1) << 31) && plan.output_zero_point >= -32768 &&
         plan.output_zero_point <= 32767;
}

void hwy_sample_rows(const View4<const int8_t>& image, const View4<const int16_t>& grid,
                     const View4<int8_t>& output, const QuantizedPlan& plan, int64_t row_begin,
                     int64_t row_end, Target target) {
  const HwyPlan t = make_plan(image, grid, plan);
  switch (target) {
#if HWY_TARGETS & HWY_AVX2
    case Target::kAvx2:
      return N_AVX2::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_AVX3
    case Target::kAvx3:
      return N_AVX3::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_AVX3_DL
    case Target::kAvx3Dl:
      return N_AVX3_DL::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_SSE4
    case Target::kSse4:
      return N_SSE4::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_NEON
    case Target::kNeon:
      return N_NEON::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_SVE
    case Target::kSve:
      return N_SVE::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
#if HWY_TARGETS & HWY_EMU128
    case Target::kEmu128:
      return N_EMU128::SampleRows(image, grid, output, plan, t, row_begin, row_end);
#endif
    default:
      return HWY_DYNAMIC_DISPATCH(SampleRows)(image, grid, output, plan, t, row_begin, row_end);
  }
}

}  // namespace etkit::hwybench
#endif  // HWY_ONCE
