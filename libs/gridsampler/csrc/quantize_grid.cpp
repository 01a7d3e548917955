// A float32 grid quantized on entry to the delegate (a blob whose grid arrival code is 1): the
// quantize_per_tensor the exporter left before the sampler, fused, so that it runs on the
// sampler's threads, chunk by chunk, into a buffer that stays in cache, not as a single-threaded
// portable kernel over the whole grid. The values are ExecuTorch's, bit for bit
// (kernels/quantized/cpu/op_quantize.cpp, quantize_val): in float32,
// nearbyint(value * (1 / scale)) + zero_point, clamped to [quant_min, quant_max].
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "quantized.h"
#include "quantized_x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ETKIT_QUANTIZE_X86 1
#endif

namespace etkit::gridsampler {
namespace {

struct EntryQuant {
  float inverse_scale;  // 1.0f / float(scale), as ExecuTorch computes it
  float zero_point, low, high;
};

EntryQuant entry_quant(const QuantParams& q) {
  return {1.0f / static_cast<float>(q.scale), static_cast<float>(q.zero_point),
          static_cast<float>(q.quant_min), static_cast<float>(q.quant_max)};
}

// One value. ExecuTorch converts zero_point + nearbyint(...) (a float holding an integer) to
// int64 and clamps; clamping the float first gives the same integer for every finite value (the
// bounds are integers a float holds exactly) and defines what the conversion leaves undefined:
// NaN gives quant_min (the comparison is false), infinities their side's bound.
template <typename GridT>
inline GridT quantize_one(float value, const EntryQuant& q) {
  const float rounded = std::nearbyint(q.inverse_scale * value) + q.zero_point;
  if (!(rounded >= q.low)) {
    return static_cast<GridT>(q.low);
  }
  return static_cast<GridT>(std::min(rounded, q.high));
}

#ifdef ETKIT_QUANTIZE_X86
// Eight values: _mm256_round_ps to nearest even is nearbyint in the default rounding mode, the
// product and the sum are the same float32 operations, and max(x, low) with x first returns low
// for NaN (the second operand), as quantize_one does. The conversion is exact: an integer within
// the dtype's range.
__attribute__((target("avx2"))) inline __m256i quantize8(const float* at, __m256 inverse,
                                                          __m256 zero, __m256 low, __m256 high) {
  __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(at), inverse),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zero), low), high);
  return _mm256_cvtps_epi32(r);
}

// Sixteen values at a time; returns how many it did.
template <typename GridT>
__attribute__((target("avx2"))) int64_t quantize_avx2(const float* values, int64_t count,
                                                       const EntryQuant& q, GridT* out) {
  const __m256 inverse = _mm256_set1_ps(q.inverse_scale), zero = _mm256_set1_ps(q.zero_point);
  const __m256 low = _mm256_set1_ps(q.low), high = _mm256_set1_ps(q.high);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    // packs interleaves 128-bit lanes: a, b -> a0 b0 a1 b1; the permute puts them in order
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(quantize8(values + i, inverse, zero, low, high),
                           quantize8(values + i + 8, inverse, zero, low, high)),
        0xD8);
    if constexpr (sizeof(GridT) == 2) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
    } else {
      const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(packed),
                                            _mm256_extracti128_si256(packed, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bytes);
    }
  }
  return i;
}
#endif

// `count` contiguous values.
template <typename GridT>
void quantize_span(const float* values, int64_t count, const EntryQuant& q, GridT* out,
                   Isa isa) {
  int64_t i = 0;
#ifdef ETKIT_QUANTIZE_X86
  if (isa != Isa::kScalar && avx2_supported()) {
    i = quantize_avx2(values, count, q, out);
  }
#else
  (void)isa;
#endif
  for (; i < count; ++i) {
    out[i] = quantize_one<GridT>(values[i], q);
  }
}

// Grid rows [y0, y1) of batch n, quantized into `out` (contiguous, Wo x 2 per row).
template <typename GridT>
void quantize_rows(const View4<const float>& grid, int64_t n, int64_t y0, int64_t y1,
                   const EntryQuant& q, GridT* out, Isa isa) {
  const int64_t width = grid.sizes[2];
  for (int64_t y = y0; y < y1; ++y, out += width * 2) {
    const float* row = grid.data + n * grid.strides[0] + y * grid.strides[1];
    if (grid.strides[3] == 1 && grid.strides[2] == 2) {
      quantize_span(row, width * 2, q, out, isa);
      continue;
    }
    for (int64_t x = 0; x < width; ++x) {
      for (int64_t c = 0; c < 2; ++c) {
        out[x * 2 + c] = quantize_one<GridT>(row[x * grid.strides[2] + c * grid.strides[3]], q);
      }
    }
  }
}

}  // namespace

template <typename GridT>
void quantize_grid_on_entry(const float* values, int64_t count, const QuantParams& grid_q,
                            GridT* out, Isa isa) {
  quantize_span(values, count, entry_quant(grid_q), out, isa);
}

template <typename GridT, typename OutT>
void grid_sample_quantized_float_grid_parallel(const View4<const int8_t>& image,
                                               const View4<const float>& grid,
                                               const QuantParams& grid_q,
                                               const View4<OutT>& output,
                                               const QuantizedPlan& plan, int num_threads,
                                               Isa isa) {
  const EntryQuant q = entry_quant(grid_q);
  const int64_t height = grid.sizes[1], width = grid.sizes[2];
  // Each thread quantizes one chunk of rows into a buffer of its own and samples with it: the
  // chunks of grid_sample_quantized_parallel, never across two images of the batch.
  const auto sample = [&](int64_t begin, int64_t end, std::vector<GridT>& buffer) {
    while (begin < end) {
      const int64_t n = begin / height, y0 = begin % height;
      const int64_t y1 = std::min(height, y0 + (end - begin));
      buffer.resize(static_cast<size_t>((y1 - y0) * width * 2));
      quantize_rows(grid, n, y0, y1, q, buffer.data(), isa);
      const View4<const GridT> chunk{
          buffer.data(), {1, y1 - y0, width, 2}, {(y1 - y0) * width * 2, width * 2, 2, 1}};
      View4<const int8_t> image_n = image;
      image_n.data += n * image.strides[0];
      image_n.sizes[0] = 1;
      View4<OutT> output_n = output;
      output_n.data += n * output.strides[0] + y0 * output.strides[2];
      output_n.sizes[0] = 1;
      output_n.sizes[2] = y1 - y0;
      grid_sample_quantized(image_n, chunk, output_n, plan, 0, y1 - y0, isa);
      begin += y1 - y0;
    }
  };
  parallel_rows(grid.sizes[0] * height, width, num_threads, [&](int64_t begin, int64_t end) {
    thread_local std::vector<GridT> buffer;
    sample(begin, end, buffer);
  });
}

#define ETKIT_INSTANTIATE(GridT, OutT)                                                       \
  template void grid_sample_quantized_float_grid_parallel<GridT, OutT>(                    \
      const View4<const int8_t>&, const View4<const float>&, const QuantParams&,           \
      const View4<OutT>&, const QuantizedPlan&, int, Isa);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE
template void quantize_grid_on_entry<int16_t>(const float*, int64_t, const QuantParams&,
                                              int16_t*, Isa);
template void quantize_grid_on_entry<int8_t>(const float*, int64_t, const QuantParams&, int8_t*,
                                             Isa);

}  // namespace etkit::gridsampler
