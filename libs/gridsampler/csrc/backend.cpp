// The grid-sampler backend inside the ExecuTorch runtime: validates the delegate blob at init, and at
// execute takes the image and the grid from the arguments the blob names, checks their dtypes and
// sizes against it (the sizes, or where a dimension is dynamic its bounds), resizes a dynamic output
// to the call's N x C x Ho x Wo, and runs the CPU kernel (planned for the call's image size),
// honouring each tensor's dim order through its strides.
// With an event tracer (an ETDump), each call logs one delegate event named kDebugEventName, whose
// debug-handle map (GridSamplerBackend.preprocess) points at the source grid_sample node: its time,
// and its output tensor as that node's runtime intermediate output.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>

#include <cstdio>

#include "delegate_format.h"
#include "grid_sample.h"
#include "native_api.h"
#include "quantized.h"

namespace etkit::gridsampler {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::EventTracerEntry;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;

template <typename T>
View4<T> view_of(const Tensor& tensor, T* data) {
  View4<T> view{data, {}, {}};
  for (int i = 0; i < 4; ++i) {
    view.sizes[i] = tensor.size(i);
    view.strides[i] = tensor.strides()[i];
  }
  return view;
}

struct Handle {
  DelegateBlob blob;
  QuantizedPlan plan;
};

// The delegate debug identifier of the one operator each delegate runs: the key of the debug-handle
// map that GridSamplerBackend.preprocess returns (etkit_gridsampler.backend.DEBUG_EVENT_NAME).
constexpr const char* kDebugEventName = "grid_sampler_2d";

// Times one grid-sampler call as a delegate event and logs its output, when the runtime was given an
// event tracer (the output only when it logs intermediate outputs); nothing otherwise.
class DelegateEvent {
 public:
  explicit DelegateEvent(EventTracer* tracer) : tracer_(tracer) {
#ifdef ET_EVENT_TRACER_ENABLED
    if (tracer_ != nullptr) {
      entry_ = tracer_->start_profiling_delegate(kDebugEventName,
                                                 executorch::runtime::kUnsetDelegateDebugIntId);
    }
#endif
  }

  void finish(const Tensor& output) {
#ifdef ET_EVENT_TRACER_ENABLED
    if (tracer_ != nullptr) {
      tracer_->end_profiling_delegate(entry_);
      // Only into a debug buffer the runtime set up for intermediate outputs: a tracer for
      // timings alone has none, and ETDumpGen aborts the process on a write without one.
      if (tracer_->event_tracer_debug_level() ==
          executorch::runtime::EventTracerDebugLogLevel::kIntermediateOutputs) {
        (void)tracer_->log_intermediate_output_delegate(
            kDebugEventName, executorch::runtime::kUnsetDelegateDebugIntId, output);
      }
    }
#else
    (void)output;
#endif
  }

 private:
  EventTracer* tracer_;
  EventTracerEntry entry_{};
};

QuantParams quant_params(const QParamsRecord& record) {
  return {record.scale, record.zero_point, record.quant_min, record.quant_max};
}

// The plan of a quantized blob for an image of height x width (nothing for a float one), or why
// the runtime refuses it. The blob's rules already fixed the dtypes (int8 image, int16 or int8
// grid, int8 or float output). At init it plans the image's upper bounds: every limit the plan
// checks grows with the size, so a plan that holds there holds for every size within the bounds.
const char* plan_of(const DelegateBlob& blob, int64_t height, int64_t width, QuantizedPlan* plan) {
  if (!blob.image.present) {
    return nullptr;
  }
  return plan_quantized(blob.params, quant_params(blob.image), quant_params(blob.grid),
                        blob.grid.dtype == DType::kInt16 ? GridType::kInt16 : GridType::kInt8,
                        !blob.output.present, quant_params(blob.output), height, width, plan);
}

ScalarType scalar_type_of(const QParamsRecord& record) {
  if (!record.present) {
    return ScalarType::Float;
  }
  return record.dtype == DType::kInt16 ? ScalarType::Short : ScalarType::Char;
}

const char* dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Float:
      return "float32";
    case ScalarType::Char:
      return "int8";
    case ScalarType::Short:
      return "int16";
    case ScalarType::Byte:
      return "uint8";
    default:
      return executorch::runtime::toString(type);
  }
}

// "[1, 4, 8, 8]" into `text`, for any rank.
void shape_text(const Tensor& tensor, char* text, size_t size) {
  size_t used = static_cast<size_t>(std::snprintf(text, size, "["));
  for (ssize_t i = 0; i < tensor.dim() && used < size; ++i) {
    used += static_cast<size_t>(std::snprintf(text + used, size - used, i ? ", %lld" : "%lld",
                                              static_cast<long long>(tensor.size(i))));
  }
  if (used < size) {
    std::snprintf(text + used, size - used, "]");
  }
}

// "[1, 3, 4..64, 4..64]": each dimension its size, or lower..upper where the bounds differ.
void bounds_text(const int32_t (&lower)[4], const int32_t (&upper)[4], char* text, size_t size) {
  size_t used = static_cast<size_t>(std::snprintf(text, size, "["));
  for (int i = 0; i < 4 && used < size; ++i) {
    const char* separator = i ? ", " : "";
    used += static_cast<size_t>(
        lower[i] == upper[i]
            ? std::snprintf(text + used, size - used, "%s%d", separator, upper[i])
            : std::snprintf(text + used, size - used, "%s%d..%d", separator, lower[i], upper[i]));
  }
  if (used < size) {
    std::snprintf(text + used, size - used, "]");
  }
}

// Whether `tensor` has `type`, four dimensions, and each size within [lower, upper].
bool fits(const Tensor& tensor, ScalarType type, const int32_t (&lower)[4],
          const int32_t (&upper)[4]) {
  if (tensor.scalar_type() != type || tensor.dim() != 4) {
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    if (tensor.size(i) < lower[i] || tensor.size(i) > upper[i]) {
      return false;
    }
  }
  return true;
}

// One log line per role, so that a swap shows as two lines that mirror each other.
void log_role(const char* role, size_t index, const Tensor& tensor, ScalarType type,
              const int32_t (&lower)[4], const int32_t (&upper)[4]) {
  char expected[128], actual[96];
  bounds_text(lower, upper, expected, sizeof expected);
  shape_text(tensor, actual, sizeof actual);
  ET_LOG(Error, "grid-sampler delegate: %s (argument %zu): expected %s %s, got %s %s", role, index,
         dtype_name(type), expected, dtype_name(tensor.scalar_type()), actual);
}

// One line saying what of `tensor` is outside what the blob gives its role: the dtype, the rank, or
// the first dimension outside its bounds.
void log_misfit(const char* role, size_t index, const Tensor& tensor, ScalarType type,
                const int32_t (&lower)[4], const int32_t (&upper)[4], const char* const (&names)[4]) {
  if (tensor.scalar_type() != type) {
    ET_LOG(Error, "grid-sampler delegate: the %s (argument %zu) is %s, the delegate takes %s", role,
           index, dtype_name(tensor.scalar_type()), dtype_name(type));
    return;
  }
  if (tensor.dim() != 4) {
    ET_LOG(Error, "grid-sampler delegate: the %s (argument %zu) has %lld dimensions, not 4", role,
           index, static_cast<long long>(tensor.dim()));
    return;
  }
  for (int i = 0; i < 4; ++i) {
    const long long size = tensor.size(i);
    if (size >= lower[i] && size <= upper[i]) {
      continue;
    }
    if (lower[i] == upper[i]) {
      ET_LOG(Error,
             "grid-sampler delegate: the %s (argument %zu) has %s %lld, the program was exported "
             "for %d",
             role, index, names[i], size, upper[i]);
    } else {
      ET_LOG(Error,
             "grid-sampler delegate: the %s (argument %zu) has %s %lld, outside its bounds [%d, "
             "%d] (a dynamic dimension of the exported program)",
             role, index, names[i], size, lower[i], upper[i]);
    }
    return;
  }
}

constexpr const char* kImageDimensionNames[4] = {"N", "C", "H", "W"};
constexpr const char* kGridDimensionNames[4] = {"N", "Ho", "Wo", "last dimension"};

template <typename GridT>
void run(const View4<const int8_t>& image, const View4<const GridT>& grid, const Tensor& output,
         const QuantizedPlan& plan) {
  if (plan.float_output) {
    grid_sample_quantized_parallel(image, grid, view_of(output, output.mutable_data_ptr<float>()),
                                   plan, 0);
  } else {
    grid_sample_quantized_parallel(image, grid,
                                   view_of(output, output.mutable_data_ptr<int8_t>()), plan, 0);
  }
}

// The grid arrives as float32; the blob's grid record says what it is quantized to on entry.
void run_float_grid(const View4<const int8_t>& image, const View4<const float>& grid,
                    const QParamsRecord& grid_record, const Tensor& output,
                    const QuantizedPlan& plan) {
  const QuantParams grid_q = quant_params(grid_record);
  const bool int16_grid = grid_record.dtype == DType::kInt16;
  if (plan.float_output) {
    const auto out = view_of(output, output.mutable_data_ptr<float>());
    int16_grid ? grid_sample_quantized_float_grid_parallel<int16_t>(image, grid, grid_q, out,
                                                                    plan, 0)
               : grid_sample_quantized_float_grid_parallel<int8_t>(image, grid, grid_q, out,
                                                                   plan, 0);
  } else {
    const auto out = view_of(output, output.mutable_data_ptr<int8_t>());
    int16_grid ? grid_sample_quantized_float_grid_parallel<int16_t>(image, grid, grid_q, out,
                                                                    plan, 0)
               : grid_sample_quantized_float_grid_parallel<int8_t>(image, grid, grid_q, out,
                                                                   plan, 0);
  }
}

class GridSamplerBackend final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec> /*compile_specs*/) const override {
    Handle* handle = context.get_runtime_allocator()->allocateInstance<Handle>();
    if (handle == nullptr) {
      return Error::MemoryAllocationFailed;
    }
    const char* error = nullptr;
    if (!parse_delegate_blob(processed->data(), processed->size(), &handle->blob, &error) ||
        (error = plan_of(handle->blob, handle->blob.image_shape[2], handle->blob.image_shape[3],
                         &handle->plan)) != nullptr) {
      ET_LOG(Error, "%s", error);
      processed->Free();
      return Error::DelegateInvalidCompatibility;
    }
    processed->Free();
    return handle;
  }

  Error execute(BackendExecutionContext& context, DelegateHandle* raw_handle,
                Span<EValue*> args) const override {
    const auto* handle = static_cast<const Handle*>(raw_handle);
    const DelegateBlob& blob = handle->blob;
    const size_t inputs = blob.input_count;
    bool all_tensors = args.size() == inputs + 1;
    for (size_t i = 0; all_tensors && i < args.size(); ++i) {
      all_tensors = args[i]->isTensor();
    }
    if (!all_tensors) {
      ET_LOG(Error,
             "grid-sampler delegate: expected %zu input tensor(s) and an output tensor, got %zu "
             "arguments; export the program again",
             inputs, args.size());
      return Error::InvalidArgument;
    }
    // The blob says which argument is which; the partition's signature, not the grid sampler's
    // argument order, fixed the order of `args`.
    const Tensor& image = args[blob.image_index]->toTensor();
    const Tensor& grid = args[blob.grid_index]->toTensor();
    const Tensor& output = args[inputs]->toTensor();
    const ScalarType image_type = scalar_type_of(blob.image);
    // A grid the delegate quantizes on entry arrives as float32.
    const ScalarType grid_type =
        blob.quantizes_grid ? ScalarType::Float : scalar_type_of(blob.grid);
    const bool image_fits = fits(image, image_type, blob.image_min_shape, blob.image_shape);
    const bool grid_fits = fits(grid, grid_type, blob.grid_min_shape, blob.grid_shape);
    // A dynamic N may differ between the two tensors; a fixed one cannot once both fit.
    if (!image_fits || !grid_fits || image.size(0) != grid.size(0)) {
      log_role("image", blob.image_index, image, image_type, blob.image_min_shape,
               blob.image_shape);
      log_role("grid", blob.grid_index, grid, grid_type, blob.grid_min_shape, blob.grid_shape);
      if (!image_fits) {
        log_misfit("image", blob.image_index, image, image_type, blob.image_min_shape,
                   blob.image_shape, kImageDimensionNames);
      }
      if (!grid_fits) {
        log_misfit("grid", blob.grid_index, grid, grid_type, blob.grid_min_shape, blob.grid_shape,
                   kGridDimensionNames);
      }
      if (image_fits && grid_fits) {
        ET_LOG(Error, "grid-sampler delegate: the image's N %lld differs from the grid's N %lld",
               static_cast<long long>(image.size(0)), static_cast<long long>(grid.size(0)));
      }
      if (!blob.dynamic) {
        ET_LOG(Error,
               "grid-sampler delegate: its arguments differ from the image and grid it was built "
               "for; export the program again");
      }
      return Error::InvalidArgument;
    }
    // The output is N x C x Ho x Wo of this call: with dynamic dimensions, the output (planned
    // at the upper bound) is resized to it, as ExecuTorch's own delegates do.
    const int32_t output_shape[4] = {static_cast<int32_t>(image.size(0)),
                                     static_cast<int32_t>(image.size(1)),
                                     static_cast<int32_t>(grid.size(1)),
                                     static_cast<int32_t>(grid.size(2))};
    const ScalarType output_type = scalar_type_of(blob.output);
    if (blob.dynamic && output.dim() == 4 &&
        !fits(output, output.scalar_type(), output_shape, output_shape)) {
      const executorch::aten::SizesType sizes[4] = {output_shape[0], output_shape[1],
                                                    output_shape[2], output_shape[3]};
      if (executorch::runtime::resize_tensor(output, {sizes, 4}) != Error::Ok) {
        char planned[96];
        shape_text(output, planned, sizeof planned);
        ET_LOG(Error,
               "grid-sampler delegate: output (argument %zu) %s cannot be resized to [%d, %d, %d, "
               "%d] (a static output, or past its planned bound); export the program again",
               inputs, planned, output_shape[0], output_shape[1], output_shape[2],
               output_shape[3]);
        return Error::InvalidArgument;
      }
    }
    if (!fits(output, output_type, output_shape, output_shape)) {
      log_role("output", inputs, output, output_type, output_shape, output_shape);
      return Error::InvalidArgument;
    }
    // The plan of init is for the image's upper bounds; a smaller image is planned for this call
    // (a few integer constants; the bounds were checked at init, so it cannot fail).
    const QuantizedPlan* plan = &handle->plan;
    QuantizedPlan call_plan;
    if (blob.image.present && (image.size(2) != plan->y.size || image.size(3) != plan->x.size)) {
      if (const char* error = plan_of(blob, image.size(2), image.size(3), &call_plan)) {
        ET_LOG(Error, "grid-sampler delegate: image of %lld x %lld: %s",
               static_cast<long long>(image.size(2)), static_cast<long long>(image.size(3)),
               error);
        return Error::InvalidArgument;
      }
      plan = &call_plan;
    }
    DelegateEvent event(context.event_tracer());
    if (!blob.image.present) {
      grid_sample_f32(view_of(image, image.const_data_ptr<float>()),
                      view_of(grid, grid.const_data_ptr<float>()),
                      view_of(output, output.mutable_data_ptr<float>()), blob.params);
    } else if (blob.quantizes_grid) {
      run_float_grid(view_of(image, image.const_data_ptr<int8_t>()),
                     view_of(grid, grid.const_data_ptr<float>()), blob.grid, output, *plan);
    } else if (grid_type == ScalarType::Short) {
      run(view_of(image, image.const_data_ptr<int8_t>()),
          view_of(grid, grid.const_data_ptr<int16_t>()), output, *plan);
    } else {
      run(view_of(image, image.const_data_ptr<int8_t>()),
          view_of(grid, grid.const_data_ptr<int8_t>()), output, *plan);
    }
    event.finish(output);
    return Error::Ok;
  }

  void destroy(DelegateHandle* /*handle*/) const override {}  // the blob lives in runtime memory
};

GridSamplerBackend backend_instance;

}  // namespace
}  // namespace etkit::gridsampler

extern "C" int etkit_gridsampler_register_backend() {
  static int status = static_cast<int>(executorch::runtime::register_backend(
      {ETKIT_GRIDSAMPLER_BACKEND_ID, &etkit::gridsampler::backend_instance}));
  return status;
}
