// The parts of quantized_x86_any.cpp's second passes whose control flow is the same on both x86
// targets, written once over their traits (as quantized_pass1.h, and included the same way:
// once per target, inside a namespace that names the traits `V` (Avx512, Avx2) and with
// ETKIT_TARGET its target attribute). What the traits give: lanes and their masks (AVX-512
// mask registers, AVX2 lanes of all ones), loads, gathers and byte packing, step 5's registers
// and the stores of raw image values (AVX-512: a vpermt2b table; AVX2: the arithmetic of
// requantize8). What stays per target in quantized_x86_any.cpp is where the instructions differ:
// step 4 (VNNI dot products, or 16-bit multiply-adds) and the bilinear passes built on it. No
// include guard, on purpose. Internal to the native library.

// ---- bilinear, planar images and 2 channels: the taps of one row of lanes ----

// The taps of one row of V::kLanes pixels, gathered from `base` at byte offsets `offsets`
// clamped to `limit` (the last offset a 32-bit load may read without passing the image's end),
// shifted so that byte 0 is the one at offsets + `shift` bytes (shift may be negative: then
// bytes enter from below as zeros).
ETKIT_TARGET inline typename V::I gather_row(const int8_t* base, typename V::I offsets,
                                             typename V::I shift_bits, bool shifted,
                                             typename V::I limit, bool clamp_end) {
  using I = typename V::I;
  if (!shifted && !clamp_end) {
    return V::gather32(offsets, base);
  }
  I address = offsets;
  I bits = shift_bits;
  if (clamp_end) {
    address = V::min(offsets, limit);
    bits = V::add(bits, V::template slli<3>(V::sub(offsets, address)));
  }
  const I raw = V::gather32(address, base);
  // a negative shift is a left shift; shifts of 32 bits or more give 0
  const I zero = V::set1(0);
  const I right = V::srlv(raw, V::max(bits, zero));
  return V::sllv(right, V::max(V::sub(zero, bits), zero));
}

// Where the taps of a row of pixels lie (planar images: kBytes 1; 2 channels: 2), before the
// channel: the image offsets of their upper and lower rows, the shift that puts tap x0 at byte 0
// (bits), and, where a tap lies outside the image, which bytes of each lane [q00, q01, q10, q11]
// are inside (the others read the image zero point: v = q - zero = 0, as the scalar steps' zero).
struct PlanarTaps {
  typename V::I upper, lower, shift_bits, inside;
  bool all_inside, shifted;
};

// The image's bounds and row stride in registers, made once per block (the loops store bytes,
// which may alias the set-up: read in the loop, it would be read again for every row of lanes).
struct PlanarBounds {
  typename V::I last_x, last_y, last_x0, stride_y;
  bool small_stride;
};

ETKIT_TARGET inline PlanarBounds planar_bounds(const Setup& s) {
  return {V::set1(s.width - 1), V::set1(s.height - 1), V::set1(s.width - 2),
          V::set1(static_cast<int32_t>(s.stride_y)), s.stride_y < (1 << 15)};
}

// The taps of the row of lanes from pixel i (pass 1's Q: x0 = Q >> 15).
template <int kBytes>
ETKIT_TARGET inline PlanarTaps planar_taps(const Coords& c, int64_t i, const PlanarBounds& b) {
  using I = typename V::I;
  using M = typename V::M;
  const I x0 = V::template srai<kWeightBits>(V::load(c.x + i));
  const I y0 = V::template srai<kWeightBits>(V::load(c.y + i));
  const I zero = V::set1(0), one = V::set1(1);
  // The taps inside the image.
  const M in_x0 = V::at_most(x0, b.last_x), in_x1 = V::at_most(V::add(x0, one), b.last_x);
  const M in_y0 = V::at_most(y0, b.last_y), in_y1 = V::at_most(V::add(y0, one), b.last_y);
  PlanarTaps t;
  t.all_inside = V::all(V::both(V::both(in_x0, in_x1), V::both(in_y0, in_y1)));
  if (t.all_inside) {
    // 0 <= x0 <= width - 2 and 0 <= y0 <= height - 2: rows y0 and y0 + 1 from column x0
    t.upper = V::add(V::times_stride(y0, b.stride_y, b.small_stride),
                     kBytes == 1 ? x0 : V::template slli<1>(x0));
    t.lower = V::add(t.upper, b.stride_y);
    t.shift_bits = zero;
    t.inside = zero;
  } else {
    // Each row is read from column xa = clamp(x0, 0, width - 2) and shifted by x0 - xa taps;
    // a row outside the image is read from the nearest row inside (and masked).
    const I xa = V::min(V::max(x0, zero), b.last_x0);
    const I y1 = V::add(y0, one);
    const I column = kBytes == 1 ? xa : V::template slli<1>(xa);
    t.upper = V::add(V::times_stride(V::min(V::max(y0, zero), b.last_y), b.stride_y,
                                     b.small_stride), column);
    t.lower = V::add(V::times_stride(V::min(V::max(y1, zero), b.last_y), b.stride_y,
                                     b.small_stride), column);
    t.shift_bits = V::template slli<kBytes == 1 ? 3 : 4>(V::sub(x0, xa));
    // which bytes of a lane [q00, q01, q10, q11] are inside, per tap column and row
    t.inside = V::bit_and(
        V::bytes_where(in_x0, 0x00FF00FF, in_x1, static_cast<int32_t>(0xFF00FF00)),
        V::bytes_where(in_y0, 0x0000FFFF, in_y1, static_cast<int32_t>(0xFFFF0000)));
  }
  if (c.batched) {
    const I plane = V::load(c.plane + i);
    t.upper = V::add(t.upper, plane);
    t.lower = V::add(t.lower, plane);
  }
  t.shifted = !t.all_inside && V::any(t.shift_bits);
  return t;
}

// ---- nearest, every kind ----

// The source pixels' bytes (the image zero point where outside the image), by the kind's
// gathers or loads, in output order, then step 5 (V::store_raw).
template <Kind kKind, typename OutT>
ETKIT_TARGET __attribute__((noinline)) void nearest_block(const Coords& c, int64_t count,
                                                          const Setup& s, const Run& r,
                                                          int64_t first) {
  using I = typename V::I;
  using M = typename V::M;
  constexpr int kLanes = V::kLanes;
  const auto f = V::step5(s);
  const I last_x = V::set1(s.width - 1), last_y = V::set1(s.height - 1);
  const I stride_y = V::set1(static_cast<int32_t>(s.stride_y));
  const I stride_x = V::set1(static_cast<int32_t>(s.stride_x));
  const bool small = s.stride_y < (1 << 15) && s.stride_x < (1 << 15);
  const I zero_raw = V::set1_bytes(static_cast<int8_t>(s.image_zero_point));
  const int64_t channels = s.channels;
  // 32-bit gathers read up to 3 bytes past a pixel: near the image's end their addresses clamp
  const int64_t reach = (s.height - 1) * s.stride_y + (s.width - 1) * s.stride_x + 4;
  OutT* const out = static_cast<OutT*>(r.out);
  for (int64_t i = 0; i < count; i += kLanes) {
    const int64_t n = std::min<int64_t>(kLanes, count - i);
    const I nx = V::load(c.x + i), ny = V::load(c.y + i);
    const M valid =
        V::both(V::lanes(n), V::both(V::at_most(nx, last_x), V::at_most(ny, last_y)));
    I offsets = V::zero_unless(
        valid, V::add(V::times_stride(ny, stride_y, small), V::times_stride(nx, stride_x, small)));
    if (c.batched) {
      offsets = V::add_where(valid, offsets, V::load(c.plane + i));
    }
    const auto gather32 = [&](const int8_t* plane, int64_t plane_offset) ETKIT_TARGET {
      if (plane_offset + c.plane_max + reach <= s.extent) {
        return V::gather32(zero_raw, valid, offsets, plane);
      }
      const I limit = V::set1(static_cast<int32_t>(s.extent - plane_offset - 4));
      const I address = V::min(offsets, limit);
      const I raw = V::gather32(zero_raw, valid, address, plane);
      return V::srlv(raw, V::template slli<3>(V::sub(offsets, address)));
    };
    if constexpr (kKind == Kind::kNearPlanar) {
      for (int64_t ch = 0; ch < channels; ++ch) {
        const I raw = gather32(r.plane + ch * s.stride_c, r.plane_offset + ch * s.stride_c);
        V::store_raw(V::template pack<1>(raw), f, out + first + i + ch * r.output_c, n);
      }
    } else if constexpr (kKind == Kind::kNear2) {
      V::store_raw(V::template pack<2>(gather32(r.plane, r.plane_offset)), f,
                   out + (first + i) * 2, 2 * n);
    } else if constexpr (kKind == Kind::kNear3) {
      V::store_raw(V::template pack<3>(gather32(r.plane, r.plane_offset)), f,
                   out + (first + i) * 3, 3 * n);
    } else if constexpr (kKind == Kind::kNear4) {
      V::store_raw(V::gather32(zero_raw, valid, offsets, r.plane), f, out + (first + i) * 4,
                   4 * n);
    } else if constexpr (kKind == Kind::kNear8 && V::kStagedRaw) {
      // 64-bit gathers, half the lanes each, staged: one step 5 for the block's bytes
      constexpr int kHalf = kLanes / 2;
      alignas(64) int8_t staged[8 * kLanes];
      V::store_bytes(staged, V::template gather64<0>(zero_raw, valid, offsets, r.plane));
      if (n > kHalf) {
        V::store_bytes(staged + 8 * kHalf,
                       V::template gather64<1>(zero_raw, valid, offsets, r.plane));
      }
      V::store_staged(staged, f, out + (first + i) * 8, 8 * n);
    } else if constexpr (kKind == Kind::kNear8) {
      // 64-bit gathers, half the lanes each
      constexpr int kHalf = kLanes / 2;
      V::store_raw(V::template gather64<0>(zero_raw, valid, offsets, r.plane), f,
                   out + (first + i) * 8, 8 * std::min<int64_t>(n, kHalf));
      if (n > kHalf) {
        V::store_raw(V::template gather64<1>(zero_raw, valid, offsets, r.plane), f,
                     out + (first + i + kHalf) * 8, 8 * (n - kHalf));
      }
    } else {
      alignas(64) int32_t at[kLanes];
      V::store(at, offsets);
      const int inside = V::bits(valid);
      if constexpr (V::kStagedRaw) {
        // The block's output is n pixels of `channels` bytes, one after another: staged 128
        // bytes at a time, one step 5 per 128 bytes.
        constexpr int64_t kStage = 128;
        alignas(64) int8_t staged[kStage];
        OutT* to = out + (first + i) * channels;
        int64_t filled = 0;
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t h = 0; h < channels; h += 16) {
            const __m128i raw =
                (inside >> j) & 1 ? load16(r.plane + at[j] + h) : V::low128(zero_raw);
            _mm_store_si128(reinterpret_cast<__m128i*>(staged + filled), raw);
            filled += 16;
            if (filled == kStage) {
              V::store_staged(staged, f, to, kStage);
              to += kStage;
              filled = 0;
            }
          }
        }
        if (filled > 0) {
          V::store_staged(staged, f, to, filled);
        }
      } else {
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t h = 0; h < channels; h += 16) {
            const __m128i raw =
                (inside >> j) & 1 ? load16(r.plane + at[j] + h) : V::low128(zero_raw);
            V::store_raw(V::from128(raw), f, out + (first + i + j) * channels + h, 16);
          }
        }
      }
    }
  }
}

// Pass 2 of a nearest block, by its kind.
template <typename OutT>
void nearest_pass(const Coords& c, int64_t count, const Setup& s, const Run& r, int64_t first) {
  switch (s.kind) {
    case Kind::kNearPlanar:
      return nearest_block<Kind::kNearPlanar, OutT>(c, count, s, r, first);
    case Kind::kNear2:
      return nearest_block<Kind::kNear2, OutT>(c, count, s, r, first);
    case Kind::kNear3:
      return nearest_block<Kind::kNear3, OutT>(c, count, s, r, first);
    case Kind::kNear4:
      return nearest_block<Kind::kNear4, OutT>(c, count, s, r, first);
    case Kind::kNear8:
      return nearest_block<Kind::kNear8, OutT>(c, count, s, r, first);
    default:  // kNear16 (select_kind returns no other nearest kind)
      return nearest_block<Kind::kNear16, OutT>(c, count, s, r, first);
  }
}
