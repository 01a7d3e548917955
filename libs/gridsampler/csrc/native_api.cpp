#include "native_api.h"

#include <Python.h>

#include "delegate_format.h"
#include "grid_sample.h"
#include "quantized.h"

namespace {

template <typename T>
etkit::gridsampler::View4<T> make_view(T* data, const int64_t* sizes, const int64_t* strides) {
  etkit::gridsampler::View4<T> view{data, {}, {}};
  for (int i = 0; i < 4; ++i) {
    view.sizes[i] = sizes[i];
    view.strides[i] = strides[i];
  }
  return view;
}

// Why the operands cannot be sampled, or nullptr: what the C API can check without knowing how
// much memory the pointers hold.
const char* invalid_operands(const void* image, const int64_t* image_sizes,
                             const int64_t* image_strides, const void* grid,
                             const int64_t* grid_sizes, const int64_t* grid_strides,
                             const void* output, const int64_t* output_strides) {
  if (image == nullptr || image_sizes == nullptr || image_strides == nullptr ||
      grid == nullptr || grid_sizes == nullptr || grid_strides == nullptr || output == nullptr ||
      output_strides == nullptr) {
    return "a tensor, size or stride pointer is null";
  }
  for (int i = 0; i < 4; ++i) {
    if (image_sizes[i] < 1 || grid_sizes[i] < 1) {
      return "every size of the image and the grid must be at least 1";
    }
    if (image_strides[i] < 0 || grid_strides[i] < 0 || output_strides[i] < 0) {
      return "strides must not be negative";
    }
  }
  if (grid_sizes[3] != 2 || grid_sizes[0] != image_sizes[0]) {
    return "grid must be N x Ho x Wo x 2 with the image's N";
  }
  return nullptr;
}

}  // namespace

extern "C" int etkit_gridsampler_grid_sample_f32(
    const float* image, const int64_t* image_sizes, const int64_t* image_strides,
    const float* grid, const int64_t* grid_sizes, const int64_t* grid_strides, float* output,
    const int64_t* output_strides, int mode, int padding, int align_corners) {
  using namespace etkit::gridsampler;
  if (mode < 0 || mode > 1 || padding < 0 || padding > 2 ||
      invalid_operands(image, image_sizes, image_strides, grid, grid_sizes, grid_strides, output,
                       output_strides) != nullptr) {
    return 1;
  }
  const int64_t output_sizes[4] = {image_sizes[0], image_sizes[1], grid_sizes[1], grid_sizes[2]};
  grid_sample_f32(make_view(image, image_sizes, image_strides),
                  make_view(grid, grid_sizes, grid_strides),
                  make_view(output, output_sizes, output_strides),
                  {static_cast<Mode>(mode), static_cast<Padding>(padding), align_corners != 0});
  return 0;
}

namespace {

using etkit::gridsampler::QuantizedPlan;
using etkit::gridsampler::QuantParams;

QuantParams to_quant_params(const EtkitQParams* q) {
  return q == nullptr ? QuantParams{1.0, 0, 0, 0}
                      : QuantParams{q->scale, q->zero_point, q->quant_min, q->quant_max};
}

const char* make_plan(int mode, int padding, int align_corners, const EtkitQParams* image_q,
                      const EtkitQParams* grid_q, int grid_is_int8, const EtkitQParams* output_q,
                      int64_t height, int64_t width, QuantizedPlan* plan) {
  using namespace etkit::gridsampler;
  if (mode < 0 || mode > 1 || padding < 0 || padding > 2 || image_q == nullptr ||
      grid_q == nullptr) {
    return "invalid mode, padding or quantization parameters";
  }
  return plan_quantized(
      {static_cast<Mode>(mode), static_cast<Padding>(padding), align_corners != 0},
      to_quant_params(image_q), to_quant_params(grid_q),
      grid_is_int8 ? GridType::kInt8 : GridType::kInt16, output_q == nullptr,
      to_quant_params(output_q), height, width, plan);
}

template <typename GridT>
void run_quantized(const int8_t* image, const int64_t* image_sizes, const int64_t* image_strides,
                   const void* grid, const int64_t* grid_sizes, const int64_t* grid_strides,
                   void* output, const int64_t* output_strides, const QuantizedPlan& plan,
                   int num_threads, etkit::gridsampler::Isa isa) {
  using namespace etkit::gridsampler;
  const int64_t output_sizes[4] = {image_sizes[0], image_sizes[1], grid_sizes[1], grid_sizes[2]};
  const auto image_view = make_view(image, image_sizes, image_strides);
  const auto grid_view = make_view(static_cast<const GridT*>(grid), grid_sizes, grid_strides);
  if (plan.float_output) {
    grid_sample_quantized_parallel(
        image_view, grid_view,
        make_view(static_cast<float*>(output), output_sizes, output_strides), plan, num_threads,
        isa);
  } else {
    grid_sample_quantized_parallel(
        image_view, grid_view,
        make_view(static_cast<int8_t*>(output), output_sizes, output_strides), plan, num_threads,
        isa);
  }
}

template <typename GridT>
void run_float_grid(const int8_t* image, const int64_t* image_sizes, const int64_t* image_strides,
                    const float* grid, const int64_t* grid_sizes, const int64_t* grid_strides,
                    const QuantParams& grid_q, void* output, const int64_t* output_strides,
                    const QuantizedPlan& plan, int num_threads, etkit::gridsampler::Isa isa) {
  using namespace etkit::gridsampler;
  const int64_t output_sizes[4] = {image_sizes[0], image_sizes[1], grid_sizes[1], grid_sizes[2]};
  const auto image_view = make_view(image, image_sizes, image_strides);
  const auto grid_view = make_view(grid, grid_sizes, grid_strides);
  if (plan.float_output) {
    grid_sample_quantized_float_grid_parallel<GridT>(
        image_view, grid_view, grid_q,
        make_view(static_cast<float*>(output), output_sizes, output_strides), plan, num_threads,
        isa);
  } else {
    grid_sample_quantized_float_grid_parallel<GridT>(
        image_view, grid_view, grid_q,
        make_view(static_cast<int8_t*>(output), output_sizes, output_strides), plan, num_threads,
        isa);
  }
}

}  // namespace

namespace {

// What both quantized entries check before any kernel runs, in this order: the instruction set,
// the operands, the plan. Returns nullptr with *plan set, or why not.
const char* check_quantized(const int8_t* image, const int64_t* image_sizes,
                            const int64_t* image_strides, const void* grid, int grid_is_int8,
                            const int64_t* grid_sizes, const int64_t* grid_strides, void* output,
                            const int64_t* output_strides, int mode, int padding,
                            int align_corners, const EtkitQParams* image_q,
                            const EtkitQParams* grid_q, const EtkitQParams* output_q, int isa,
                            QuantizedPlan* plan) {
  using etkit::gridsampler::Isa;
  if (isa < 0 || isa > 4 || !etkit::gridsampler::cpu_supports(static_cast<Isa>(isa))) {
    return "this CPU does not support the requested instruction set";
  }
  if (const char* error = invalid_operands(image, image_sizes, image_strides, grid, grid_sizes,
                                           grid_strides, output, output_strides)) {
    return error;
  }
  return make_plan(mode, padding, align_corners, image_q, grid_q, grid_is_int8, output_q,
                   image_sizes[2], image_sizes[3], plan);
}

}  // namespace

namespace {

// Both quantized entries: the checks of check_quantized, then the kernel for an integer grid or,
// with `float_grid`, for a float32 grid quantized on entry with grid_q.
int sample_quantized(const int8_t* image, const int64_t* image_sizes,
                     const int64_t* image_strides, const void* grid, bool float_grid,
                     int grid_is_int8, const int64_t* grid_sizes, const int64_t* grid_strides,
                     void* output, const int64_t* output_strides, int mode, int padding,
                     int align_corners, const EtkitQParams* image_q, const EtkitQParams* grid_q,
                     const EtkitQParams* output_q, int num_threads, int isa,
                     const char** error) {
  using etkit::gridsampler::Isa;
  const char* unread = nullptr;
  error = error != nullptr ? error : &unread;
  QuantizedPlan plan;
  if ((*error = check_quantized(image, image_sizes, image_strides, grid, grid_is_int8, grid_sizes,
                                grid_strides, output, output_strides, mode, padding,
                                align_corners, image_q, grid_q, output_q, isa, &plan)) !=
      nullptr) {
    return 1;
  }
  const Isa chosen = static_cast<Isa>(isa);
  if (float_grid) {
    const auto* values = static_cast<const float*>(grid);
    const QuantParams q = to_quant_params(grid_q);
    (grid_is_int8 ? run_float_grid<int8_t> : run_float_grid<int16_t>)(
        image, image_sizes, image_strides, values, grid_sizes, grid_strides, q, output,
        output_strides, plan, num_threads, chosen);
  } else {
    (grid_is_int8 ? run_quantized<int8_t> : run_quantized<int16_t>)(
        image, image_sizes, image_strides, grid, grid_sizes, grid_strides, output,
        output_strides, plan, num_threads, chosen);
  }
  return 0;
}

}  // namespace

extern "C" int etkit_gridsampler_grid_sample_q(
    const int8_t* image, const int64_t* image_sizes, const int64_t* image_strides,
    const void* grid, int grid_is_int8, const int64_t* grid_sizes, const int64_t* grid_strides,
    void* output, const int64_t* output_strides, int mode, int padding, int align_corners,
    const EtkitQParams* image_q, const EtkitQParams* grid_q, const EtkitQParams* output_q,
    int num_threads, int isa, const char** error) {
  return sample_quantized(image, image_sizes, image_strides, grid, false, grid_is_int8,
                          grid_sizes, grid_strides, output, output_strides, mode, padding,
                          align_corners, image_q, grid_q, output_q, num_threads, isa, error);
}

extern "C" int etkit_gridsampler_grid_sample_q_float_grid(
    const int8_t* image, const int64_t* image_sizes, const int64_t* image_strides,
    const float* grid, int grid_is_int8, const int64_t* grid_sizes, const int64_t* grid_strides,
    void* output, const int64_t* output_strides, int mode, int padding, int align_corners,
    const EtkitQParams* image_q, const EtkitQParams* grid_q, const EtkitQParams* output_q,
    int num_threads, int isa, const char** error) {
  return sample_quantized(image, image_sizes, image_strides, grid, true, grid_is_int8,
                          grid_sizes, grid_strides, output, output_strides, mode, padding,
                          align_corners, image_q, grid_q, output_q, num_threads, isa, error);
}

extern "C" int etkit_gridsampler_quantize_grid(const float* values, int64_t count,
                                               const EtkitQParams* grid_q, int grid_is_int8,
                                               void* out, int isa) {
  using namespace etkit::gridsampler;
  if (values == nullptr || out == nullptr || grid_q == nullptr || count < 0 || isa < 0 ||
      isa > 4 || !cpu_supports(static_cast<Isa>(isa))) {
    return 1;
  }
  if (grid_is_int8) {
    quantize_grid_on_entry(values, count, to_quant_params(grid_q), static_cast<int8_t*>(out),
                           static_cast<Isa>(isa));
  } else {
    quantize_grid_on_entry(values, count, to_quant_params(grid_q), static_cast<int16_t*>(out),
                           static_cast<Isa>(isa));
  }
  return 0;
}

extern "C" int etkit_gridsampler_default_num_threads() {
  return etkit::gridsampler::default_num_threads();
}

extern "C" int etkit_gridsampler_best_isa() {
  return static_cast<int>(etkit::gridsampler::best_isa());
}

extern "C" int etkit_gridsampler_cpu_supports(int isa) {
  return isa >= 0 && isa <= 4 &&
                 etkit::gridsampler::cpu_supports(static_cast<etkit::gridsampler::Isa>(isa))
             ? 1
             : 0;
}

extern "C" int etkit_gridsampler_plan(int mode, int padding, int align_corners,
                                      const EtkitQParams* image_q, const EtkitQParams* grid_q,
                                      int grid_is_int8, const EtkitQParams* output_q,
                                      int64_t height, int64_t width, int64_t* values,
                                      float* float_output_scale, const char** error) {
  const char* unread = nullptr;
  error = error != nullptr ? error : &unread;
  if (values == nullptr || float_output_scale == nullptr) {
    *error = "plan and float_output_scale must not be null";
    return 1;
  }
  QuantizedPlan plan;
  if ((*error = make_plan(mode, padding, align_corners, image_q, grid_q, grid_is_int8, output_q,
                          height, width, &plan)) != nullptr) {
    return 1;
  }
  const int64_t flat[16] = {plan.x.multiplier,  plan.x.shift,        plan.x.offset,
                            plan.x.size,        plan.y.multiplier,  plan.y.shift,
                            plan.y.offset,      plan.y.size,        plan.grid_zero_point,
                            plan.image_zero_point, plan.output_zero_point, plan.output_min,
                            plan.output_max,    plan.requant_multiplier, plan.requant_shift,
                            plan.float_output ? 1 : 0};
  for (int i = 0; i < 16; ++i) {
    values[i] = flat[i];
  }
  *float_output_scale = plan.float_output_scale;
  return 0;
}

extern "C" int etkit_gridsampler_validate_blob(const void* data, uint64_t size,
                                                const char** error) {
  const char* unread = nullptr;
  error = error != nullptr ? error : &unread;
  etkit::gridsampler::DelegateBlob blob;
  return etkit::gridsampler::parse_delegate_blob(data, size, &blob, error) ? 0 : 1;
}

// The library is also a (trivial) Python extension module, so that importlib finds it in regular
// and editable installs alike; Python code calls it through ctypes.
static PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "_native",
                                    "etkit-gridsampler native library (used through ctypes)", -1,
                                    nullptr};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
