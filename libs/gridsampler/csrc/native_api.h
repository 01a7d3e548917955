// The C API of the native library, called from Python through ctypes.
#pragma once

#include <cstdint>

#define ETKIT_GRIDSAMPLER_BACKEND_ID "GridSamplerBackend"

extern "C" {

// Registers the grid-sampler backend with the ExecuTorch runtime. Idempotent; returns the
// executorch::runtime::Error of the first registration (0 = Ok).
int etkit_gridsampler_register_backend();

// Float32 grid sampling on strided 4-D tensors. Sizes and strides are in elements; the output
// must be N x C x Ho x Wo. Returns 0 on success, 1 for invalid arguments.
int etkit_gridsampler_grid_sample_f32(const float* image, const int64_t* image_sizes,
                                      const int64_t* image_strides, const float* grid,
                                      const int64_t* grid_sizes, const int64_t* grid_strides,
                                      float* output, const int64_t* output_strides, int mode,
                                      int padding, int align_corners);

// Validates a delegate blob as the runtime does at init: 0 if valid, else 1 with *error set.
int etkit_gridsampler_validate_blob(const void* data, uint64_t size, const char** error);
}
