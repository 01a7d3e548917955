// The parts of quantized_x86_any.cpp's second passes whose control flow is the same on both x86
// targets, written once over their traits (as quantized_pass1.h, and included the same way:
// once per target, inside a namespace that names the traits `V` (Avx512, Avx2) and with
// ETKIT_TARGET its target attribute). What the traits give: lanes and their masks (AVX-512
// mask registers, AVX2 lanes of all ones), loads, gathers and byte packing, step 5's registers
// and the stores of raw image values (AVX-512: a vpermt2b table; AVX2: the arithmetic of
// requantize8). The nearest pass's walk (quantized_nearest.h, shared with NEON) calls the part
// below. What stays per target in quantized_x86_any.cpp is where the instructions differ:
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

// ---- nearest: x86's part of the shared pass (quantized_nearest.h) ----

// The image's bounds and strides in registers; 32-bit gathers read up to 3 bytes past a pixel:
// near the image's end (`reach`) their addresses clamp.
struct NearestBounds {
  typename V::I last_x, last_y, stride_y, stride_x;
  bool small;
  typename V::I zero_raw;  // the image zero point in every byte
  int64_t reach;
};

ETKIT_TARGET __attribute__((always_inline)) inline auto nearest_step5(const Setup& s) {
  return V::step5(s);
}

ETKIT_TARGET __attribute__((always_inline)) inline NearestBounds nearest_bounds(const Setup& s) {
  return {V::set1(s.width - 1),
          V::set1(s.height - 1),
          V::set1(static_cast<int32_t>(s.stride_y)),
          V::set1(static_cast<int32_t>(s.stride_x)),
          s.stride_y < (1 << 15) && s.stride_x < (1 << 15),
          V::set1_bytes(static_cast<int8_t>(s.image_zero_point)),
          (s.height - 1) * s.stride_y + (s.width - 1) * s.stride_x + 4};
}

// A group of V::kLanes pixels: each one's offset from the run's plane (0 outside the image), and
// which lie inside.
struct NearestGroup {
  typename V::I offsets;
  typename V::M valid;
};

ETKIT_TARGET __attribute__((always_inline)) inline NearestGroup nearest_group(
    const Coords& c, int64_t i, int64_t n, const NearestBounds& b, const Run&) {
  using I = typename V::I;
  const I nx = V::load(c.x + i), ny = V::load(c.y + i);
  const typename V::M valid =
      V::both(V::lanes(n), V::both(V::at_most(nx, b.last_x), V::at_most(ny, b.last_y)));
  I offsets = V::zero_unless(valid, V::add(V::times_stride(ny, b.stride_y, b.small),
                                           V::times_stride(nx, b.stride_x, b.small)));
  if (c.batched) {
    offsets = V::add_where(valid, offsets, V::load(c.plane + i));
  }
  return {offsets, valid};
}

// The 32-bit words at the group's offsets from `plane` (at `plane_offset` bytes into the image):
// the image zero point outside; near the image's end, read from the last word inside and shifted.
ETKIT_TARGET __attribute__((always_inline)) inline typename V::I nearest_gather32(
    const NearestGroup& g, const NearestBounds& b, const Coords& c, const Setup& s,
    const int8_t* plane, int64_t plane_offset) {
  using I = typename V::I;
  if (plane_offset + c.plane_max + b.reach <= s.extent) {
    return V::gather32(b.zero_raw, g.valid, g.offsets, plane);
  }
  const I limit = V::set1(static_cast<int32_t>(s.extent - plane_offset - 4));
  const I address = V::min(g.offsets, limit);
  const I raw = V::gather32(b.zero_raw, g.valid, address, plane);
  return V::srlv(raw, V::template slli<3>(V::sub(g.offsets, address)));
}

// The group's n pixels' bytes, kBytes each from the plane `channel` bytes into the run's, by
// gathers in output order, then step 5 (V::store_raw) into `out`.
template <int kBytes, bool kStrided, typename F, typename OutT>
ETKIT_TARGET __attribute__((always_inline)) inline void nearest_pixels(
    const NearestGroup& g, const NearestBounds& b, const Coords& c, int64_t, int64_t n,
    const Setup& s, const Run& r, int64_t channel, const F& f, OutT* out) {
  static_assert(!kStrided, "x86 runs other layouts by the scalar steps");
  if constexpr (kBytes <= 3) {
    const auto raw = nearest_gather32(g, b, c, s, r.plane + channel, r.plane_offset + channel);
    V::store_raw(V::template pack<kBytes>(raw), f, out, kBytes * n);
  } else if constexpr (kBytes == 4) {
    V::store_raw(V::gather32(b.zero_raw, g.valid, g.offsets, r.plane), f, out, 4 * n);
  } else if constexpr (V::kStagedRaw) {
    // 64-bit gathers, half the lanes each, staged: one step 5 for the block's bytes
    constexpr int kHalf = V::kLanes / 2;
    alignas(64) int8_t staged[8 * V::kLanes];
    V::store_bytes(staged, V::template gather64<0>(b.zero_raw, g.valid, g.offsets, r.plane));
    if (n > kHalf) {
      V::store_bytes(staged + 8 * kHalf,
                     V::template gather64<1>(b.zero_raw, g.valid, g.offsets, r.plane));
    }
    V::store_staged(staged, f, out, 8 * n);
  } else {
    // 64-bit gathers, half the lanes each
    constexpr int kHalf = V::kLanes / 2;
    V::store_raw(V::template gather64<0>(b.zero_raw, g.valid, g.offsets, r.plane), f, out,
                 8 * std::min<int64_t>(n, kHalf));
    if (n > kHalf) {
      V::store_raw(V::template gather64<1>(b.zero_raw, g.valid, g.offsets, r.plane), f,
                   out + kHalf * 8, 8 * (n - kHalf));
    }
  }
}

// 16k channels: the group's offsets and which pixels are inside, one by one.
struct NearestSources {
  alignas(64) int32_t at[V::kLanes];
  int inside;
  const int8_t* plane;
  // Sixteen bytes of pixel j from channel h: the image zero point outside.
  ETKIT_TARGET __m128i raw16(int64_t j, int64_t h, const NearestBounds& b) const {
    return (inside >> j) & 1 ? load16(plane + at[j] + h) : V::low128(b.zero_raw);
  }
};

ETKIT_TARGET __attribute__((always_inline)) inline NearestSources nearest_sources(
    const NearestGroup& g, const Coords&, int64_t, const Run& r) {
  NearestSources source;
  V::store(source.at, g.offsets);
  source.inside = V::bits(g.valid);
  source.plane = r.plane;
  return source;
}

template <typename F, typename OutT>
ETKIT_TARGET __attribute__((always_inline)) inline void store_raw16(__m128i raw, const F& f,
                                                                    OutT* out, int64_t n) {
  V::store_raw(V::from128(raw), f, out, n);
}

ETKIT_TARGET __attribute__((always_inline)) inline void store_bytes16(int8_t* staged,
                                                                      __m128i raw) {
  _mm_store_si128(reinterpret_cast<__m128i*>(staged), raw);
}

template <typename F, typename OutT>
ETKIT_TARGET __attribute__((always_inline)) inline void store_staged(const int8_t* staged,
                                                                     const F& f, OutT* out,
                                                                     int64_t bytes) {
  V::store_staged(staged, f, out, bytes);
}
