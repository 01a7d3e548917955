// The grid-sampler backend inside the ExecuTorch runtime: validates the delegate blob at init and
// runs the CPU kernel at execute, honouring each tensor's dim order through its strides.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/platform/log.h>

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

bool has_shape(const Tensor& tensor, const int32_t (&shape)[4]) {
  if (tensor.dim() != 4) {
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    if (tensor.size(i) != shape[i]) {
      return false;
    }
  }
  return true;
}

struct Handle {
  DelegateBlob blob;
  QuantizedPlan plan;
};

QuantParams quant_params(const QParamsRecord& record) {
  return {record.scale, record.zero_point, record.quant_min, record.quant_max};
}

// The plan of a quantized blob (nothing for a float one), or why the runtime refuses it.
const char* plan_of(const DelegateBlob& blob, QuantizedPlan* plan) {
  const bool any = blob.image.present || blob.grid.present || blob.output.present;
  if (!any) {
    return nullptr;
  }
  if (!blob.image.present || blob.image.dtype != DType::kInt8 || !blob.grid.present ||
      (blob.grid.dtype != DType::kInt16 && blob.grid.dtype != DType::kInt8) ||
      (blob.output.present && blob.output.dtype != DType::kInt8)) {
    return "grid-sampler delegate: unsupported quantization (needs an int8 image, an int16 or "
           "int8 grid, an int8 or float output)";
  }
  return plan_quantized(blob.params, quant_params(blob.image), quant_params(blob.grid),
                        blob.grid.dtype == DType::kInt16 ? GridType::kInt16 : GridType::kInt8,
                        !blob.output.present, quant_params(blob.output), blob.image_shape[2],
                        blob.image_shape[3], plan);
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

  Error execute(BackendExecutionContext& /*context*/, DelegateHandle* raw_handle,
                Span<EValue*> args) const override {
    const auto* handle = static_cast<const Handle*>(raw_handle);
    if (args.size() != 3 || !args[0]->isTensor() || !args[1]->isTensor() || !args[2]->isTensor()) {
      ET_LOG(Error, "grid-sampler delegate: expected image, grid and output tensors");
      return Error::InvalidArgument;
    }
    const Tensor& image = args[0]->toTensor();
    const Tensor& grid = args[1]->toTensor();
    const Tensor& output = args[2]->toTensor();
    if (!has_shape(image, handle->blob.image_shape) || !has_shape(grid, handle->blob.grid_shape) ||
        output.dim() != 4 || output.size(0) != image.size(0) || output.size(1) != image.size(1) ||
        output.size(2) != grid.size(1) || output.size(3) != grid.size(2)) {
      ET_LOG(Error, "grid-sampler delegate: tensor shapes differ from the ones it was built for");
      return Error::InvalidArgument;
    }
    const DelegateBlob& blob = handle->blob;
    if (!blob.image.present) {
      if (image.scalar_type() != ScalarType::Float || grid.scalar_type() != ScalarType::Float ||
          output.scalar_type() != ScalarType::Float) {
        ET_LOG(Error, "grid-sampler delegate: expected float32 tensors");
        return Error::InvalidArgument;
      }
      grid_sample_f32(view_of(image, image.const_data_ptr<float>()),
                      view_of(grid, grid.const_data_ptr<float>()),
                      view_of(output, output.mutable_data_ptr<float>()), blob.params);
      return Error::Ok;
    }
    const bool grid_int16 = blob.grid.dtype == DType::kInt16;
    const ScalarType grid_type = grid_int16 ? ScalarType::Short : ScalarType::Char;
    const ScalarType output_type = blob.output.present ? ScalarType::Char : ScalarType::Float;
    if (image.scalar_type() != ScalarType::Char || grid.scalar_type() != grid_type ||
        output.scalar_type() != output_type) {
      ET_LOG(Error, "grid-sampler delegate: tensor dtypes differ from the ones it was built for");
      return Error::InvalidArgument;
    }
    const auto image_view = view_of(image, image.const_data_ptr<int8_t>());
    if (grid_int16) {
      run(image_view, view_of(grid, grid.const_data_ptr<int16_t>()), output, handle->plan);
    } else {
      run(image_view, view_of(grid, grid.const_data_ptr<int8_t>()), output, handle->plan);
    }
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
