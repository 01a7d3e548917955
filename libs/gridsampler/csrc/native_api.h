// The C API of the native library, called from Python through ctypes.
#pragma once

#include <cstdint>

#define ETKIT_GRIDSAMPLER_BACKEND_ID "GridSamplerBackend"

extern "C" {

// Registers the grid-sampler backend with the ExecuTorch runtime. Idempotent; returns the
// executorch::runtime::Error of the first registration (0 = Ok).
int etkit_gridsampler_register_backend();

// Float32 grid sampling on strided 4-D tensors. Sizes and strides are in elements; the output
// must be N x C x Ho x Wo. Returns 0 on success, 1 for invalid arguments (a null pointer, a size
// below 1, a grid that is not N x Ho x Wo x 2 with the image's N, a mode or padding code out of
// range); it cannot check that the pointers hold that many elements: the caller does.
int etkit_gridsampler_grid_sample_f32(const float* image, const int64_t* image_sizes,
                                      const int64_t* image_strides, const float* grid,
                                      const int64_t* grid_sizes, const int64_t* grid_strides,
                                      float* output, const int64_t* output_strides, int mode,
                                      int padding, int align_corners);

// Per-tensor quantization parameters; scale is a float32 value.
typedef struct {
  double scale;
  int32_t zero_point;
  int32_t quant_min;
  int32_t quant_max;
} EtkitQParams;

// The integer grid sampler (docs/contract.md): int8 image, int16 (grid_is_int8 = 0) or int8
// grid, int8 output (output_q) or float32 output (output_q = NULL). Returns 0, or 1 with *error
// saying why the arguments are invalid (as for the float32 entry) or the configuration is outside
// the contract. `isa` caps the instruction set (see
// etkit_gridsampler_best_isa); one this CPU lacks is an error.
int etkit_gridsampler_grid_sample_q(const int8_t* image, const int64_t* image_sizes,
                                    const int64_t* image_strides, const void* grid,
                                    int grid_is_int8, const int64_t* grid_sizes,
                                    const int64_t* grid_strides, void* output,
                                    const int64_t* output_strides, int mode, int padding,
                                    int align_corners, const EtkitQParams* image_q,
                                    const EtkitQParams* grid_q, const EtkitQParams* output_q,
                                    int num_threads, int isa, const char** error);

// etkit_gridsampler_grid_sample_q for a float32 grid that the kernel quantizes with grid_q into
// int16 (grid_is_int8 = 0) or int8 as it samples (the delegate of a blob whose grid arrives as
// float32): the output of the quantized grid, bit for bit.
int etkit_gridsampler_grid_sample_q_float_grid(
    const int8_t* image, const int64_t* image_sizes, const int64_t* image_strides,
    const float* grid, int grid_is_int8, const int64_t* grid_sizes, const int64_t* grid_strides,
    void* output, const int64_t* output_strides, int mode, int padding, int align_corners,
    const EtkitQParams* image_q, const EtkitQParams* grid_q, const EtkitQParams* output_q,
    int num_threads, int isa, const char** error);

// `count` float32 values quantized with grid_q into int16 (grid_is_int8 = 0) or int8, as the
// delegate quantizes a grid on entry (ExecuTorch's quantize_per_tensor, bit for bit on finite
// values). Returns 0, or 1 for a null pointer, a negative count or an unsupported isa.
int etkit_gridsampler_quantize_grid(const float* values, int64_t count,
                                    const EtkitQParams* grid_q, int grid_is_int8, void* out,
                                    int isa);

// The number of threads the integer kernel uses when num_threads is 0: the CPUs in the process's
// affinity mask, capped by its cgroup's CPU quota, at least 1.
int etkit_gridsampler_default_num_threads();

// The instruction sets of the integer CPU kernel: 0 = auto (the best this CPU has), 1 = scalar,
// 2 = AVX2, 3 = AVX-512 (F, BW, DQ, VL, VBMI, VNNI), 4 = NEON (AArch64 Advanced SIMD). All
// compute the same bits. Returns the best one this CPU supports (1, 2 or 3 on x86, 4 on AArch64,
// 1 elsewhere).
int etkit_gridsampler_best_isa();

// 1 if this CPU (and this build) can run instruction set `isa` (the codes above), else 0.
int etkit_gridsampler_cpu_supports(int isa);

// The derived constants of the integer contract, for the Vulkan kernel's push constants:
// plan[0..15] = x.multiplier, x.shift, x.offset, x.size, y.multiplier, y.shift, y.offset, y.size,
// grid zero point, image zero point, output zero point, output min, output max,
// requant multiplier, requant shift, float output (0/1); *float_output_scale.
// Returns 0, or 1 with *error set.
int etkit_gridsampler_plan(int mode, int padding, int align_corners, const EtkitQParams* image_q,
                           const EtkitQParams* grid_q, int grid_is_int8,
                           const EtkitQParams* output_q, int64_t height, int64_t width,
                           int64_t* plan, float* float_output_scale, const char** error);

// Validates a delegate blob as the runtime does at init: 0 if valid, else 1 with *error set.
int etkit_gridsampler_validate_blob(const void* data, uint64_t size, const char** error);
}
