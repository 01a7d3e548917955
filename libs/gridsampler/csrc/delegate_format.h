// Reader of the grid-sampler delegate blob. docs/delegate_format.md is its one definition (layout,
// validity rules in order, messages); src/etkit_gridsampler/delegate_format.py writes it and reads
// it with the same rules and messages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "grid_sample.h"

namespace etkit::gridsampler {

constexpr uint32_t kBlobMagic = 0x53475445;  // "ETGS" read little-endian
constexpr uint16_t kBlobVersion = 3;       // the newest version read
constexpr uint16_t kFixedBlobVersion = 2;  // fixed shapes; the oldest version read
constexpr size_t kBlobSize = 124;          // version 2
constexpr size_t kDynamicBlobSize = 160;   // version 3

enum class DType : uint8_t { kFloat32 = 0, kInt8 = 1, kInt16 = 2 };

struct QParamsRecord {
  bool present;  // false: the tensor is float32 (dtype kFloat32)
  DType dtype;
  int32_t zero_point;
  int32_t quant_min;
  int32_t quant_max;
  double scale;  // a float32 value
};

struct DelegateBlob {
  SampleParams params;
  // The delegate's runtime arguments are `input_count` tensors, then the output; the image is
  // argument `image_index`, the grid argument `grid_index` (both 0 when one tensor is both).
  uint8_t input_count;
  uint8_t image_index;
  uint8_t grid_index;
  QParamsRecord image, grid, output;
  // The shapes, or in version 3 their upper bounds, and the lower bounds (version 2: the shapes).
  // A dimension is dynamic where its bounds differ.
  int32_t image_shape[4];  // N, C, H, W
  int32_t grid_shape[4];   // N, Ho, Wo, 2
  int32_t image_min_shape[4];
  int32_t grid_min_shape[4];
  bool dynamic;  // some dimension is (a version-3 blob)
  // Byte 15: the grid arrives as float32 and the delegate quantizes it with the grid record on
  // entry (ExecuTorch's quantize_per_tensor, fused; quantize_grid_on_entry).
  bool quantizes_grid;
};

// Parses and validates `size` bytes at `data` with the rules of docs/delegate_format.md, in their
// order. On failure returns false and points *error at the message of the first rule broken
// ("grid-sampler delegate blob: ..."), held in a thread-local buffer until this thread's next call.
bool parse_delegate_blob(const void* data, size_t size, DelegateBlob* out, const char** error);

}  // namespace etkit::gridsampler
