// The grid-sampler backend inside the ExecuTorch runtime: validates the delegate blob at init, and at
// execute takes the image and the grid from the arguments the blob names, checks their dtypes and
// shapes against it, and runs the CPU kernel, honouring each tensor's dim order through its strides.
// With an event tracer (an ETDump), each call logs one delegate event named kDebugEventName, whose
// debug-handle map (GridSamplerBackend.preprocess) points at the source grid_sample node: its time,
// and its output tensor as that node's runtime intermediate output.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
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
// event tracer; nothing otherwise.
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
      (void)tracer_->log_intermediate_output_delegate(
          kDebugEventName, executorch::runtime::kUnsetDelegateDebugIntId, output);
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

// The plan of a quantized blob (nothing for a float one), or why the runtime refuses it. The
// blob's rules already fixed the dtypes (int8 image, int16 or int8 grid, int8 or float output).
const char* plan_of(const DelegateBlob& blob, QuantizedPlan* plan) {
  if (!blob.image.present) {
    return nullptr;
  }
  return plan_quantized(blob.params, quant_params(blob.image), quant_params(blob.grid),
                        blob.grid.dtype == DType::kInt16 ? GridType::kInt16 : GridType::kInt8,
                        !blob.output.present, quant_params(blob.output), blob.image_shape[2],
                        blob.image_shape[3], plan);
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

bool matches(const Tensor& tensor, ScalarType type, const int32_t (&shape)[4]) {
  if (tensor.scalar_type() != type || tensor.dim() != 4) {
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    if (tensor.size(i) != shape[i]) {
      return false;
    }
  }
  return true;
}

// One log line per role, so that a swap shows as two lines that mirror each other.
void log_role(const char* role, size_t index, const Tensor& tensor, ScalarType type,
              const int32_t (&shape)[4]) {
  char actual[96];
  shape_text(tensor, actual, sizeof actual);
  ET_LOG(Error, "grid-sampler delegate: %s (argument %zu): expected %s [%d, %d, %d, %d], got %s %s",
         role, index, dtype_name(type), shape[0], shape[1], shape[2], shape[3],
         dtype_name(tensor.scalar_type()), actual);
}

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
        (error = plan_of(handle->blob, &handle->plan)) != nullptr) {
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
    const ScalarType grid_type = scalar_type_of(blob.grid);
    if (!matches(image, image_type, blob.image_shape) ||
        !matches(grid, grid_type, blob.grid_shape)) {
      log_role("image", blob.image_index, image, image_type, blob.image_shape);
      log_role("grid", blob.grid_index, grid, grid_type, blob.grid_shape);
      ET_LOG(Error,
             "grid-sampler delegate: its arguments differ from the image and grid it was built "
             "for; export the program again");
      return Error::InvalidArgument;
    }
    const int32_t output_shape[4] = {blob.image_shape[0], blob.image_shape[1],
                                     blob.grid_shape[1], blob.grid_shape[2]};
    const ScalarType output_type = scalar_type_of(blob.output);
    if (!matches(output, output_type, output_shape)) {
      log_role("output", inputs, output, output_type, output_shape);
      return Error::InvalidArgument;
    }
    DelegateEvent event(context.event_tracer());
    if (!blob.image.present) {
      grid_sample_f32(view_of(image, image.const_data_ptr<float>()),
                      view_of(grid, grid.const_data_ptr<float>()),
                      view_of(output, output.mutable_data_ptr<float>()), blob.params);
    } else if (grid_type == ScalarType::Short) {
      run(view_of(image, image.const_data_ptr<int8_t>()),
          view_of(grid, grid.const_data_ptr<int16_t>()), output, handle->plan);
    } else {
      run(view_of(image, image.const_data_ptr<int8_t>()),
          view_of(grid, grid.const_data_ptr<int8_t>()), output, handle->plan);
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
