// The grid-sampler kernels, written to read like the contract in docs/contract.md:
// one function per step (unnormalize, apply padding, gather taps, accumulate).
#pragma once

#include <cstdint>

namespace etkit::gridsampler {

enum class Mode : uint8_t { kBilinear = 0, kNearest = 1 };
enum class Padding : uint8_t { kZeros = 0, kBorder = 1, kReflection = 2 };

struct SampleParams {
  Mode mode;
  Padding padding;
  bool align_corners;
};

// A 4-D strided view (sizes and strides in elements). Strides make one kernel serve contiguous
// (NCHW) and channels-last (NHWC) images alike.
template <typename T>
struct View4 {
  T* data;
  int64_t sizes[4];
  int64_t strides[4];
  T& at(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return data[a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3]];
  }
};

// Float32 grid sampling as torch.nn.functional.grid_sample computes it on the CPU: PyTorch's
// float32 operations in PyTorch's order (grid_sample.cpp), so NaN, infinite and huge grid values
// and NaN or infinite pixels give what PyTorch gives (bit for bit against its AVX2/AVX-512 kernel).
// image: N x C x H x W, grid: N x Ho x Wo x 2 (x, y), output: N x C x Ho x Wo; sizes at least 1.
void grid_sample_f32(const View4<const float>& image, const View4<const float>& grid,
                     const View4<float>& output, const SampleParams& params);

}  // namespace etkit::gridsampler
