// The integer grid sampler: the fixed-point contract of docs/contract.md, step by step.
// shaders/grid_sample.comp implements the same steps, in the same order, with the same names.
#pragma once

#include <cstdint>
#include <functional>

#include "grid_sample.h"

namespace etkit::gridsampler {

constexpr int kCoordFracBits = 32;  // pixel coordinates: int64 with 32 fractional bits
constexpr int kWeightBits = 15;     // bilinear weights: 0 .. 2^15
constexpr double kMaxCoordinate = 16777216.0;  // |pixel coordinate| < 2^24
constexpr double kMaxRequantRatio = 32.0;      // image scale / output scale

struct QuantParams {
  double scale;  // a float32 value
  int32_t zero_point;
  int32_t quant_min;
  int32_t quant_max;
};

enum class GridType : uint8_t { kInt16 = 0, kInt8 = 1 };

// unnormalize, for one axis: P = round(d * multiplier * 2^-shift) + offset (shift <= 0: exact
// left shift), where d = q_grid - grid_zero_point.
struct AxisPlan {
  int64_t multiplier;
  int64_t shift;
  int64_t offset;
  int64_t size;
};

// Everything the kernels need, derived once from the op and the shapes (plan_quantized).
struct QuantizedPlan {
  SampleParams params;
  AxisPlan x, y;
  int64_t grid_zero_point;
  int64_t image_zero_point;
  int64_t output_zero_point, output_min, output_max;
  int64_t requant_multiplier;  // image scale / output scale = multiplier * 2^-(shift - 15)
  int64_t requant_shift;
  float float_output_scale;  // image scale * 2^-15, for float output
  bool float_output;
};

// Derives the plan. Returns nullptr, or a static message saying why the configuration is outside
// the contract. `output` is ignored when `float_output`.
const char* plan_quantized(const SampleParams& params, const QuantParams& image,
                           const QuantParams& grid, GridType grid_type, bool float_output,
                           const QuantParams& output, int64_t height, int64_t width,
                           QuantizedPlan* plan);

// The instruction sets the CPU kernel can use. Every one computes the same bits; kAuto picks the
// best the CPU supports, and the vectorized kernels apply where their layout conditions hold
// (quantized.cpp's dispatch table; docs/kernels.md), the scalar kernel elsewhere. kAvx2 and
// kAvx512 exist on x86 builds, kNeon (AArch64's Advanced SIMD) on AArch64 builds.
enum class Isa : int { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kNeon = 4 };

// Whether this CPU can run `isa` (kAuto: always true).
bool cpu_supports(Isa isa);
// The best instruction set this CPU supports.
Isa best_isa();

// int8 image, int16/int8 grid, int8 or float32 output; rows [row_begin, row_end) of the N * Ho
// output rows. Strided views: any dim order. `isa` caps the instruction set (kScalar: the
// scalar kernel only).
template <typename GridT, typename OutT>
void grid_sample_quantized(const View4<const int8_t>& image, const View4<const GridT>& grid,
                           const View4<OutT>& output, const QuantizedPlan& plan,
                           int64_t row_begin, int64_t row_end, Isa isa = Isa::kAuto);

// The threads the kernel uses by default: the CPUs this process may run on (its affinity mask,
// as taskset and cpusets set it), at most its cgroup's CPU quota (cpu.max, or cfs_quota_us /
// cfs_period_us, rounded up), at least 1.
int default_num_threads();

// The whole output, on `num_threads` threads (0: default_num_threads(); fewer for small outputs).
template <typename GridT, typename OutT>
void grid_sample_quantized_parallel(const View4<const int8_t>& image,
                                    const View4<const GridT>& grid, const View4<OutT>& output,
                                    const QuantizedPlan& plan, int num_threads,
                                    Isa isa = Isa::kAuto);

// Output rows [0, rows) of `width` pixels in chunks, on `num_threads` threads (0:
// default_num_threads(); fewer for small outputs; the calling thread works too):
// work_on(begin, end) once per chunk, each chunk on one thread.
void parallel_rows(int64_t rows, int64_t width, int num_threads,
                   const std::function<void(int64_t, int64_t)>& work_on);

// `count` float32 values quantized with `grid_q` as ExecuTorch's quantize_per_tensor kernel
// does (op_quantize.cpp's quantize_val), bit for bit on finite values: in float32,
// nearbyint(value * (1 / scale)) + zero_point, clamped to [quant_min, quant_max]; NaN gives
// quant_min, an infinity its side's bound (where ExecuTorch's conversion is undefined).
// etkit_gridsampler.op.quantize_on_entry is the same in PyTorch.
template <typename GridT>
void quantize_grid_on_entry(const float* values, int64_t count, const QuantParams& grid_q,
                            GridT* out, Isa isa = Isa::kAuto);

// grid_sample_quantized_parallel for a float32 grid that the delegate quantizes on entry with
// `grid_q` (quantize_grid_on_entry, into GridT): each thread quantizes a chunk of rows into a
// buffer of its own and samples with it, so the quantized grid is never whole in memory. The
// output is the one the quantized grid gives, bit for bit.
template <typename GridT, typename OutT>
void grid_sample_quantized_float_grid_parallel(const View4<const int8_t>& image,
                                               const View4<const float>& grid,
                                               const QuantParams& grid_q,
                                               const View4<OutT>& output,
                                               const QuantizedPlan& plan, int num_threads,
                                               Isa isa = Isa::kAuto);

}  // namespace etkit::gridsampler
