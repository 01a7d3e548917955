#include "grid_sample.h"

#include <cmath>

namespace etkit::gridsampler {
namespace {

// Step 1: map a normalized coordinate in [-1, 1] to a pixel coordinate.
double unnormalize(double coord, int64_t size, bool align_corners) {
  if (align_corners) {
    return (coord + 1.0) / 2.0 * static_cast<double>(size - 1);
  }
  return ((coord + 1.0) * static_cast<double>(size) - 1.0) / 2.0;
}

double clip(double coord, int64_t size) {
  return std::fmin(static_cast<double>(size - 1), std::fmax(coord, 0.0));
}

// Reflects coord over [twice_low / 2, twice_high / 2], as PyTorch's reflect_coordinates.
double reflect(double coord, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) {
    return 0.0;
  }
  const double low = static_cast<double>(twice_low) / 2.0;
  const double span = static_cast<double>(twice_high - twice_low) / 2.0;
  coord = std::fabs(coord - low);
  const double extra = std::fmod(coord, span);
  const int64_t flips = static_cast<int64_t>(std::floor(coord / span));
  return (flips % 2 == 0) ? extra + low : span - extra + low;
}

// Step 2: apply the padding mode to a pixel coordinate.
double apply_padding(double coord, int64_t size, Padding padding, bool align_corners) {
  switch (padding) {
    case Padding::kZeros:
      return coord;
    case Padding::kBorder:
      return clip(coord, size);
    case Padding::kReflection:
      coord = align_corners ? reflect(coord, 0, 2 * (size - 1)) : reflect(coord, -1, 2 * size - 1);
      return clip(coord, size);
  }
  return coord;
}

double source_coordinate(double normalized, int64_t size, const SampleParams& params) {
  return apply_padding(unnormalize(normalized, size, params.align_corners), size, params.padding,
                       params.align_corners);
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
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t oy = 0; oy < out_height; ++oy) {
      for (int64_t ox = 0; ox < out_width; ++ox) {
        const double x = source_coordinate(grid.at(n, oy, ox, 0), width, params);
        const double y = source_coordinate(grid.at(n, oy, ox, 1), height, params);
        if (params.mode == Mode::kNearest) {
          const int64_t sx = static_cast<int64_t>(std::nearbyint(x));
          const int64_t sy = static_cast<int64_t>(std::nearbyint(y));
          const bool valid = inside(sx, sy, width, height);
          for (int64_t c = 0; c < channels; ++c) {
            output.at(n, c, oy, ox) = valid ? image.at(n, c, sy, sx) : 0.0f;
          }
          continue;
        }
        // Bilinear: the four taps around (x, y) and their weights.
        const int64_t x0 = static_cast<int64_t>(std::floor(x));
        const int64_t y0 = static_cast<int64_t>(std::floor(y));
        const double fx = x - static_cast<double>(x0), fy = y - static_cast<double>(y0);
        const int64_t tap_x[4] = {x0, x0 + 1, x0, x0 + 1};
        const int64_t tap_y[4] = {y0, y0, y0 + 1, y0 + 1};
        const double weight[4] = {(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy};
        for (int64_t c = 0; c < channels; ++c) {
          double sum = 0.0;
          for (int k = 0; k < 4; ++k) {
            if (inside(tap_x[k], tap_y[k], width, height)) {
              sum += weight[k] * static_cast<double>(image.at(n, c, tap_y[k], tap_x[k]));
            }
          }
          output.at(n, c, oy, ox) = static_cast<float>(sum);
        }
      }
    }
  }
}

}  // namespace etkit::gridsampler
