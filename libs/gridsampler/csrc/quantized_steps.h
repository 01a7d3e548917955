// The steps of the integer contract (docs/contract.md) for one output pixel, shared by the scalar
// kernel (quantized.cpp) and the vectorized one (quantized_x86.cpp), which falls back to
// sample_pixel wherever its fast path does not apply. Internal to the native library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "quantized.h"

namespace etkit::gridsampler::steps {

constexpr int64_t kOne = int64_t(1) << kCoordFracBits;

// x / 2^k rounded half up (floor(x / 2^k + 1/2)); k in [1, 62].
inline int64_t shift_round(int64_t x, int64_t k) { return (x + (int64_t(1) << (k - 1))) >> k; }

// Step 1: a grid value to a fixed-point pixel coordinate (32 fractional bits).
inline int64_t unnormalize(int64_t grid_value, int64_t grid_zero_point, const AxisPlan& axis) {
  const int64_t product = (grid_value - grid_zero_point) * axis.multiplier;
  const int64_t scaled =
      axis.shift > 0 ? shift_round(product, axis.shift) : product * (int64_t(1) << -axis.shift);
  return scaled + axis.offset;
}

inline int64_t clip(int64_t coord, int64_t size) {
  return std::min(std::max<int64_t>(coord, 0), (size - 1) * kOne);
}

// Reflects coord over [low, low + span] as often as needed (PyTorch's reflect_coordinates).
inline int64_t reflect(int64_t coord, int64_t low, int64_t span) {
  int64_t folded = std::abs(coord - low) % (2 * span);
  if (folded > span) {
    folded = 2 * span - folded;
  }
  return folded + low;
}

// Step 2: the padding mode.
inline int64_t apply_padding(int64_t coord, int64_t size, Padding padding, bool align_corners) {
  switch (padding) {
    case Padding::kZeros:
      return coord;
    case Padding::kBorder:
      return clip(coord, size);
    case Padding::kReflection:
      if (align_corners) {
        return size == 1 ? 0 : clip(reflect(coord, 0, (size - 1) * kOne), size);
      }
      return clip(reflect(coord, -kOne / 2, size * kOne), size);
  }
  return coord;
}

// Steps 1 and 2 for one axis.
inline int64_t pixel_coordinate(int64_t grid_value, const QuantizedPlan& plan,
                                const AxisPlan& axis) {
  return apply_padding(unnormalize(grid_value, plan.grid_zero_point, axis), axis.size,
                       plan.params.padding, plan.params.align_corners);
}

// Step 3, nearest: the pixel index, rounding halves to even.
inline int64_t round_half_even(int64_t coord) {
  const int64_t whole = coord >> kCoordFracBits;
  const int64_t fraction = coord & (kOne - 1);
  const bool up = fraction > kOne / 2 || (fraction == kOne / 2 && (whole & 1) != 0);
  return whole + (up ? 1 : 0);
}

// Step 3, bilinear: the weight of the upper tap, 0 .. 2^15.
inline int64_t weight_of(int64_t coord) {
  return shift_round(coord & (kOne - 1), kCoordFracBits - kWeightBits);
}

// x / 2^k rounded half to even, as PyTorch's quantize rounds; k in [1, 62].
inline int64_t shift_round_half_even(int64_t x, int64_t k) {
  const int64_t whole = x >> k;
  const int64_t rest = x & ((int64_t(1) << k) - 1);
  const int64_t halfway = int64_t(1) << (k - 1);
  return whole + ((rest > halfway || (rest == halfway && (whole & 1) != 0)) ? 1 : 0);
}

// Step 5: a value with 15 fractional bits (in image quantization steps) to the output.
inline int8_t requantize(int64_t value, const QuantizedPlan& plan) {
  const int64_t q = shift_round_half_even(value * plan.requant_multiplier, plan.requant_shift) +
                    plan.output_zero_point;
  return static_cast<int8_t>(std::min(std::max(q, plan.output_min), plan.output_max));
}

template <typename OutT>
inline OutT to_output(int64_t value, const QuantizedPlan& plan);

template <>
inline int8_t to_output<int8_t>(int64_t value, const QuantizedPlan& plan) {
  return requantize(value, plan);
}

template <>
inline float to_output<float>(int64_t value, const QuantizedPlan& plan) {
  return static_cast<float>(value) * plan.float_output_scale;
}

// One image plane (one batch element) as the per-pixel steps read it.
struct Plane {
  const int8_t* data;
  int64_t channels, height, width;
  int64_t stride_c, stride_y, stride_x;
};

// Steps 3 to 5 for one output pixel at pixel coordinates (x, y) (32 fractional bits, padding
// applied): writes its `channels` values at out[c * output_c].
template <typename OutT>
inline void sample_pixel(int64_t x, int64_t y, const Plane& image, OutT* __restrict__ out,
                         int64_t output_c, const QuantizedPlan& plan) {
  const int64_t width = image.width, height = image.height;
  const int32_t zero = static_cast<int32_t>(plan.image_zero_point);
  if (plan.params.mode == Mode::kNearest) {
    const int64_t sx = round_half_even(x), sy = round_half_even(y);
    const bool valid = sx >= 0 && sx < width && sy >= 0 && sy < height;
    const int8_t* const source =
        image.data + (valid ? sy * image.stride_y + sx * image.stride_x : 0);
    for (int64_t c = 0; c < image.channels; ++c) {
      const int64_t v = valid ? source[c * image.stride_c] - zero : 0;
      out[c * output_c] = to_output<OutT>(v << kWeightBits, plan);
    }
    return;
  }
  // Step 3, bilinear: the taps (x0, y0) .. (x0 + 1, y0 + 1) and the weights.
  const int64_t x0 = x >> kCoordFracBits, y0 = y >> kCoordFracBits;
  const int32_t wx = static_cast<int32_t>(weight_of(x)), wy = static_cast<int32_t>(weight_of(y));
  const bool in_x0 = x0 >= 0 && x0 < width, in_x1 = x0 + 1 >= 0 && x0 + 1 < width;
  const bool in_y0 = y0 >= 0 && y0 < height, in_y1 = y0 + 1 >= 0 && y0 + 1 < height;
  const bool in00 = in_y0 && in_x0, in01 = in_y0 && in_x1;
  const bool in10 = in_y1 && in_x0, in11 = in_y1 && in_x1;
  const int64_t sy = image.stride_y, sx = image.stride_x;
  const int8_t* const tap00 = image.data + (in00 ? y0 * sy + x0 * sx : 0);
  const int8_t* const tap01 = image.data + (in01 ? y0 * sy + (x0 + 1) * sx : 0);
  const int8_t* const tap10 = image.data + (in10 ? (y0 + 1) * sy + x0 * sx : 0);
  const int8_t* const tap11 = image.data + (in11 ? (y0 + 1) * sy + (x0 + 1) * sx : 0);
  // A tap outside the image reads 0: its weight is zeroed and it reads a valid address.
  const int32_t w00 = in00 ? 1 : 0, w01 = in01 ? 1 : 0, w10 = in10 ? 1 : 0, w11 = in11 ? 1 : 0;
  for (int64_t c = 0; c < image.channels; ++c) {
    // Step 4: accumulate.
    const int64_t offset = c * image.stride_c;
    const int32_t v00 = (tap00[offset] - zero) * w00;
    const int32_t v01 = (tap01[offset] - zero) * w01;
    const int32_t v10 = (tap10[offset] - zero) * w10;
    const int32_t v11 = (tap11[offset] - zero) * w11;
    // |v| <= 255, so each x-pass result fits in 32 bits; the y-pass needs 64.
    const int32_t top = (v00 << kWeightBits) + (v01 - v00) * wx;
    const int32_t bottom = (v10 << kWeightBits) + (v11 - v10) * wx;
    const int64_t value = shift_round(
        (static_cast<int64_t>(top) << kWeightBits) + static_cast<int64_t>(bottom - top) * wy,
        kWeightBits);
    out[c * output_c] = to_output<OutT>(value, plan);
  }
}

}  // namespace etkit::gridsampler::steps
