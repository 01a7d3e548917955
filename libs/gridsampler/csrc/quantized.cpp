#include "quantized.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

namespace etkit::gridsampler {
namespace {

constexpr int64_t kOne = int64_t(1) << kCoordFracBits;

// x / 2^k rounded half up (floor(x / 2^k + 1/2)); k in [1, 62].
int64_t shift_round(int64_t x, int64_t k) { return (x + (int64_t(1) << (k - 1))) >> k; }

// A float32 scale as m * 2^e, m an integer below 2^24.
void decompose_float32(double scale, int64_t* mantissa, int* exponent) {
  int e = 0;
  const float f = std::frexp(static_cast<float>(scale), &e);  // f in [0.5, 1)
  *mantissa = static_cast<int64_t>(std::ldexp(f, 24));
  *exponent = e - 24;
}

const char* plan_axis(const QuantParams& grid, GridType grid_type, int64_t size,
                      bool align_corners, AxisPlan* axis) {
  int64_t mantissa = 0;
  int exponent = 0;
  decompose_float32(grid.scale, &mantissa, &exponent);
  const int64_t factor = align_corners ? size - 1 : size;
  // p = d * scale * factor / 2 + (size - 1) / 2, so P = p * 2^32 =
  //     d * (mantissa * factor) * 2^(exponent + 31) + (size - 1) * 2^31.
  axis->multiplier = mantissa * factor;
  const int64_t left = exponent + 31;
  axis->shift = left >= 0 ? -left : std::min<int64_t>(-left, 62);
  axis->offset = (size - 1) << (kCoordFracBits - 1);
  axis->size = size;
  const double full_range = grid_type == GridType::kInt16 ? 32768.0 : 128.0;
  const double max_d = full_range + std::abs(static_cast<double>(grid.zero_point));
  const double max_p =
      max_d * grid.scale * static_cast<double>(factor) / 2.0 + static_cast<double>(size) / 2.0;
  if (!(max_p < kMaxCoordinate)) {
    return "grid scale too large for this image: pixel coordinates would exceed 2^24";
  }
  return nullptr;
}

// Step 1: a grid value to a fixed-point pixel coordinate (32 fractional bits).
int64_t unnormalize(int64_t grid_value, int64_t grid_zero_point, const AxisPlan& axis) {
  const int64_t product = (grid_value - grid_zero_point) * axis.multiplier;
  const int64_t scaled =
      axis.shift > 0 ? shift_round(product, axis.shift) : product * (int64_t(1) << -axis.shift);
  return scaled + axis.offset;
}

int64_t clip(int64_t coord, int64_t size) {
  return std::min(std::max<int64_t>(coord, 0), (size - 1) * kOne);
}

// Reflects coord over [low, low + span] as often as needed (PyTorch's reflect_coordinates).
int64_t reflect(int64_t coord, int64_t low, int64_t span) {
  int64_t folded = std::abs(coord - low) % (2 * span);
  if (folded > span) {
    folded = 2 * span - folded;
  }
  return folded + low;
}

// Step 2: the padding mode.
int64_t apply_padding(int64_t coord, int64_t size, Padding padding, bool align_corners) {
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

// Step 3, nearest: the pixel index, rounding halves to even.
int64_t round_half_even(int64_t coord) {
  const int64_t whole = coord >> kCoordFracBits;
  const int64_t fraction = coord & (kOne - 1);
  const bool up = fraction > kOne / 2 || (fraction == kOne / 2 && (whole & 1) != 0);
  return whole + (up ? 1 : 0);
}

// Step 3, bilinear: the weight of the upper tap, 0 .. 2^15.
int64_t weight_of(int64_t coord) {
  return shift_round(coord & (kOne - 1), kCoordFracBits - kWeightBits);
}

// x / 2^k rounded half to even, as PyTorch's quantize rounds; k in [1, 62].
int64_t shift_round_half_even(int64_t x, int64_t k) {
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

}  // namespace

const char* plan_quantized(const SampleParams& params, const QuantParams& image,
                           const QuantParams& grid, GridType grid_type, bool float_output,
                           const QuantParams& output, int64_t height, int64_t width,
                           QuantizedPlan* plan) {
  if (height < 1 || width < 1) {
    return "image height and width must be positive";
  }
  plan->params = params;
  if (const char* error = plan_axis(grid, grid_type, width, params.align_corners, &plan->x)) {
    return error;
  }
  if (const char* error = plan_axis(grid, grid_type, height, params.align_corners, &plan->y)) {
    return error;
  }
  plan->grid_zero_point = grid.zero_point;
  plan->image_zero_point = image.zero_point;
  plan->float_output = float_output;
  plan->float_output_scale =
      static_cast<float>(std::ldexp(static_cast<double>(static_cast<float>(image.scale)), -15));
  plan->output_zero_point = output.zero_point;
  plan->output_min = output.quant_min;
  plan->output_max = output.quant_max;
  plan->requant_multiplier = 0;
  plan->requant_shift = 1;
  if (!float_output) {
    const double ratio = static_cast<double>(static_cast<float>(image.scale)) /
                         static_cast<double>(static_cast<float>(output.scale));
    if (!(ratio <= kMaxRequantRatio)) {
      return "image scale / output scale exceeds 32";
    }
    int e = 0;
    const double f = std::frexp(ratio, &e);  // ratio = f * 2^e, f in [0.5, 1)
    int64_t multiplier = std::llround(std::ldexp(f, 31));
    if (multiplier == (int64_t(1) << 31)) {
      multiplier >>= 1;
      e += 1;
    }
    // ratio = multiplier * 2^(e - 31); the value carries 15 fractional bits.
    plan->requant_multiplier = multiplier;
    plan->requant_shift = std::min<int64_t>(31 - e + kWeightBits, 62);
    if (plan->requant_shift < 1) {
      return "image scale / output scale exceeds 32";
    }
  }
  return nullptr;
}

template <typename GridT, typename OutT>
void grid_sample_quantized(const View4<const int8_t>& image, const View4<const GridT>& grid,
                           const View4<OutT>& output, const QuantizedPlan& plan,
                           int64_t row_begin, int64_t row_end) {
  // Everything in locals: the int8 stores below may alias any memory, so the compiler would
  // otherwise reload each field of the plan and the views after every store.
  const QuantizedPlan p = plan;
  const Padding padding = p.params.padding;
  const bool align_corners = p.params.align_corners, nearest = p.params.mode == Mode::kNearest;
  const int64_t channels = image.sizes[1], height = image.sizes[2], width = image.sizes[3];
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int8_t* __restrict__ const image_data = image.data;
  const int64_t image_n = image.strides[0], image_c = image.strides[1];
  const int64_t image_y = image.strides[2], image_x = image.strides[3];
  const GridT* const grid_data = grid.data;
  const int64_t grid_n = grid.strides[0], grid_y = grid.strides[1];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  OutT* __restrict__ const output_data = output.data;
  const int64_t output_n = output.strides[0], output_c = output.strides[1];
  const int64_t output_y = output.strides[2], output_x = output.strides[3];
  const int64_t zero = p.image_zero_point, grid_zero = p.grid_zero_point;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / out_height, oy = row % out_height;
    const GridT* const grid_row = grid_data + n * grid_n + oy * grid_y;
    const int8_t* const image_plane = image_data + n * image_n;
    OutT* __restrict__ const output_row = output_data + n * output_n + oy * output_y;
    for (int64_t ox = 0; ox < out_width; ++ox) {
      const GridT* const grid_point = grid_row + ox * grid_x;
      OutT* __restrict__ const out = output_row + ox * output_x;
      const int64_t x = apply_padding(unnormalize(grid_point[0], grid_zero, p.x), width, padding,
                                      align_corners);
      const int64_t y = apply_padding(unnormalize(grid_point[grid_axis], grid_zero, p.y), height,
                                      padding, align_corners);
      if (nearest) {
        const int64_t sx = round_half_even(x), sy = round_half_even(y);
        const bool valid = sx >= 0 && sx < width && sy >= 0 && sy < height;
        const int8_t* const source = image_plane + (valid ? sy * image_y + sx * image_x : 0);
        for (int64_t c = 0; c < channels; ++c) {
          const int64_t v = valid ? source[c * image_c] - zero : 0;
          out[c * output_c] = to_output<OutT>(v << kWeightBits, p);
        }
        continue;
      }
      // Step 3, bilinear: the taps (x0, y0) .. (x0 + 1, y0 + 1) and the weights.
      const int64_t x0 = x >> kCoordFracBits, y0 = y >> kCoordFracBits;
      const int64_t wx = weight_of(x), wy = weight_of(y);
      const bool in_x0 = x0 >= 0 && x0 < width, in_x1 = x0 + 1 >= 0 && x0 + 1 < width;
      const bool in_y0 = y0 >= 0 && y0 < height, in_y1 = y0 + 1 >= 0 && y0 + 1 < height;
      const bool in00 = in_y0 && in_x0, in01 = in_y0 && in_x1;
      const bool in10 = in_y1 && in_x0, in11 = in_y1 && in_x1;
      const int8_t* const tap00 = image_plane + (in00 ? y0 * image_y + x0 * image_x : 0);
      const int8_t* const tap01 = image_plane + (in01 ? y0 * image_y + (x0 + 1) * image_x : 0);
      const int8_t* const tap10 = image_plane + (in10 ? (y0 + 1) * image_y + x0 * image_x : 0);
      const int8_t* const tap11 =
          image_plane + (in11 ? (y0 + 1) * image_y + (x0 + 1) * image_x : 0);
      // A tap outside the image reads 0: its weight is zeroed and it reads a valid address.
      const int32_t w00 = in00 ? 1 : 0, w01 = in01 ? 1 : 0, w10 = in10 ? 1 : 0, w11 = in11 ? 1 : 0;
      for (int64_t c = 0; c < channels; ++c) {
        // Step 4: accumulate.
        const int64_t offset = c * image_c;
        const int32_t v00 = (tap00[offset] - static_cast<int32_t>(zero)) * w00;
        const int32_t v01 = (tap01[offset] - static_cast<int32_t>(zero)) * w01;
        const int32_t v10 = (tap10[offset] - static_cast<int32_t>(zero)) * w10;
        const int32_t v11 = (tap11[offset] - static_cast<int32_t>(zero)) * w11;
        // |v| <= 255, so each x-pass result fits in 32 bits; the y-pass needs 64.
        const int32_t top = (v00 << kWeightBits) + (v01 - v00) * static_cast<int32_t>(wx);
        const int32_t bottom = (v10 << kWeightBits) + (v11 - v10) * static_cast<int32_t>(wx);
        const int64_t value = shift_round(
            (static_cast<int64_t>(top) << kWeightBits) + static_cast<int64_t>(bottom - top) * wy,
            kWeightBits);
        out[c * output_c] = to_output<OutT>(value, p);
      }
    }
  }
}

template <typename GridT, typename OutT>
void grid_sample_quantized_parallel(const View4<const int8_t>& image,
                                    const View4<const GridT>& grid, const View4<OutT>& output,
                                    const QuantizedPlan& plan, int num_threads) {
  const int64_t rows = grid.sizes[0] * grid.sizes[1];
  int64_t threads = num_threads > 0 ? num_threads : std::thread::hardware_concurrency();
  // Below ~64k output pixels a thread costs more than it saves.
  threads = std::max<int64_t>(1, std::min<int64_t>(
                                     threads, rows * grid.sizes[2] / 65536 + 1));
  threads = std::min(threads, rows);
  if (threads <= 1) {
    grid_sample_quantized(image, grid, output, plan, 0, rows);
    return;
  }
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = rows * t / threads, end = rows * (t + 1) / threads;
    workers.emplace_back([&, begin, end] {
      grid_sample_quantized(image, grid, output, plan, begin, end);
    });
  }
  for (auto& worker : workers) {
    worker.join();
  }
}

#define ETKIT_INSTANTIATE(GridT, OutT)                                                          \
  template void grid_sample_quantized<GridT, OutT>(                                           \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&,              \
      const QuantizedPlan&, int64_t, int64_t);                                                \
  template void grid_sample_quantized_parallel<GridT, OutT>(                                  \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&,              \
      const QuantizedPlan&, int);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE

}  // namespace etkit::gridsampler
