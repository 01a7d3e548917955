#include "native_api.h"

#include <Python.h>

#include "delegate_format.h"
#include "grid_sample.h"

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

}  // namespace

extern "C" int etkit_gridsampler_grid_sample_f32(
    const float* image, const int64_t* image_sizes, const int64_t* image_strides,
    const float* grid, const int64_t* grid_sizes, const int64_t* grid_strides, float* output,
    const int64_t* output_strides, int mode, int padding, int align_corners) {
  using namespace etkit::gridsampler;
  if (mode < 0 || mode > 1 || padding < 0 || padding > 2 || grid_sizes[3] != 2 ||
      grid_sizes[0] != image_sizes[0]) {
    return 1;
  }
  const int64_t output_sizes[4] = {image_sizes[0], image_sizes[1], grid_sizes[1], grid_sizes[2]};
  grid_sample_f32(make_view(image, image_sizes, image_strides),
                  make_view(grid, grid_sizes, grid_strides),
                  make_view(output, output_sizes, output_strides),
                  {static_cast<Mode>(mode), static_cast<Padding>(padding), align_corners != 0});
  return 0;
}

extern "C" int etkit_gridsampler_validate_blob(const void* data, uint64_t size,
                                                const char** error) {
  etkit::gridsampler::DelegateBlob blob;
  return etkit::gridsampler::parse_delegate_blob(data, size, &blob, error) ? 0 : 1;
}

// The library is also a (trivial) Python extension module, so that importlib finds it in regular
// and editable installs alike; Python code calls it through ctypes.
static PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "_native",
                                    "etkit-gridsampler native library (used through ctypes)", -1,
                                    nullptr};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
