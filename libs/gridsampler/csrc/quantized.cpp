#include "quantized.h"

#include "quantized_x86.h"
#include "quantized_steps.h"

// The vectorized kernels of each architecture (quantized_x86*.cpp and quantized_neon.cpp compile
// to stubs or nothing elsewhere).
#if defined(__x86_64__) || defined(__i386__)
#define ETKIT_X86_BUILD 1
#endif
#if defined(__aarch64__)
#include "quantized_neon.h"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <functional>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace etkit::gridsampler {
namespace {

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
  // Step 1 multiplies (d - zero point) by the multiplier in 64-bit integers, shifted left when
  // the shift is negative: for every grid value that must stay below 2^63 (an axis of 2^23
  // pixels or more with a tiny grid scale would wrap around).
  const double product = max_d * static_cast<double>(axis->multiplier) *
                         std::ldexp(1.0, static_cast<int>(std::max<int64_t>(0, -axis->shift)));
  if (!(product < 9.2e18)) {
    return "image axis too long for this grid quantization: step 1's 64-bit product would "
           "overflow (more than 2^63)";
  }
  return nullptr;
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

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
#ifdef ETKIT_X86_BUILD
    case Isa::kAvx2:
      return avx2_supported();
    case Isa::kAvx512:
      return avx512_supported();
#else
    case Isa::kAvx2:
    case Isa::kAvx512:
      return false;
#endif
    case Isa::kNeon:
#if defined(__aarch64__)
      return true;  // Advanced SIMD is part of every AArch64 CPU
#else
      return false;
#endif
  }
  return false;
}

Isa best_isa() {
#if defined(__aarch64__)
  return Isa::kNeon;
#else
  return cpu_supports(Isa::kAvx512) ? Isa::kAvx512
                                    : (cpu_supports(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar);
#endif
}

template <typename GridT, typename OutT>
void grid_sample_quantized_scalar(const View4<const int8_t>& image, const View4<const GridT>& grid,
                                  const View4<OutT>& output, const QuantizedPlan& plan,
                                  int64_t row_begin, int64_t row_end) {
  // Everything in locals: the int8 stores below may alias any memory, so the compiler would
  // otherwise reload each field of the plan and the views after every store.
  const QuantizedPlan p = plan;
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const int64_t grid_n = grid.strides[0], grid_y = grid.strides[1];
  const int64_t grid_x = grid.strides[2], grid_axis = grid.strides[3];
  const int64_t output_n = output.strides[0], output_c = output.strides[1];
  const int64_t output_y = output.strides[2], output_x = output.strides[3];
  steps::Plane plane{nullptr,          image.sizes[1],   image.sizes[2],  image.sizes[3],
                     image.strides[1], image.strides[2], image.strides[3]};
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / out_height, oy = row % out_height;
    const GridT* const grid_row = grid.data + n * grid_n + oy * grid_y;
    plane.data = image.data + n * image.strides[0];
    OutT* __restrict__ const output_row = output.data + n * output_n + oy * output_y;
    for (int64_t ox = 0; ox < out_width; ++ox) {
      const GridT* const grid_point = grid_row + ox * grid_x;
      steps::sample_pixel(steps::pixel_coordinate(grid_point[0], p, p.x),
                          steps::pixel_coordinate(grid_point[grid_axis], p, p.y), plane,
                          output_row + ox * output_x, output_c, p);
    }
  }
}

namespace {

// The dispatch table: the vectorized kernels, in the order they are tried; the first whose
// instruction set the call allows and the CPU has, and whose `applies` holds for the layout and
// the plan, runs the rows (docs/kernels.md lists which one serves each mode, layout and channel
// count). None: the scalar kernel.
template <typename GridT, typename OutT>
struct Kernel {
  Isa isa;           // the instruction set it needs
  const char* name;  // for docs/kernels.md
  bool (*applies)(const View4<const int8_t>&, const View4<OutT>&, const QuantizedPlan&);
  void (*run)(const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&,
              const QuantizedPlan&, int64_t, int64_t);
};

#ifdef ETKIT_X86_BUILD
template <typename GridT, typename OutT, bool kAvx512>
void run_x86(const View4<const int8_t>& image, const View4<const GridT>& grid,
             const View4<OutT>& output, const QuantizedPlan& plan, int64_t row_begin,
             int64_t row_end) {
  grid_sample_quantized_x86(image, grid, output, plan, row_begin, row_end, kAvx512);
}

template <typename OutT, bool kAvx512>
bool any_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                 const QuantizedPlan& plan) {
  return x86_any_applies(image, output, plan, kAvx512);
}

template <typename GridT, typename OutT, bool kAvx512>
void run_any(const View4<const int8_t>& image, const View4<const GridT>& grid,
             const View4<OutT>& output, const QuantizedPlan& plan, int64_t row_begin,
             int64_t row_end) {
  grid_sample_quantized_x86_any(image, grid, output, plan, row_begin, row_end, kAvx512);
}
#endif

template <typename GridT, typename OutT>
constexpr Kernel<GridT, OutT> kKernels[] = {
#if defined(__aarch64__)
    {Isa::kNeon, "neon", neon_kernel_applies<OutT>, grid_sample_quantized_neon<GridT, OutT>},
#endif
#ifdef ETKIT_X86_BUILD
    // bilinear 4-channel channels-last (quantized_x86.cpp)
    {Isa::kAvx512, "x86_quads_avx512", x86_kernel_applies<OutT>, run_x86<GridT, OutT, true>},
    {Isa::kAvx2, "x86_quads_avx2", x86_kernel_applies<OutT>, run_x86<GridT, OutT, false>},
    // every other mode and layout (quantized_x86_any.cpp)
    {Isa::kAvx512, "x86_any_avx512", any_applies<OutT, true>, run_any<GridT, OutT, true>},
    {Isa::kAvx2, "x86_any_avx2", any_applies<OutT, false>, run_any<GridT, OutT, false>},
#endif
    // the scalar kernel, which runs where no entry above applies (and an entry on every
    // architecture, so that the table is never empty)
    {Isa::kScalar, "scalar", nullptr, nullptr},
};

// Whether a call capped at `isa` may run a kernel of `kernel`: kAuto any the CPU has, kAvx512
// also AVX2's, every other one itself.
bool allows(Isa isa, Isa kernel) {
  if (isa == Isa::kScalar || kernel == Isa::kScalar || !cpu_supports(kernel)) {
    return false;
  }
  return isa == Isa::kAuto || isa == kernel || (isa == Isa::kAvx512 && kernel == Isa::kAvx2);
}

template <typename GridT, typename OutT>
const Kernel<GridT, OutT>* select_kernel(const View4<const int8_t>& image,
                                         const View4<OutT>& output, const QuantizedPlan& plan,
                                         Isa isa) {
  for (const Kernel<GridT, OutT>& kernel : kKernels<GridT, OutT>) {
    if (kernel.run != nullptr && allows(isa, kernel.isa) &&
        kernel.applies(image, output, plan)) {
      return &kernel;
    }
  }
  return nullptr;
}

}  // namespace

template <typename GridT, typename OutT>
void grid_sample_quantized(const View4<const int8_t>& image, const View4<const GridT>& grid,
                           const View4<OutT>& output, const QuantizedPlan& plan,
                           int64_t row_begin, int64_t row_end, Isa isa) {
  if (const auto* kernel = select_kernel<GridT, OutT>(image, output, plan, isa)) {
    kernel->run(image, grid, output, plan, row_begin, row_end);
  } else {
    grid_sample_quantized_scalar(image, grid, output, plan, row_begin, row_end);
  }
}

namespace {

// The CPUs in the calling thread's affinity mask, which is the process's unless a thread changed
// its own (0 where it cannot be read).
int affinity_cpu_count() {
#if defined(__linux__)
  // A set large enough for the machine: sched_getaffinity fails with EINVAL while it is too small.
  for (int cpus = CPU_SETSIZE; cpus <= (1 << 20); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) {
      return 0;
    }
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, set);
    const bool read = sched_getaffinity(0, bytes, set) == 0;
    const int count = read ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (read) {
      return count;
    }
  }
#endif
  return 0;
}

// CPUs' worth of time a cgroup file grants: "quota period" (cgroup v2 cpu.max) or a quota file
// and a period file (v1); 0 for no limit or no file.
int cpu_quota(const std::string& max_file, const std::string& quota_file,
              const std::string& period_file) {
  long long quota = -1, period = 0;
  if (!max_file.empty()) {
    std::ifstream in(max_file);
    std::string first;
    if (!(in >> first >> period) || first == "max") {
      return 0;
    }
    quota = std::atoll(first.c_str());
  } else {
    std::ifstream quota_in(quota_file), period_in(period_file);
    if (!(quota_in >> quota) || !(period_in >> period)) {
      return 0;
    }
  }
  if (quota <= 0 || period <= 0) {
    return 0;
  }
  return static_cast<int>(std::min<long long>((quota + period - 1) / period, 1 << 20));
}

// The CPU quota of this process's cgroup and of its ancestors (the smallest), 0 for none.
int cgroup_cpu_limit() {
#if defined(__linux__)
  int limit = 0;
  const auto take = [&limit](int quota) {
    if (quota > 0 && (limit == 0 || quota < limit)) {
      limit = quota;
    }
  };
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    // "hierarchy:controllers:path"; v2 is "0::path"
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) {
      continue;
    }
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    const bool v2 = line.compare(0, first, "0") == 0 && controllers.empty();
    const bool v1 = controllers == "cpu" || controllers.find("cpu,") == 0 ||
                    controllers.find(",cpu,") != std::string::npos ||
                    (controllers.size() > 4 &&
                     controllers.compare(controllers.size() - 4, 4, ",cpu") == 0);
    if (!v2 && !v1) {
      continue;
    }
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/" + controllers;
    // From the process's own cgroup up to the root of the mounted hierarchy (in a container
    // whose cgroup namespace hides the path, the mount's root is the container's cgroup).
    for (;;) {
      const std::string dir = root + (path == "/" ? "" : path);
      take(v2 ? cpu_quota(dir + "/cpu.max", "", "")
              : cpu_quota("", dir + "/cpu.cfs_quota_us", dir + "/cpu.cfs_period_us"));
      if (path.empty() || path == "/") {
        break;
      }
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
  return limit;
#else
  return 0;
#endif
}

}  // namespace

int default_num_threads() {
  int threads = affinity_cpu_count();
  if (threads <= 0) {
    threads = static_cast<int>(std::thread::hardware_concurrency());
  }
  // The quota is read once: it rarely changes, and the files cost more than the affinity call.
  static const int quota = cgroup_cpu_limit();
  if (quota > 0) {
    threads = std::min(threads, quota);
  }
  return std::max(threads, 1);
}

void parallel_rows(int64_t rows, int64_t width, int num_threads,
                   const std::function<void(int64_t, int64_t)>& work_on) {
  // Below ~64k output pixels a thread costs more than it saves.
  int64_t threads = std::min<int64_t>(rows, rows * width / 65536 + 1);
  if (threads > 1) {
    threads = std::min<int64_t>(threads, num_threads > 0 ? num_threads : default_num_threads());
  }
  // A chunk is 16 rows, or more where rows are short (a correlation lookup's are 9 pixels), so
  // that each holds some 8k pixels: a chunk's set-up then costs little against its work.
  const int64_t short_rows = (8192 + width - 1) / width;
  if (threads <= 1) {
    const int64_t chunk = std::max<int64_t>(16, short_rows);
    for (int64_t begin = 0; begin < rows; begin += chunk) {
      work_on(begin, std::min(rows, begin + chunk));
    }
    return;
  }
  // Rows are handed out in chunks as threads ask for them, so that a thread slowed down (a
  // busy core, a little core) holds the others up by one chunk at most. The calling thread
  // works too.
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(std::max<int64_t>(16, short_rows), rows / (threads * 8)));
  std::atomic<int64_t> next_row{0};
  const auto work = [&] {
    for (;;) {
      const int64_t begin = next_row.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= rows) {
        return;
      }
      work_on(begin, std::min(rows, begin + chunk));
    }
  };
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) {
    workers.emplace_back(work);
  }
  work();
  for (auto& worker : workers) {
    worker.join();
  }
}

template <typename GridT, typename OutT>
void grid_sample_quantized_parallel(const View4<const int8_t>& image,
                                    const View4<const GridT>& grid, const View4<OutT>& output,
                                    const QuantizedPlan& plan, int num_threads, Isa isa) {
  const int64_t rows = grid.sizes[0] * grid.sizes[1];
  if (rows * grid.sizes[2] < 65536 || num_threads == 1) {  // one call, as one thread would
    grid_sample_quantized(image, grid, output, plan, 0, rows, isa);
    return;
  }
  parallel_rows(rows, grid.sizes[2], num_threads, [&](int64_t begin, int64_t end) {
    grid_sample_quantized(image, grid, output, plan, begin, end, isa);
  });
}

#define ETKIT_INSTANTIATE(GridT, OutT)                                                          \
  template void grid_sample_quantized<GridT, OutT>(                                           \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&,              \
      const QuantizedPlan&, int64_t, int64_t, Isa);                                           \
  template void grid_sample_quantized_parallel<GridT, OutT>(                                  \
      const View4<const int8_t>&, const View4<const GridT>&, const View4<OutT>&,              \
      const QuantizedPlan&, int, Isa);
ETKIT_INSTANTIATE(int16_t, int8_t)
ETKIT_INSTANTIATE(int16_t, float)
ETKIT_INSTANTIATE(int8_t, int8_t)
ETKIT_INSTANTIATE(int8_t, float)
#undef ETKIT_INSTANTIATE

}  // namespace etkit::gridsampler
