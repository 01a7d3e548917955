// A standalone driver of the integer kernel, for tests that run it where Python cannot: built for
// AArch64 with quantized.cpp and quantized_neon.cpp and run under qemu-user by test_neon_qemu.py
// (its Python side, neon_qemu.py, writes the requests and reads the replies).
//
// stdin: messages, each a tag byte then little-endian fields:
//   'T' a tensor: u32 id, u64 byte count, the bytes (element 0 first). The driver places it so
//       that an unreadable page follows its last byte (and precedes its first page): a kernel
//       that reads outside it crashes the driver.
//   'C' a case: i32 mode, padding, align_corners, grid_is_int8, float_output, isa (1 scalar,
//       4 neon, 0 auto), rows_per_call (0: all rows in one call); three quantization parameters
//       (image, grid, output: f64 scale, i32 zero point, quant_min, quant_max); u32 image id,
//       i64 sizes[4], strides[4]; u32 grid id, i64 sizes[4], strides[4]; i64 output strides[4].
//   'R' a probe of the guard: u32 tensor id, i64 k; reads the tensor's byte k bytes past its last
//       (k = 1: the unreadable page, a crash) and replies with i32 0 and that byte (i8).
// stdout, per case: i32 status (0 ok). Ok: u64 byte count and the output's bytes (element 0 to
//   its last), u32 counter count and the u64 NEON counters this case added (quantized_neon.h;
//   none off AArch64). Not ok: u32 length and the message.
// Exit status 0 after the last message; 2 on a malformed stream, with the reason on stderr.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "quantized.h"
#if defined(__aarch64__)
#include "quantized_neon.h"
#endif

namespace {

using namespace etkit::gridsampler;

#if defined(__aarch64__)
constexpr uint32_t kCounters = kNeonCounterCount;
#else
constexpr uint32_t kCounters = 0;
#endif
constexpr uint32_t kCounterSlots = kCounters > 0 ? kCounters : 1;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "quantized_driver: %s\n", why.c_str());
  std::exit(2);
}

void read_exact(void* data, size_t size, const char* what) {
  if (size > 0 && std::fread(data, 1, size, stdin) != size) {
    fail(std::string("truncated input while reading ") + what);
  }
}

template <typename T>
T read_value(const char* what) {
  T value;
  read_exact(&value, sizeof value, what);
  return value;
}

void write_exact(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, stdout) != size) {
    fail("cannot write the reply");
  }
}

template <typename T>
void write_value(T value) {
  write_exact(&value, sizeof value);
}

// Bytes between two unreadable pages, the last byte right before the second.
class Guarded {
 public:
  explicit Guarded(uint64_t size) : size_(size) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t body = (size + page - 1) / page * page;
    total_ = body + 2 * page;
    void* base = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      fail("mmap failed");
    }
    base_ = static_cast<uint8_t*>(base);
    if (mprotect(base_, page, PROT_NONE) != 0 ||
        mprotect(base_ + page + body, page, PROT_NONE) != 0) {
      fail("mprotect failed");
    }
    data_ = base_ + page + body - size;
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, total_); }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_, total_;
  uint8_t* base_;
  uint8_t* data_;
};

struct Tensor {
  std::vector<int64_t> sizes, strides;
};

QuantParams read_qparams() {
  QuantParams q;
  q.scale = read_value<double>("a scale");
  q.zero_point = read_value<int32_t>("a zero point");
  q.quant_min = read_value<int32_t>("quant_min");
  q.quant_max = read_value<int32_t>("quant_max");
  return q;
}

// Elements from element 0 to the last one the sizes and strides reach, plus one.
uint64_t reach(const int64_t* sizes, const int64_t* strides) {
  uint64_t last = 0;
  for (int d = 0; d < 4; ++d) {
    last += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
  }
  return last + 1;
}

// Why a tensor's sizes and strides do not fit its bytes, or an empty string.
std::string check_tensor(const char* name, const int64_t* sizes, const int64_t* strides,
                         size_t element_size, const Guarded& bytes) {
  for (int d = 0; d < 4; ++d) {
    if (sizes[d] < 1 || sizes[d] > (int64_t(1) << 31) || strides[d] < 0 ||
        strides[d] > (int64_t(1) << 40)) {
      return std::string(name) + ": sizes must be 1 .. 2^31 and strides 0 .. 2^40";
    }
  }
  if (reach(sizes, strides) * element_size > bytes.size()) {
    return std::string(name) + ": its sizes and strides reach past its " +
           std::to_string(bytes.size()) + " bytes";
  }
  return "";
}

template <typename GridT, typename OutT>
void run(const View4<const int8_t>& image, const View4<const GridT>& grid, const View4<OutT>& out,
         const QuantizedPlan& plan, int64_t rows_per_call, Isa isa) {
  const int64_t rows = grid.sizes[0] * grid.sizes[1];
  const int64_t step = rows_per_call > 0 ? rows_per_call : rows;
  for (int64_t begin = 0; begin < rows; begin += step) {
    grid_sample_quantized(image, grid, out, plan, begin, std::min(rows, begin + step), isa);
  }
}

void reply_error(const std::string& message) {
  write_value<int32_t>(1);
  write_value<uint32_t>(static_cast<uint32_t>(message.size()));
  write_exact(message.data(), message.size());
}

void run_case(const std::map<uint32_t, Guarded*>& tensors) {
  int32_t fields[7];
  for (int32_t& field : fields) {
    field = read_value<int32_t>("the case's fields");
  }
  const auto [mode, padding, align_corners, grid_is_int8, float_output, isa, rows_per_call] =
      fields;
  const QuantParams image_q = read_qparams(), grid_q = read_qparams(), output_q = read_qparams();
  const uint32_t image_id = read_value<uint32_t>("the image id");
  int64_t image_sizes[4], image_strides[4], grid_sizes[4], grid_strides[4], output_strides[4];
  read_exact(image_sizes, sizeof image_sizes, "the image sizes");
  read_exact(image_strides, sizeof image_strides, "the image strides");
  const uint32_t grid_id = read_value<uint32_t>("the grid id");
  read_exact(grid_sizes, sizeof grid_sizes, "the grid sizes");
  read_exact(grid_strides, sizeof grid_strides, "the grid strides");
  read_exact(output_strides, sizeof output_strides, "the output strides");

  if (tensors.count(image_id) == 0 || tensors.count(grid_id) == 0) {
    return reply_error("the image or grid id names no tensor sent before");
  }
  if (mode < 0 || mode > 1 || padding < 0 || padding > 2 || rows_per_call < 0) {
    return reply_error("mode must be 0 or 1, padding 0 .. 2, rows_per_call at least 0");
  }
  if (isa < 0 || isa > 4 || !cpu_supports(static_cast<Isa>(isa))) {
    return reply_error("this CPU does not support instruction set " + std::to_string(isa));
  }
  if (grid_sizes[3] != 2 || grid_sizes[0] != image_sizes[0]) {
    return reply_error("grid must be N x Ho x Wo x 2 with the image's N");
  }
  const Guarded& image_bytes = *tensors.at(image_id);
  const Guarded& grid_bytes = *tensors.at(grid_id);
  std::string why = check_tensor("image", image_sizes, image_strides, 1, image_bytes);
  if (why.empty()) {
    why = check_tensor("grid", grid_sizes, grid_strides, grid_is_int8 ? 1 : 2, grid_bytes);
  }
  if (!why.empty()) {
    return reply_error(why);
  }
  QuantizedPlan plan;
  const SampleParams params{static_cast<Mode>(mode), static_cast<Padding>(padding),
                            align_corners != 0};
  if (const char* error = plan_quantized(
          params, image_q, grid_q, grid_is_int8 ? GridType::kInt8 : GridType::kInt16,
          float_output != 0, output_q, image_sizes[2], image_sizes[3], &plan)) {
    return reply_error(error);
  }
  const int64_t output_sizes[4] = {image_sizes[0], image_sizes[1], grid_sizes[1], grid_sizes[2]};
  for (int d = 0; d < 4; ++d) {
    if (output_strides[d] < 0 || output_strides[d] > (int64_t(1) << 40)) {
      return reply_error("output strides must be 0 .. 2^40");
    }
  }
  const size_t element_size = float_output ? sizeof(float) : 1;
  std::vector<uint8_t> output(reach(output_sizes, output_strides) * element_size, 0x5A);

  View4<const int8_t> image{reinterpret_cast<const int8_t*>(image_bytes.data()), {}, {}};
  for (int d = 0; d < 4; ++d) {
    image.sizes[d] = image_sizes[d];
    image.strides[d] = image_strides[d];
  }
  const auto view = [&](auto* data, const int64_t* sizes, const int64_t* strides) {
    using T = std::remove_pointer_t<decltype(data)>;
    View4<T> v{data, {}, {}};
    for (int d = 0; d < 4; ++d) {
      v.sizes[d] = sizes[d];
      v.strides[d] = strides[d];
    }
    return v;
  };
  uint64_t before[kCounterSlots] = {};
  uint64_t after[kCounterSlots] = {};
#if defined(__aarch64__)
  neon_counters(before);
#endif
  const auto grid_data = grid_bytes.data();
  const Isa which = static_cast<Isa>(isa);
  if (grid_is_int8) {
    const auto g = view(reinterpret_cast<const int8_t*>(grid_data), grid_sizes, grid_strides);
    if (float_output) {
      run(image, g, view(reinterpret_cast<float*>(output.data()), output_sizes, output_strides),
          plan, rows_per_call, which);
    } else {
      run(image, g, view(reinterpret_cast<int8_t*>(output.data()), output_sizes, output_strides),
          plan, rows_per_call, which);
    }
  } else {
    const auto g = view(reinterpret_cast<const int16_t*>(grid_data), grid_sizes, grid_strides);
    if (float_output) {
      run(image, g, view(reinterpret_cast<float*>(output.data()), output_sizes, output_strides),
          plan, rows_per_call, which);
    } else {
      run(image, g, view(reinterpret_cast<int8_t*>(output.data()), output_sizes, output_strides),
          plan, rows_per_call, which);
    }
  }
#if defined(__aarch64__)
  neon_counters(after);
#endif
  write_value<int32_t>(0);
  write_value<uint64_t>(output.size());
  write_exact(output.data(), output.size());
  write_value<uint32_t>(kCounters);
  for (uint32_t k = 0; k < kCounters; ++k) {
    write_value<uint64_t>(after[k] - before[k]);
  }
}

}  // namespace

int main() {
  std::map<uint32_t, Guarded*> tensors;
  for (int tag; (tag = std::fgetc(stdin)) != EOF;) {
    if (tag == 'T') {
      const uint32_t id = read_value<uint32_t>("a tensor id");
      const uint64_t size = read_value<uint64_t>("a tensor size");
      if (size == 0 || size > (uint64_t(1) << 34)) {
        fail("a tensor must hold 1 byte to 16 GiB");
      }
      auto* bytes = new Guarded(size);
      read_exact(bytes->data(), size, "a tensor's bytes");
      delete tensors[id];
      tensors[id] = bytes;
    } else if (tag == 'C') {
      run_case(tensors);
      std::fflush(stdout);
    } else if (tag == 'R') {
      const uint32_t id = read_value<uint32_t>("a tensor id");
      const int64_t past = read_value<int64_t>("an offset");
      if (tensors.count(id) == 0) {
        fail("the probe's id names no tensor sent before");
      }
      const Guarded& bytes = *tensors[id];
      const volatile uint8_t* const last = bytes.data() + bytes.size() - 1;
      write_value<int32_t>(0);
      write_value<int8_t>(static_cast<int8_t>(last[past]));
      std::fflush(stdout);
    } else {
      fail("unknown message tag " + std::to_string(tag) + " (expected 'T', 'C' or 'R')");
    }
  }
  for (auto& [id, bytes] : tensors) {
    delete bytes;
  }
  return 0;
}
