#include "grid_sample.h"

#include <cmath>
#include <limits>

// The float32 kernel performs PyTorch's float32 operations, in PyTorch's order, so that it gives
// PyTorch's outputs, NaN, infinities and all: a product is fused into the following addition
// exactly where PyTorch's x86 build fuses it (std::fma below), and nowhere else, so the
// compiler must not contract the others.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace etkit::gridsampler {
namespace {

// What PyTorch's CPU kernel for float32 computes (aten/src/ATen/native/cpu/GridSamplerKernel.cpp,
// ComputeLocation and ApplyGridSample, vectorized with AVX2 or AVX-512), one element at a time.
// Everything is float32. NaN and infinite coordinates follow from those operations:
//   - a float that is not a number in int32's range (NaN, infinities, |x| >= 2^31) becomes the
//     index INT32_MIN (cvttps2dq), so it names no pixel;
//   - clipping maps NaN to 0 (max(NaN, 0) is 0), so border and reflection padding sample the
//     first pixel of the axis for a NaN or infinite coordinate;
//   - bilinear weights of a NaN or infinite coordinate are NaN, and a tap outside the image
//     reads 0 and still contributes 0 * weight: zeros padding gives NaN there;
//   - a tap inside the image with weight 0 contributes value * 0, NaN for an infinite value.
struct Axis {
  int64_t size;
  Padding padding;
  bool align_corners;
  float scaling_factor;  // (size - 1) / 2 with align_corners, size / 2 without
  float max_val;         // size - 1: clipping bound
  float twice_span;      // reflection period: 2 (size - 1) with align_corners, 2 size without

  Axis(int64_t size_, Padding padding_, bool align_corners_)
      : size(size_),
        padding(padding_),
        align_corners(align_corners_),
        scaling_factor(static_cast<float>(align_corners_ ? size_ - 1 : size_) / 2),
        max_val(static_cast<float>(size_ - 1)),
        twice_span(static_cast<float>(align_corners_ ? size_ - 1 : size_) * 2) {}

  // Step 1: a normalized coordinate in [-1, 1] to a pixel coordinate.
  float unnormalize(float coord) const {
    if (align_corners) {
      return (coord + 1.0f) * scaling_factor;
    }
    return std::fma(coord + 1.0f, scaling_factor, -0.5f);
  }

  float clip(float coord) const {
    coord = coord > 0.0f ? coord : 0.0f;  // NaN to 0
    return coord < max_val ? coord : max_val;
  }

  // The reflection about [low, low + twice_span / 2], as PyTorch folds it: |coord - low| less a
  // whole number of periods, then the nearer of that and its mirror image.
  float reflect(float coord) const {
    if (align_corners && size <= 1) {
      return 0.0f;
    }
    const float low = align_corners ? 0.0f : -0.5f;
    const float distance = align_corners ? std::fabs(coord) : std::fabs(coord - low);
    const float periods = std::trunc(distance / twice_span);
    const float extra = std::fma(-periods, twice_span, distance);
    const float mirrored = twice_span - extra;
    if (std::isnan(extra) || std::isnan(mirrored)) {
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float folded = extra < mirrored ? extra : mirrored;
    return align_corners ? folded : folded + low;
  }

  // Step 2: the padding mode.
  float apply_padding(float coord) const {
    switch (padding) {
      case Padding::kZeros:
        return coord;
      case Padding::kBorder:
        return clip(coord);
      case Padding::kReflection:
        return clip(reflect(coord));
    }
    return coord;
  }

  float source_coordinate(float normalized) const {
    return apply_padding(unnormalize(normalized));
  }
};

// A float index as cvttps2dq converts it: toward zero; INT32_MIN when not representable.
int64_t to_index(float coord) {
  if (!(coord >= -2147483648.0f && coord < 2147483648.0f)) {
    return std::numeric_limits<int32_t>::min();
  }
  return static_cast<int64_t>(static_cast<int32_t>(coord));
}

bool inside(int64_t x, int64_t y, int64_t width, int64_t height) {
  return x >= 0 && x < width && y >= 0 && y < height;
}

}  // namespace

void grid_sample_f32(const View4<const float>& image, const View4<const float>& grid,
                     const View4<float>& output, const SampleParams& params) {
  const int64_t batch = image.sizes[0], channels = image.sizes[1];
  const int64_t height = image.sizes[2], width = image.sizes[3];
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const Axis axis_x(width, params.padding, params.align_corners);
  const Axis axis_y(height, params.padding, params.align_corners);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t oy = 0; oy < out_height; ++oy) {
      for (int64_t ox = 0; ox < out_width; ++ox) {
        const float x = axis_x.source_coordinate(grid.at(n, oy, ox, 0));
        const float y = axis_y.source_coordinate(grid.at(n, oy, ox, 1));
        if (params.mode == Mode::kNearest) {
          // Step 3, nearest: halves to even (the default rounding mode).
          const int64_t sx = to_index(std::nearbyint(x));
          const int64_t sy = to_index(std::nearbyint(y));
          const bool valid = inside(sx, sy, width, height);
          for (int64_t c = 0; c < channels; ++c) {
            output.at(n, c, oy, ox) = valid ? image.at(n, c, sy, sx) : 0.0f;
          }
          continue;
        }
        // Step 3, bilinear: the four taps around (x, y) and their weights.
        const float x_west = std::floor(x), y_north = std::floor(y);
        const float to_west = x - x_west, to_east = 1.0f - to_west;
        const float to_north = y - y_north, to_south = 1.0f - to_north;
        const float weight[4] = {to_south * to_east, to_south * to_west, to_north * to_east,
                                 to_north * to_west};
        const int64_t x0 = to_index(x_west), y0 = to_index(y_north);
        const int64_t tap_x[4] = {x0, x0 + 1, x0, x0 + 1};
        const int64_t tap_y[4] = {y0, y0, y0 + 1, y0 + 1};
        bool in[4];
        for (int k = 0; k < 4; ++k) {
          in[k] = inside(tap_x[k], tap_y[k], width, height);
        }
        // Step 4: a tap outside the image reads 0; the sum in PyTorch's order, each product
        // after the first fused into its addition.
        for (int64_t c = 0; c < channels; ++c) {
          float value[4];
          for (int k = 0; k < 4; ++k) {
            value[k] = in[k] ? image.at(n, c, tap_y[k], tap_x[k]) : 0.0f;
          }
          float sum = value[0] * weight[0];
          sum = std::fma(value[1], weight[1], sum);
          sum = std::fma(value[2], weight[2], sum);
          output.at(n, c, oy, ox) = std::fma(value[3], weight[3], sum);
        }
      }
    }
  }
}

}  // namespace etkit::gridsampler
