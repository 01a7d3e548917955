// Reader of the grid-sampler delegate blob. The format is written down once, in
// docs/delegate_format.md; src/etkit_gridsampler/delegate_format.py writes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "grid_sample.h"

namespace etkit::gridsampler {

constexpr uint32_t kBlobMagic = 0x53475445;  // "ETGS" read little-endian
constexpr uint16_t kBlobVersion = 1;
constexpr size_t kBlobSize = 120;

enum class DType : uint8_t { kFloat32 = 0, kInt8 = 1, kInt16 = 2, kUInt8 = 3 };

struct QParamsRecord {
  bool present;  // false: the tensor is float32
  DType dtype;
  int32_t zero_point;
  int32_t quant_min;
  int32_t quant_max;
  double scale;
};

struct DelegateBlob {
  SampleParams params;
  QParamsRecord image, grid, output;
  int32_t image_shape[4];  // N, C, H, W
  int32_t grid_shape[4];   // N, Ho, Wo, 2
};

// Parses and validates `size` bytes at `data`. On failure returns false and points *error at a
// static message that says what is wrong.
bool parse_delegate_blob(const void* data, size_t size, DelegateBlob* out, const char** error);

}  // namespace etkit::gridsampler
