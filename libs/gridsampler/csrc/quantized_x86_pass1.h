// Pass 1 of quantized_x86_any.cpp (steps 1 to 3 of each axis: Q for bilinear, the pixel index for
// nearest), written once for both x86 targets over their traits. quantized_x86_any.cpp includes
// this file once per target, inside a namespace that names the traits `V` (Avx512, Avx2: lanes,
// loads and stores, and each coordinate form's registers and tap) and with ETKIT_X86_TARGET its
// target attribute: a function's target cannot vary with a template argument, so the text is
// compiled twice instead. No include guard, on purpose. Internal to the native library.

// The grid values of each axis (int32 lanes) of the block's pixels i onwards: (x, y) pairs in
// one load where the target has it (V::kPairLoads), else staged one by one.
template <typename GridT>
ETKIT_X86_TARGET inline void load_grid(const GridT* grid, int64_t grid_x, int64_t grid_axis,
                                       bool pairs, int64_t i, int64_t count, typename V::I* gx,
                                       typename V::I* gy) {
  if constexpr (V::kPairLoads) {
    if (pairs) {
      V::load_pairs_xy(grid, i, count, gx, gy);
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

// Pass 1 for `count` pixels of the block from `grid` on, into `out`.
template <typename GridT, Coordinates kForm, bool kNearest>
ETKIT_X86_TARGET __attribute__((noinline)) void coordinates_block(const GridT* grid,
                                                                  int64_t grid_x,
                                                                  int64_t grid_axis,
                                                                  int64_t count, const Setup& s,
                                                                  const QuantizedPlan& p,
                                                                  Coords* out) {
  using I = typename V::I;
  constexpr int kLanes = V::kLanes;
  [[maybe_unused]] const auto rx = V::template registers<kForm>(s, 0);
  [[maybe_unused]] const auto ry = V::template registers<kForm>(s, 1);
  for (int64_t i = 0; i < count; i += kLanes) {
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
        cx = V::template tap<kForm, kNearest>(gx, rx);
        cy = V::template tap<kForm, kNearest>(gy, ry);
      }
    }
    V::store(out->x + i, cx);
    V::store(out->y + i, cy);
  }
}

// Pass 1 in the set-up's form (the target's own: V::with_form).
template <typename GridT>
void coordinates(const GridT* grid, int64_t grid_x, int64_t grid_axis, int64_t count,
                 const Setup& s, const QuantizedPlan& p, Coords* out) {
  V::template with_form<GridT>(s.coordinates, s.nearest, [&](auto form, auto nearest) {
    coordinates_block<GridT, decltype(form)::value, decltype(nearest)::value>(
        grid, grid_x, grid_axis, count, s, p, out);
  });
}
