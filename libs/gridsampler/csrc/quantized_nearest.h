// Pass 2 of nearest sampling, every kind, written once for AVX-512, AVX2 and NEON. Included as
// quantized_pass1.h is: once per instruction set, inside a namespace that names the traits `V`
// and with ETKIT_TARGET its target attribute; after the instruction set's part of the pass (x86:
// quantized_x86_pass2.h, NEON: quantized_neon.cpp), which gives, in that namespace:
// - nearest_step5(s): step 5's registers, once per block;
// - nearest_bounds(s): the image's bounds, strides and zero point in registers, once per block;
// - nearest_group(c, i, n, b, r): where the group's pixels (V::kNearestGroup of them from i) take
//   their bytes from (their offsets in the image) and which lie inside it;
// - nearest_pixels<kBytes, kStrided>(...): the group's pixels' bytes (kBytes each from one plane,
//   the image zero point outside) in output order, and step 5 of them (x86: gathers, then its
//   byte table or requantization; NEON: copies, then `tbl`; NEON also stores them `output_x`
//   apart: kStrided);
// - where V::kNearestPlanes is more than 1 (NEON: 4), nearest_planes(...): the same for planes
//   ch .. ch + planes - 1 of a planar image at once, each pixel's offset read once for them (x86
//   gathers one plane at a time);
// - nearest_sources(g, c, i, r): each pixel's first byte (16k channels);
// - store_raw16(raw, f, out, n): step 5 of sixteen raw values, the first n stored; and, where the
//   traits stage raw bytes (V::kStagedRaw), store_bytes16 and store_staged.
// No include guard, on purpose. Internal to the native library.

// The source pixels' bytes (the image zero point where outside the image), then step 5, group by
// group: per channel plane (planar: one byte a pixel; NEON's any layout: the same, stored
// output_x apart), per pixel (2, 3, 4 and 8 channels-last: a pixel's bytes), or per sixteen
// channels of a pixel (16k channels-last).
template <Kind kKind, typename OutT>
ETKIT_TARGET __attribute__((noinline)) void nearest_block(const Coords& c, int64_t count,
                                                          const Setup& s, const Run& r,
                                                          int64_t first) {
  const auto f = nearest_step5(s);  // in registers (and local: no output store can alias it)
  const auto b = nearest_bounds(s);
  const int64_t channels = s.channels;
  OutT* const out = static_cast<OutT*>(r.out);
  for (int64_t i = 0; i < count; i += V::kNearestGroup) {
    const int64_t n = std::min<int64_t>(V::kNearestGroup, count - i);
    const auto g = nearest_group(c, i, n, b, r);
    if constexpr (kKind == Kind::kNearPlanar || kKind == Kind::kNearStrided) {
      constexpr bool kStrided = kKind == Kind::kNearStrided;
      if constexpr (kStrided || V::kNearestPlanes == 1) {
        for (int64_t ch = 0; ch < channels; ++ch) {
          OutT* const to = out + (first + i) * (kStrided ? r.output_x : 1) + ch * r.output_c;
          nearest_pixels<1, kStrided>(g, b, c, i, n, s, r, ch * s.stride_c, f, to);
        }
      } else {
        for (int64_t ch = 0; ch < channels; ch += V::kNearestPlanes) {
          const int64_t planes = std::min<int64_t>(V::kNearestPlanes, channels - ch);
          nearest_planes(g, b, c, i, n, s, r, ch, planes, f, out + first + i + ch * r.output_c);
        }
      }
    } else if constexpr (kKind != Kind::kNear16) {
      constexpr int kBytes = kKind == Kind::kNear2   ? 2
                             : kKind == Kind::kNear3 ? 3
                             : kKind == Kind::kNear4 ? 4
                                                     : 8;
      static_assert(kKind != Kind::kNear8 || kBytes == 8, "nearest kinds: 1, 2, 3, 4, 8, 16k");
      nearest_pixels<kBytes, false>(g, b, c, i, n, s, r, 0, f, out + (first + i) * kBytes);
    } else {
      const auto source = nearest_sources(g, c, i, r);
      if constexpr (V::kStagedRaw) {
        // The block's output is n pixels of `channels` bytes, one after another: staged 128
        // bytes at a time, one step 5 per 128 bytes.
        constexpr int64_t kStage = 128;
        alignas(64) int8_t staged[kStage];
        OutT* to = out + (first + i) * channels;
        int64_t filled = 0;
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t h = 0; h < channels; h += 16) {
            store_bytes16(staged + filled, source.raw16(j, h, b));
            filled += 16;
            if (filled == kStage) {
              store_staged(staged, f, to, kStage);
              to += kStage;
              filled = 0;
            }
          }
        }
        if (filled > 0) {
          store_staged(staged, f, to, filled);
        }
      } else {
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t h = 0; h < channels; h += 16) {
            store_raw16(source.raw16(j, h, b), f, out + (first + i + j) * channels + h, 16);
          }
        }
      }
    }
  }
}

// Pass 2 of a nearest block, by its kind (any layout's, kNearStrided, where the instruction set
// has it: V::kNearestStrided).
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
    default:  // kNear16, or kNearStrided (select_kind returns no other nearest kind)
      if constexpr (V::kNearestStrided) {
        if (s.kind == Kind::kNearStrided) {
          return nearest_block<Kind::kNearStrided, OutT>(c, count, s, r, first);
        }
      }
      return nearest_block<Kind::kNear16, OutT>(c, count, s, r, first);
  }
}
