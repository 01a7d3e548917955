#version 450
// The integer grid sampler on Vulkan: docs/contract.md, step by step, with the names and the
// order of csrc/quantized.cpp. One invocation computes one 32-bit word of the output: four int8
// elements, or one float32 element, in the output's memory order.
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Image { uint image_words[]; };   // int8, packed
layout(set = 0, binding = 1) readonly buffer Grid { uint grid_words[]; };     // int16 or int8
layout(set = 0, binding = 2) writeonly buffer Output { uint output_words[]; };
layout(set = 0, binding = 3) readonly buffer Params {
  // the plan (etkit_gridsampler_plan), in its order
  int64_t x_multiplier, x_shift, x_offset, x_size;
  int64_t y_multiplier, y_shift, y_offset, y_size;
  int64_t grid_zero_point, image_zero_point;
  int64_t output_zero_point, output_min, output_max;
  int64_t requant_multiplier, requant_shift, float_output;
  // shapes and layout
  int batch, channels, height, width;
  int out_height, out_width, output_channels_last, grid_is_int8;
  int image_stride_n, image_stride_c, image_stride_y, image_stride_x;
  int mode, padding, align_corners, words_per_row;
  float float_output_scale;
  int total_elements;
} p;

const int COORD_FRAC_BITS = 32;
const int WEIGHT_BITS = 15;
const int64_t ONE = int64_t(1) << COORD_FRAC_BITS;

int64_t shift_round(int64_t x, int64_t k) { return (x + (int64_t(1) << (k - 1))) >> k; }

int64_t shift_round_half_even(int64_t x, int64_t k) {
  int64_t whole = x >> k;
  int64_t rest = x & ((int64_t(1) << k) - 1);
  int64_t halfway = int64_t(1) << (k - 1);
  return whole + ((rest > halfway || (rest == halfway && (whole & 1) != 0)) ? 1 : 0);
}

int read_int8(uint index) { return bitfieldExtract(int(image_words[index >> 2]), int(8 * (index & 3u)), 8); }

int read_grid(uint index) {
  if (p.grid_is_int8 != 0) {
    return bitfieldExtract(int(grid_words[index >> 2]), int(8 * (index & 3u)), 8);
  }
  return bitfieldExtract(int(grid_words[index >> 1]), int(16 * (index & 1u)), 16);
}

// Step 1: a grid value to a fixed-point pixel coordinate (32 fractional bits).
int64_t unnormalize(int64_t grid_value, int64_t multiplier, int64_t shift, int64_t offset) {
  int64_t product = (grid_value - p.grid_zero_point) * multiplier;
  int64_t scaled = shift > 0 ? shift_round(product, shift) : product * (int64_t(1) << -shift);
  return scaled + offset;
}

int64_t clip(int64_t coord, int64_t size) {
  return min(max(coord, int64_t(0)), (size - 1) * ONE);
}

int64_t reflect(int64_t coord, int64_t low, int64_t span) {
  int64_t folded = abs(coord - low) % (2 * span);
  if (folded > span) {
    folded = 2 * span - folded;
  }
  return folded + low;
}

// Step 2: the padding mode.
int64_t apply_padding(int64_t coord, int64_t size) {
  if (p.padding == 1) {
    return clip(coord, size);
  }
  if (p.padding == 2) {
    if (p.align_corners != 0) {
      return size == 1 ? int64_t(0) : clip(reflect(coord, int64_t(0), (size - 1) * ONE), size);
    }
    return clip(reflect(coord, -ONE / 2, size * ONE), size);
  }
  return coord;
}

// Step 3, nearest: the pixel index, rounding halves to even.
int64_t round_half_even(int64_t coord) {
  int64_t whole = coord >> COORD_FRAC_BITS;
  int64_t fraction = coord & (ONE - 1);
  bool up = fraction > ONE / 2 || (fraction == ONE / 2 && (whole & 1) != 0);
  return whole + (up ? 1 : 0);
}

// Step 3, bilinear: the weight of the upper tap, 0 .. 2^15.
int64_t weight_of(int64_t coord) {
  return shift_round(coord & (ONE - 1), COORD_FRAC_BITS - WEIGHT_BITS);
}

int64_t tap(int n, int c, int64_t y, int64_t x) {
  if (x < 0 || x >= p.width || y < 0 || y >= p.height) {
    return 0;  // a tap outside the image reads 0
  }
  uint index = uint(n * p.image_stride_n + c * p.image_stride_c + int(y) * p.image_stride_y +
                    int(x) * p.image_stride_x);
  return int64_t(read_int8(index)) - p.image_zero_point;
}

// Steps 1 to 4 for one output element: the value, with 15 fractional bits, in image steps.
int64_t sample_element(int n, int c, int oy, int ox) {
  uint grid_index = uint(((n * p.out_height + oy) * p.out_width + ox) * 2);
  int64_t x = apply_padding(unnormalize(read_grid(grid_index), p.x_multiplier, p.x_shift,
                                        p.x_offset), p.x_size);
  int64_t y = apply_padding(unnormalize(read_grid(grid_index + 1), p.y_multiplier, p.y_shift,
                                        p.y_offset), p.y_size);
  if (p.mode == 1) {
    return tap(n, c, round_half_even(y), round_half_even(x)) << WEIGHT_BITS;
  }
  int64_t x0 = x >> COORD_FRAC_BITS, y0 = y >> COORD_FRAC_BITS;
  int64_t wx = weight_of(x), wy = weight_of(y);
  int64_t v00 = tap(n, c, y0, x0), v01 = tap(n, c, y0, x0 + 1);
  int64_t v10 = tap(n, c, y0 + 1, x0), v11 = tap(n, c, y0 + 1, x0 + 1);
  // Step 4: accumulate
  int64_t top = (v00 << WEIGHT_BITS) + (v01 - v00) * wx;
  int64_t bottom = (v10 << WEIGHT_BITS) + (v11 - v10) * wx;
  return shift_round((top << WEIGHT_BITS) + (bottom - top) * wy, WEIGHT_BITS);
}

// Step 5: to the output's int8 parameters.
int requantize(int64_t value) {
  int64_t q = shift_round_half_even(value * p.requant_multiplier, p.requant_shift) +
              p.output_zero_point;
  return int(min(max(q, p.output_min), p.output_max));
}

int64_t element_value(int element) {
  int n, c, oy, ox;
  int plane = p.out_height * p.out_width;
  if (p.output_channels_last != 0) {  // N, Ho, Wo, C in memory
    c = element % p.channels;
    int pixel = element / p.channels;
    ox = pixel % p.out_width;
    oy = (pixel / p.out_width) % p.out_height;
    n = pixel / plane;
  } else {  // N, C, Ho, Wo in memory
    ox = element % p.out_width;
    oy = (element / p.out_width) % p.out_height;
    c = (element / plane) % p.channels;
    n = element / (plane * p.channels);
  }
  return sample_element(n, c, oy, ox);
}

void main() {
  uint word = gl_GlobalInvocationID.y * uint(p.words_per_row) + gl_GlobalInvocationID.x;
  if (p.float_output != 0) {
    if (word >= uint(p.total_elements)) {
      return;
    }
    output_words[word] = floatBitsToUint(float(element_value(int(word))) * p.float_output_scale);
    return;
  }
  uint first = word * 4u;
  if (first >= uint(p.total_elements)) {
    return;
  }
  uint packed = 0u;
  for (uint k = 0u; k < 4u && first + k < uint(p.total_elements); ++k) {
    packed |= (uint(requantize(element_value(int(first + k)))) & 0xFFu) << (8u * k);
  }
  output_words[word] = packed;
}
