// The grid-sampler backend inside the ExecuTorch runtime: validates the delegate blob at init and
// runs the CPU kernel at execute, honouring each tensor's dim order through its strides.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/platform/log.h>

#include "delegate_format.h"
#include "grid_sample.h"
#include "native_api.h"

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

class GridSamplerBackend final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec> /*compile_specs*/) const override {
    DelegateBlob* blob = context.get_runtime_allocator()->allocateInstance<DelegateBlob>();
    if (blob == nullptr) {
      return Error::MemoryAllocationFailed;
    }
    const char* error = nullptr;
    if (!parse_delegate_blob(processed->data(), processed->size(), blob, &error)) {
      ET_LOG(Error, "%s", error);
      return Error::DelegateInvalidCompatibility;
    }
    if (blob->image.present || blob->grid.present || blob->output.present) {
      ET_LOG(Error, "grid-sampler delegate: quantized grid sampling is not implemented yet");
      return Error::NotSupported;
    }
    processed->Free();
    return blob;
  }

  Error execute(BackendExecutionContext& /*context*/, DelegateHandle* handle,
                Span<EValue*> args) const override {
    const auto* blob = static_cast<const DelegateBlob*>(handle);
    if (args.size() != 3 || !args[0]->isTensor() || !args[1]->isTensor() || !args[2]->isTensor()) {
      ET_LOG(Error, "grid-sampler delegate: expected image, grid and output tensors");
      return Error::InvalidArgument;
    }
    const Tensor& image = args[0]->toTensor();
    const Tensor& grid = args[1]->toTensor();
    const Tensor& output = args[2]->toTensor();
    if (!has_shape(image, blob->image_shape) || !has_shape(grid, blob->grid_shape) ||
        output.dim() != 4 || output.size(0) != image.size(0) || output.size(1) != image.size(1) ||
        output.size(2) != grid.size(1) || output.size(3) != grid.size(2)) {
      ET_LOG(Error, "grid-sampler delegate: tensor shapes differ from the ones it was built for");
      return Error::InvalidArgument;
    }
    if (image.scalar_type() != ScalarType::Float || grid.scalar_type() != ScalarType::Float ||
        output.scalar_type() != ScalarType::Float) {
      ET_LOG(Error, "grid-sampler delegate: expected float32 tensors");
      return Error::InvalidArgument;
    }
    grid_sample_f32(view_of(image, image.const_data_ptr<float>()),
                    view_of(grid, grid.const_data_ptr<float>()),
                    view_of(output, output.mutable_data_ptr<float>()), blob->params);
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
