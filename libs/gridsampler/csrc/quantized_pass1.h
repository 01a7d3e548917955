// Pass 1 of the vectorized kernels (steps 1 to 3 of each axis: Q for bilinear, the pixel index for
// nearest), written once for every instruction set over its traits. quantized_x86_any.cpp
// includes this file once per x86 target and quantized_neon.cpp once, each inside a namespace
// that names the traits `V` (Avx512, Avx2, Neon: lanes, loads and stores, the lanes written past
// the block, whether there are gathers, and each coordinate form's registers and tap) and with
// ETKIT_TARGET the target attribute (x86: a function's target cannot vary with a template
// argument, so the text is compiled once per target instead; NEON: empty). The including file
// gives Setup and Coords (x, y: kRun int32 values each). No include guard, on purpose. Internal to
// the native library.

// The grid values of each axis (int32 lanes) of the block's pixels i onwards: (x, y) pairs in
// one load where the instruction set has it (V::kPairLoads) and the load may read the lanes left
// (AVX-512's loads are masked: any count; NEON's read whole lanes), else staged one by one (0
// past `count`).
template <typename GridT>
ETKIT_TARGET inline void load_grid(const GridT* grid, int64_t grid_x, int64_t grid_axis, bool pairs,
                                   int64_t i, int64_t count, typename V::I* gx, typename V::I* gy) {
  if constexpr (V::kPairLoads) {
    if (pairs && (V::kPairLoadsMasked || count - i >= V::kLanes)) {
      V::load_pairs_xy(grid, grid_x, i, count, gx, gy);
      return;
    }
  }
  alignas(64) int32_t tx[V::kLanes] = {}, ty[V::kLanes] = {};
  for (int64_t k = 0; k < std::min<int64_t>(V::kLanes, count - i); ++k) {
    const GridT* const point = grid + (i + k) * grid_x;
    tx[k] = point[0];
    ty[k] = point[grid_axis];
  }
  *gx = V::load(tx);
  *gy = V::load(ty);
}

// Pass 1 for `count` pixels of the block from `grid` on, into `out`, and for the lanes after them
// up to the next multiple of V::kPadTo (NEON's second pass reads whole groups of sixteen lanes:
// there, the result of grid value 0, or 0 from a table; x86's reads `count` lanes, kPadTo 1).
template <typename GridT, Coordinates kForm, bool kNearest>
ETKIT_TARGET __attribute__((noinline)) void coordinates_block(const GridT* grid, int64_t grid_x,
                                                              int64_t grid_axis, int64_t count,
                                                              const Setup& s,
                                                              const QuantizedPlan& p, Coords* out) {
  using I = typename V::I;
  constexpr int kLanes = V::kLanes;
  const int64_t end = (count + V::kPadTo - 1) / V::kPadTo * V::kPadTo;
  if constexpr (kForm == Coordinates::kTable && !V::kGathers) {
    // No gathers: each pixel's two entries read on their own (staged grid values would be
    // stored and read back one by one all the same).
    int64_t k = 0;
    for (; k < count; ++k) {
      const GridT* const point = grid + k * grid_x;
      out->x[k] = s.table_x[point[0] + 128];
      out->y[k] = s.table_y[point[grid_axis] + 128];
    }
    for (; k < end; ++k) {
      out->x[k] = 0;
      out->y[k] = 0;
    }
  } else {
    [[maybe_unused]] const auto rx = V::template registers<kForm>(s, 0);
    [[maybe_unused]] const auto ry = V::template registers<kForm>(s, 1);
    for (int64_t i = 0; i < end; i += kLanes) {
      I cx, cy;
      if constexpr (kForm == Coordinates::kSplit) {  // int16 (x, y) pairs, as they are
        const I xy = V::load_pairs(grid, i, count);
        cx = V::template tap<kForm, kNearest>(xy, rx);
        cy = V::template tap<kForm, kNearest>(xy, ry);
      } else {
        I gx, gy;
        load_grid(grid, grid_x, grid_axis, s.pairs, i, count, &gx, &gy);
        if constexpr (kForm == Coordinates::kScalar) {
          alignas(64) int32_t vx[kLanes], vy[kLanes];
          V::store(vx, gx);
          V::store(vy, gy);
          for (int k = 0; k < kLanes; ++k) {
            const int64_t px = steps::pixel_coordinate(vx[k], p, p.x);
            const int64_t py = steps::pixel_coordinate(vy[k], p, p.y);
            vx[k] = kNearest ? nearest_index(px, p.x.size) : scalar_tap(px, p.x.size);
            vy[k] = kNearest ? nearest_index(py, p.y.size) : scalar_tap(py, p.y.size);
          }
          cx = V::load(vx);
          cy = V::load(vy);
        } else {
          // Where V::kStoreEachAxis (NEON's nearest and exact forms), each axis is stored as it is
          // computed: an axis' result held over the other's computation spills registers.
          if constexpr (V::template kStoreEachAxis<kForm>) {
            V::template tap_store<kForm, kNearest>(gx, rx, out->x + i);
            V::template tap_store<kForm, kNearest>(gy, ry, out->y + i);
            continue;
          }
          cx = V::template tap<kForm, kNearest>(gx, rx);
          cy = V::template tap<kForm, kNearest>(gy, ry);
        }
      }
      V::store(out->x + i, cx);
      V::store(out->y + i, cy);
    }
  }
}

// Pass 1 in the set-up's form (the instruction set's own: V::with_form). `p` is read by the
// scalar steps' form alone (AVX2's fallback).
template <typename GridT>
void coordinates(const GridT* grid, int64_t grid_x, int64_t grid_axis, int64_t count,
                 const Setup& s, const QuantizedPlan& p, Coords* out) {
  V::template with_form<GridT>(s.coordinates, s.nearest, [&](auto form, auto nearest) {
    coordinates_block<GridT, decltype(form)::value, decltype(nearest)::value>(
        grid, grid_x, grid_axis, count, s, p, out);
  });
}
