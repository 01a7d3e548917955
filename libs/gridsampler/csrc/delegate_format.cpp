#include "delegate_format.h"

#include <cmath>
#include <cstring>

namespace etkit::gridsampler {
namespace {

// CRC-32 (IEEE 802.3, the polynomial of zlib.crc32), bitwise: the blob is 120 bytes.
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

bool read_qparams(const uint8_t* data, size_t offset, QParamsRecord* out, const char** error) {
  out->present = data[offset] != 0;
  const uint8_t dtype = data[offset + 1];
  if (data[offset] > 1 || dtype > static_cast<uint8_t>(DType::kUInt8)) {
    *error = "grid-sampler delegate blob: invalid quantization record";
    return false;
  }
  out->dtype = static_cast<DType>(dtype);
  out->zero_point = read<int32_t>(data, offset + 4);
  out->quant_min = read<int32_t>(data, offset + 8);
  out->quant_max = read<int32_t>(data, offset + 12);
  out->scale = read<double>(data, offset + 16);
  if (out->present &&
      (!(out->scale > 0.0) || !std::isfinite(out->scale) || out->quant_min > out->quant_max ||
       out->zero_point < out->quant_min || out->zero_point > out->quant_max)) {
    *error = "grid-sampler delegate blob: invalid scale, zero point or range";
    return false;
  }
  return true;
}

}  // namespace

bool parse_delegate_blob(const void* data_in, size_t size, DelegateBlob* out, const char** error) {
  const auto* data = static_cast<const uint8_t*>(data_in);
  if (data == nullptr || size < 8) {
    *error = "grid-sampler delegate blob: truncated (shorter than its header)";
    return false;
  }
  if (read<uint32_t>(data, 0) != kBlobMagic) {
    *error = "grid-sampler delegate blob: bad magic (not an etkit grid-sampler blob)";
    return false;
  }
  const uint16_t version = read<uint16_t>(data, 4);
  if (version > kBlobVersion) {
    *error = "grid-sampler delegate blob: format version newer than this runtime; update etkit-gridsampler";
    return false;
  }
  if (version != kBlobVersion || read<uint16_t>(data, 6) != kBlobSize || size < kBlobSize) {
    *error = "grid-sampler delegate blob: truncated or unknown layout";
    return false;
  }
  if (crc32(data, kBlobSize - 4) != read<uint32_t>(data, kBlobSize - 4)) {
    *error = "grid-sampler delegate blob: checksum mismatch (corrupt)";
    return false;
  }
  if (data[8] > 1 || data[9] > 2 || data[10] > 1) {
    *error = "grid-sampler delegate blob: invalid mode, padding or align_corners";
    return false;
  }
  out->params = {static_cast<Mode>(data[8]), static_cast<Padding>(data[9]), data[10] != 0};
  if (!read_qparams(data, 12, &out->image, error) || !read_qparams(data, 36, &out->grid, error) ||
      !read_qparams(data, 60, &out->output, error)) {
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    out->image_shape[i] = read<int32_t>(data, 84 + 4 * i);
    out->grid_shape[i] = read<int32_t>(data, 100 + 4 * i);
    if (out->image_shape[i] < 1 || out->grid_shape[i] < 1) {
      *error = "grid-sampler delegate blob: non-positive shape";
      return false;
    }
  }
  if (out->grid_shape[3] != 2 || out->grid_shape[0] != out->image_shape[0]) {
    *error = "grid-sampler delegate blob: grid shape must be N x Ho x Wo x 2 with the image's N";
    return false;
  }
  return true;
}

}  // namespace etkit::gridsampler
