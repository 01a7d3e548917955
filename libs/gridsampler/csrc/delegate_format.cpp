#include "delegate_format.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace etkit::gridsampler {
namespace {

constexpr int64_t kMaxDimension = int64_t{1} << 24;
constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;
constexpr double kMinScale = 1e-12;
constexpr double kMaxScale = 1e12;
constexpr size_t kRecordSize = 24;
constexpr size_t kImageRecord = 16, kGridRecord = 40, kOutputRecord = 64;
constexpr size_t kImageShape = 88, kGridShape = 104;
constexpr size_t kDynamicFlags = 120, kImageLower = 124, kGridLower = 140;  // version 3
constexpr const char* kImageDimensions[4] = {"N", "C", "H", "W"};
constexpr const char* kGridDimensions[4] = {"N", "Ho", "Wo", "last dimension"};

// The messages carry the values read, so they are formatted; each thread keeps its last one for
// the caller to log or copy (init logs it at once; the C API's caller copies it).
thread_local char message[320];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
bool fail(const char** error, const char* format, ...) {
  constexpr char kPrefix[] = "grid-sampler delegate blob: ";
  std::memcpy(message, kPrefix, sizeof kPrefix);
  va_list args;
  va_start(args, format);
  std::vsnprintf(message + sizeof kPrefix - 1, sizeof message - (sizeof kPrefix - 1), format, args);
  va_end(args);
  *error = message;
  return false;
}

// CRC-32 (IEEE 802.3, the polynomial of zlib.crc32), bitwise: the blob is 124 or 160 bytes.
uint32_t crc32(const uint8_t* data, size_t size) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

template <typename T>
T read(const uint8_t* data, size_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof(T));  // the format is little-endian, as the hosts
  return value;
}

struct DTypeRange {
  const char* name;
  int32_t low, high;
};

DTypeRange range_of(DType dtype) {
  return dtype == DType::kInt8 ? DTypeRange{"int8", -128, 127} : DTypeRange{"int16", -32768, 32767};
}

// Rules 17a to 17k for the record of `role` at `offset`.
bool read_record(const uint8_t* data, size_t offset, const char* role, QParamsRecord* out,
                 const char** error) {
  const uint8_t present = data[offset];
  if (present > 1) {
    return fail(error,
                "%s quantization record: present flag %u, must be 0 (float32) or 1 (quantized)",
                role, present);
  }
  if (present == 0) {
    for (size_t i = 1; i < kRecordSize; ++i) {
      if (data[offset + i] != 0) {
        return fail(error, "%s quantization record: absent (float32) but not all zero", role);
      }
    }
    *out = {false, DType::kFloat32, 0, 0, 0, 0.0};
    return true;
  }
  const uint8_t dtype = data[offset + 1];
  const bool is_grid = std::strcmp(role, "grid") == 0;
  if (dtype != 1 && !(is_grid && dtype == 2)) {
    return fail(error, "%s quantization record: dtype code %u, must be %s", role, dtype,
                is_grid ? "1 (int8) or 2 (int16)" : "1 (int8)");
  }
  if (data[offset + 2] != 0 || data[offset + 3] != 0) {
    return fail(error, "%s quantization record: reserved bytes are not zero", role);
  }
  out->present = true;
  out->dtype = static_cast<DType>(dtype);
  out->zero_point = read<int32_t>(data, offset + 4);
  out->quant_min = read<int32_t>(data, offset + 8);
  out->quant_max = read<int32_t>(data, offset + 12);
  out->scale = read<double>(data, offset + 16);
  const DTypeRange range = range_of(out->dtype);
  if (out->quant_min < range.low || out->quant_min > range.high) {
    return fail(error, "%s quantization record: quant_min %d outside %s's range [%d, %d]", role,
                out->quant_min, range.name, range.low, range.high);
  }
  if (out->quant_max < range.low || out->quant_max > range.high) {
    return fail(error, "%s quantization record: quant_max %d outside %s's range [%d, %d]", role,
                out->quant_max, range.name, range.low, range.high);
  }
  if (out->quant_min > out->quant_max) {
    return fail(error, "%s quantization record: quant_min %d greater than quant_max %d", role,
                out->quant_min, out->quant_max);
  }
  if (out->zero_point < out->quant_min || out->zero_point > out->quant_max) {
    return fail(error,
                "%s quantization record: zero point %d outside [quant_min, quant_max] = [%d, %d]",
                role, out->zero_point, out->quant_min, out->quant_max);
  }
  if (!std::isfinite(out->scale)) {
    return fail(error, "%s quantization record: scale is not finite", role);
  }
  if (!(out->scale >= kMinScale && out->scale <= kMaxScale)) {
    return fail(error, "%s quantization record: scale %g outside [1e-12, 1e+12]", role,
                out->scale);
  }
  if (static_cast<double>(static_cast<float>(out->scale)) != out->scale) {
    return fail(error, "%s quantization record: scale %.17g is not a float32 value", role,
                out->scale);
  }
  return true;
}

bool elements_exceed(const int64_t (&shape)[4]) {
  int64_t count = 1;
  for (int64_t dimension : shape) {
    count *= dimension;  // each dimension <= 2^24 and count <= 2^31 before: no overflow
    if (count > kMaxElements) {
      return true;
    }
  }
  return false;
}

bool dimensions_in_range(const int32_t (&shape)[4]) {
  for (int32_t dimension : shape) {
    if (dimension < 1 || dimension > kMaxDimension) {
      return false;
    }
  }
  return true;
}

#define ETKIT_SHAPE_FORMAT "[%d, %d, %d, %d]"
#define ETKIT_SHAPE_ARGS(s) (s)[0], (s)[1], (s)[2], (s)[3]

// Rules 31 and 32 for one dimension.
bool check_lower_bound(const char* role, const char* name, bool dynamic, int32_t lower,
                       int32_t upper, const char** error) {
  if (!dynamic && lower != upper) {
    return fail(error, "%s %s is fixed at %d but its lower bound is %d", role, name, upper, lower);
  }
  if (dynamic && !(lower >= 1 && lower < upper)) {
    return fail(error,
                "%s %s is dynamic with bounds [%d, %d]: the lower bound must be at least 1 and "
                "below the upper bound",
                role, name, lower, upper);
  }
  return true;
}

// Rules 28 to 34 (version 3): the dynamic dimensions and the lower bounds, into `out`.
bool read_bounds(const uint8_t* data, DelegateBlob* out, const char** error) {
  const unsigned flags = data[kDynamicFlags];
  if (flags & 0x80u) {  // rule 28
    return fail(error,
                "dynamic dimension flags 0x%02x: bit 7 must be 0 (the grid's last dimension is "
                "always 2)",
                flags);
  }
  if (data[kDynamicFlags + 1] != 0 || data[kDynamicFlags + 2] != 0 ||
      data[kDynamicFlags + 3] != 0) {  // rule 29
    return fail(error, "reserved bytes 121 to 123 are not zero");
  }
  if (flags == 0) {  // rule 30
    return fail(error,
                "format version 3 with no dynamic dimension: fixed shapes are written as format "
                "version 2");
  }
  int32_t* image_lower = out->image_min_shape;
  int32_t* grid_lower = out->grid_min_shape;
  for (int i = 0; i < 4; ++i) {
    image_lower[i] = read<int32_t>(data, kImageLower + 4 * i);
    grid_lower[i] = read<int32_t>(data, kGridLower + 4 * i);
  }
  for (int i = 0; i < 4; ++i) {  // rule 31
    if (!check_lower_bound("image", kImageDimensions[i], (flags >> i) & 1u, image_lower[i],
                           out->image_shape[i], error)) {
      return false;
    }
  }
  for (int i = 0; i < 4; ++i) {  // rule 32
    const bool dynamic = i < 3 && ((flags >> (4 + i)) & 1u);
    if (!check_lower_bound("grid", kGridDimensions[i], dynamic, grid_lower[i], out->grid_shape[i],
                           error)) {
      return false;
    }
  }
  if (grid_lower[0] != image_lower[0]) {  // rule 33
    return fail(error, "grid N bounds [%d, %d] differ from the image's N bounds [%d, %d]",
                grid_lower[0], out->grid_shape[0], image_lower[0], out->image_shape[0]);
  }
  if (out->input_count == 1 &&
      std::memcmp(image_lower, grid_lower, sizeof(int32_t) * 4) != 0) {  // rule 34
    return fail(error,
                "image and grid are one tensor (input count 1) but the blob gives them different "
                "bounds");
  }
  out->dynamic = true;
  return true;
}

}  // namespace

bool parse_delegate_blob(const void* data_in, size_t size, DelegateBlob* out, const char** error) {
  const auto* data = static_cast<const uint8_t*>(data_in);
  if (data == nullptr || size < 8) {  // rule 1
    return fail(error, "truncated: %zu bytes, shorter than the 8-byte header",
                data == nullptr ? size_t{0} : size);
  }
  if (read<uint32_t>(data, 0) != kBlobMagic) {  // rule 2
    return fail(error, "bad magic: not an etkit grid-sampler blob");
  }
  const unsigned version = read<uint16_t>(data, 4);
  if (version > kBlobVersion) {  // rule 3
    return fail(error,
                "format version %u is newer than this reader's %u: update etkit-gridsampler",
                version, unsigned{kBlobVersion});
  }
  if (version < kFixedBlobVersion) {  // rule 4
    return fail(error,
                "format version %u is no longer read (it did not record which argument is the "
                "image): export the program again with this etkit-gridsampler",
                version);
  }
  const unsigned size_field = read<uint16_t>(data, 6);
  const size_t expected_size = version == kFixedBlobVersion ? kBlobSize : kDynamicBlobSize;
  if (size_field != expected_size) {  // rule 5
    return fail(error, "size field %u, expected %zu for format version %u", size_field,
                expected_size, version);
  }
  if (size < expected_size) {  // rule 6
    return fail(error, "truncated: %zu bytes, expected %zu", size, expected_size);
  }
  if (size > expected_size) {
    return fail(error, "%zu bytes, expected %zu (extra bytes after the blob)", size,
                expected_size);
  }
  const size_t crc_offset = expected_size - 4;
  if (crc32(data, crc_offset) != read<uint32_t>(data, crc_offset)) {  // rule 7
    return fail(error, "checksum mismatch: the blob is corrupt");
  }
  const unsigned mode = data[8], padding = data[9], align = data[10];
  if (mode > 1) {  // rule 8
    return fail(error, "mode code %u, must be 0 (bilinear) or 1 (nearest)", mode);
  }
  if (padding > 2) {  // rule 9
    return fail(error, "padding code %u, must be 0 (zeros), 1 (border) or 2 (reflection)",
                padding);
  }
  if (align > 1) {  // rule 10
    return fail(error, "align_corners %u, must be 0 or 1", align);
  }
  if (data[11] != 0) {  // rule 11
    return fail(error, "reserved byte 11 is %u, must be 0", unsigned{data[11]});
  }
  const unsigned inputs = data[12], image_index = data[13], grid_index = data[14];
  if (inputs < 1 || inputs > 2) {  // rule 12
    return fail(error, "input count %u, must be 1 (image and grid are one tensor) or 2", inputs);
  }
  if (image_index >= inputs) {  // rule 13
    return fail(error, "image argument index %u, must be below the input count %u", image_index,
                inputs);
  }
  if (grid_index >= inputs) {  // rule 14
    return fail(error, "grid argument index %u, must be below the input count %u", grid_index,
                inputs);
  }
  if (inputs == 2 && image_index == grid_index) {  // rule 15
    return fail(error,
                "image and grid argument indices are both %u; with 2 inputs they must differ",
                image_index);
  }
  if (data[15] > 1) {  // rule 16
    return fail(error,
                "grid arrival code %u, must be 0 (as its record says) or 1 (float32, quantized "
                "on entry)",
                unsigned{data[15]});
  }
  out->quantizes_grid = data[15] == 1;
  out->params = {static_cast<Mode>(mode), static_cast<Padding>(padding), align != 0};
  out->input_count = static_cast<uint8_t>(inputs);
  out->image_index = static_cast<uint8_t>(image_index);
  out->grid_index = static_cast<uint8_t>(grid_index);
  if (!read_record(data, kImageRecord, "image", &out->image, error) ||  // rule 17
      !read_record(data, kGridRecord, "grid", &out->grid, error) ||
      !read_record(data, kOutputRecord, "output", &out->output, error)) {
    return false;
  }
  if (out->image.present != out->grid.present) {  // rule 18
    return fail(error, "image and grid must both be quantized or both float32");
  }
  if (out->output.present && !out->image.present) {  // rule 19
    return fail(error, "a quantized output needs a quantized image and grid");
  }
  int32_t* image = out->image_shape;
  int32_t* grid = out->grid_shape;
  for (int i = 0; i < 4; ++i) {
    image[i] = read<int32_t>(data, kImageShape + 4 * i);
    grid[i] = read<int32_t>(data, kGridShape + 4 * i);
  }
  if (!dimensions_in_range(out->image_shape)) {  // rule 20
    return fail(error, "image shape " ETKIT_SHAPE_FORMAT ": every dimension must be in [1, %lld]",
                ETKIT_SHAPE_ARGS(image), static_cast<long long>(kMaxDimension));
  }
  if (elements_exceed({image[0], image[1], image[2], image[3]})) {  // rule 21
    return fail(error, "image shape " ETKIT_SHAPE_FORMAT ": more than %lld elements",
                ETKIT_SHAPE_ARGS(image), static_cast<long long>(kMaxElements));
  }
  if (!dimensions_in_range(out->grid_shape)) {  // rule 22
    return fail(error, "grid shape " ETKIT_SHAPE_FORMAT ": every dimension must be in [1, %lld]",
                ETKIT_SHAPE_ARGS(grid), static_cast<long long>(kMaxDimension));
  }
  if (grid[3] != 2) {  // rule 23
    return fail(error, "grid shape " ETKIT_SHAPE_FORMAT ": last dimension must be 2",
                ETKIT_SHAPE_ARGS(grid));
  }
  if (elements_exceed({grid[0], grid[1], grid[2], grid[3]})) {  // rule 24
    return fail(error, "grid shape " ETKIT_SHAPE_FORMAT ": more than %lld elements",
                ETKIT_SHAPE_ARGS(grid), static_cast<long long>(kMaxElements));
  }
  if (grid[0] != image[0]) {  // rule 25
    return fail(error, "grid N %d differs from the image's N %d", grid[0], image[0]);
  }
  const int32_t output[4] = {image[0], image[1], grid[1], grid[2]};
  if (elements_exceed({output[0], output[1], output[2], output[3]})) {  // rule 26
    return fail(error, "output shape " ETKIT_SHAPE_FORMAT ": more than %lld elements",
                ETKIT_SHAPE_ARGS(output), static_cast<long long>(kMaxElements));
  }
  if (inputs == 1 &&
      (out->image.dtype != out->grid.dtype || std::memcmp(image, grid, sizeof(int32_t) * 4) != 0)) {
    return fail(error,  // rule 27
                "image and grid are one tensor (input count 1) but the blob gives them different "
                "dtypes or shapes");
  }
  out->dynamic = false;
  std::memcpy(out->image_min_shape, image, sizeof out->image_min_shape);
  std::memcpy(out->grid_min_shape, grid, sizeof out->grid_min_shape);
  if (version == kBlobVersion && !read_bounds(data, out, error)) {
    return false;
  }
  if (out->quantizes_grid && (!out->grid.present || inputs != 2)) {  // rule 35
    return fail(error,
                "a grid that arrives as float32 to be quantized (grid arrival code 1) needs a "
                "quantized grid record and an input of its own (input count 2)");
  }
  return true;
}

}  // namespace etkit::gridsampler
