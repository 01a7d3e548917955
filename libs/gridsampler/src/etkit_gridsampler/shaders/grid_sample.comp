#version 450
// The integer grid sampler on Vulkan: docs/contract.md, step by step, with the names of
// csrc/quantized_steps.h, bit for bit, in 32-bit integer arithmetic only: no 64-bit types, no
// extension, no optional device feature (the Shader capability alone; a test checks the SPIR-V).
// A 64-bit value of the contract is a pair of 32-bit words, value = hi * 2^32 + lo (hi signed,
// lo unsigned), wrapping modulo 2^64 as the C++ 64-bit integers do; products wider than 32 bits
// come from umulExtended / imulExtended. vulkan.dispatch() derives the parameter block from the
// C++ plan (plan_quantized), folding what is the same for every pixel of the dispatch.
//
// Two ways to cover the output, chosen per dispatch (`pixel_path`):
// - channels-last image and output with C a multiple of 4 (RGBA): one invocation per output
//   pixel, steps 1 to 3 once for all channels, the taps read a 32-bit word (four channels) at
//   a time, the output written a word per four int8 channels (or one per float32 channel);
// - any other layout: one invocation per 32-bit word of the output (four int8 elements or one
//   float32 element), steps 1 to 3 once per distinct pixel among its elements.
// Divisions by the output's sizes are multiplications by per-dispatch reciprocals (`divide`).
//
// Specialization constants: each of the switches below is read from the parameter block when
// its constant keeps its default (-1), so the SPIR-V as compiled runs every configuration; a
// pipeline specialized with the values of KernelDispatch.specialization_constants (the same
// values the parameter block holds) compiles only its own configuration. Drivers that run
// every side of a branch under a mask, as lavapipe does, need that to be fast.

layout(local_size_x = 64) in;

layout(constant_id = 0) const int PIXEL_PATH = -1;
layout(constant_id = 1) const int MODE = -1;
layout(constant_id = 2) const int PADDING = -1;
layout(constant_id = 3) const int ALIGN_CORNERS = -1;
layout(constant_id = 4) const int FLOAT_OUTPUT = -1;
layout(constant_id = 5) const int GRID_IS_INT8 = -1;
layout(constant_id = 6) const int COORD_SHIFT = -1;  // x_shift when it equals y_shift
layout(constant_id = 7) const int REQUANT_SHIFT_HIGH = -1;
layout(constant_id = 8) const int CHANNEL_QUADS = -1;  // C / 4 on the pixel path

layout(set = 0, binding = 0) readonly buffer Image { uint image_words[]; };   // int8, packed
layout(set = 0, binding = 1) readonly buffer Grid { uint grid_words[]; };     // int16 or int8
layout(set = 0, binding = 2) writeonly buffer Output { uint output_words[]; };
struct Params {
  // Steps 1 and 2, per axis: P = ((u * multiplier + addend) >> shift) + offset (mod 2^64), with
  // u = grid value + 2^15 (int16 grid) or + 2^7 (int8): the plan's unnormalize, rewritten with
  // the grid zero point and the rounding folded into the addend. 64-bit values as (lo, hi).
  uint x_multiplier_lo, x_multiplier_hi, x_addend_lo, x_addend_hi;
  uint x_shift, x_offset_lo, x_offset_hi;
  int x_size;
  uint y_multiplier_lo, y_multiplier_hi, y_addend_lo, y_addend_hi;
  uint y_shift, y_offset_lo, y_offset_hi;
  int y_size;
  // Steps 4 and 5
  int image_zero_point;
  uint image_zero_word;  // the image zero point in each byte: a tap outside the image reads it
  int output_zero_point, output_min, output_max;
  int requant_multiplier, requant_shift_high;  // the plan's requant_shift - 32, 1 .. 30
  int float_output;
  float float_output_scale;
  // shapes and layout
  int batch, channels, height, width;
  int out_height, out_width, output_channels_last, grid_is_int8;
  int image_stride_n, image_stride_c, image_stride_y, image_stride_x;  // elements
  int mode, padding, align_corners;
  // the dispatch: invocations that work (pixels or output words), per row of the dispatch grid
  int pixel_path, invocations, invocations_per_row, total_elements;
  uint out_width_magic, out_height_magic, channels_magic;  // reciprocals for divide()
  uint out_width_shift, out_height_shift, channels_shift;
};
layout(set = 0, binding = 3) readonly buffer ParamBlock { Params params; };

// The parameter block, copied once at the start of main, before any branch: read there, each
// field is loaded once for a whole SIMD batch of invocations (lavapipe loads a storage buffer
// per invocation inside control flow, which doubled the kernel's time).
Params p;

const int WEIGHT_BITS = 15;

// the switches: a specialization constant where it is set, else the parameter block
bool pixel_path_on() { return (PIXEL_PATH >= 0 ? PIXEL_PATH : p.pixel_path) != 0; }
int mode() { return MODE >= 0 ? MODE : p.mode; }
int padding() { return PADDING >= 0 ? PADDING : p.padding; }
bool align_corners() { return (ALIGN_CORNERS >= 0 ? ALIGN_CORNERS : p.align_corners) != 0; }
bool float_output() { return (FLOAT_OUTPUT >= 0 ? FLOAT_OUTPUT : p.float_output) != 0; }
bool grid_is_int8() { return (GRID_IS_INT8 >= 0 ? GRID_IS_INT8 : p.grid_is_int8) != 0; }
uint x_shift() { return COORD_SHIFT >= 0 ? uint(COORD_SHIFT) : p.x_shift; }
uint y_shift() { return COORD_SHIFT >= 0 ? uint(COORD_SHIFT) : p.y_shift; }
int requant_shift_high() {
  return REQUANT_SHIFT_HIGH >= 0 ? REQUANT_SHIFT_HIGH : p.requant_shift_high;
}
int channel_quads() { return CHANNEL_QUADS >= 0 ? CHANNEL_QUADS : p.channels >> 2; }

// floor(j / d) for j < 2^31 and a divisor 1 <= d < 2^31 given as magic = ceil(2^(31 + shift) / d)
// (< 2^32) with shift = ceil(log2(d)): floor(j * magic / 2^(31 + shift)) = floor(j / d + r) where
// r = j * (magic * d - 2^(31 + shift)) / (d * 2^(31 + shift)) < 2^31 * d / (d * 2^(31 + shift))
// <= 1 / d, too little to move the floor of j / d (whose fraction is at most 1 - 1 / d).
uint divide(uint j, uint magic, uint shift) {
  uint hi, lo;
  umulExtended(j, magic, hi, lo);
  return ((hi << 1u) | (lo >> 31u)) >> shift;
}

// Step 1: a grid value (as u = q + 2^15, or + 2^7) to a fixed-point pixel coordinate with 32
// fractional bits, (hi, lo). The C++ computes shift_round((q - zero) * multiplier, shift) +
// offset in 64-bit integers; here u * multiplier + addend = (q - zero) * multiplier +
// 2^(shift - 1) (mod 2^64), the same 64 bits before the arithmetic shift (a left shift of the
// plan is folded into the multiplier, with shift 0; vulkan.py's _axis_words).
void unnormalize(uint u, uint m_lo, uint m_hi, uint a_lo, uint a_hi, uint shift, uint o_lo,
                 uint o_hi, out int hi, out uint lo) {
  uint ph, pl, carry;
  umulExtended(u, m_lo, ph, pl);
  ph += u * m_hi;
  pl = uaddCarry(pl, a_lo, carry);
  ph += a_hi + carry;
  if (shift >= 32u) {  // 32 .. 62
    pl = uint(int(ph) >> (shift - 32u));
    ph = uint(int(ph) >> 31u);
  } else if (shift > 0u) {
    pl = (pl >> shift) | (ph << (32u - shift));
    ph = uint(int(ph) >> shift);
  }
  lo = uaddCarry(pl, o_lo, carry);
  hi = int(ph + o_hi + carry);
}

// clip to [0, (size - 1) * ONE]
void clip(inout int hi, inout uint lo, int size) {
  if (hi < 0) {
    hi = 0;
    lo = 0u;
  } else if (hi >= size - 1) {
    hi = size - 1;
    lo = 0u;
  }
}

// reflect(coord, low, span) with span = k / 2 pixels and low = -ONE / 2 (`half_low`) or 0:
// folds |coord - low| into [0, 2 * span) (2 * span = k * 2^32: the remainder of the high word
// modulo k), mirrors the upper half, adds low back. As in C++, where 2 * span >= 2^63 (an axis
// of 2^30 pixels or more) wraps to 2^64 - 2 * span: the remainder is then modulo 2^32 - k.
void reflect(inout int hi, inout uint lo, bool half_low, uint k) {
  uint carry, borrow;
  if (half_low) {  // coord - low
    lo = uaddCarry(lo, 0x80000000u, carry);
    hi += int(carry);
  }
  uint ah = uint(hi), al = lo;  // |coord - low|, unsigned
  if (hi < 0) {
    al = 0u - lo;
    ah = ~uint(hi) + uint(lo == 0u);
  }
  if (ah == 0x80000000u && al == 0u) {
    // C++'s abs leaves -2^63 negative; its remainder is <= 0, not mirrored, clipped to 0
    hi = 0;
    lo = 0u;
    return;
  }
  uint modulus = k >= 0x80000000u ? 0u - k : k;
  uint fh = ah < modulus ? ah : ah % max(modulus, 1u);
  uint half_k = k >> 1u;  // span
  if (fh > half_k || (fh == half_k && al != 0u)) {  // 2 * span - folded
    al = usubBorrow(0u, al, borrow);
    fh = k - fh - borrow;
  }
  hi = int(fh);
  lo = al;
  if (half_low) {  // + low
    lo = usubBorrow(lo, 0x80000000u, borrow);
    hi -= int(borrow);
  }
}

// Step 2: the padding mode.
void apply_padding(inout int hi, inout uint lo, int size) {
  if (padding() == 1) {
    clip(hi, lo, size);
  } else if (padding() == 2) {
    if (align_corners()) {
      if (size == 1) {
        hi = 0;
        lo = 0u;
        return;
      }
      reflect(hi, lo, false, 2u * uint(size - 1));
    } else {
      reflect(hi, lo, true, 2u * uint(size));
    }
    clip(hi, lo, size);
  }
}

// Step 3, nearest: the pixel index, rounding halves to even.
int round_half_even(int hi, uint lo) {
  return hi + int(lo > 0x80000000u || (lo == 0x80000000u && (hi & 1) != 0));
}

// Step 3, bilinear: the weight of the upper tap, shift_round(lo, 17) in 0 .. 2^15.
int weight_of(uint lo) { return int((lo >> 17u) + ((lo >> 16u) & 1u)); }

// Steps 1 to 3 for one output pixel: the tap (x, y) and the weights of the taps after it along
// each axis (bilinear: the upper-left tap and wx, wy; nearest: the tap alone, weights 0).
struct Sample {
  int x, y, wx, wy;
};

Sample sample_at(uint pixel) {
  uint ux, uy;
  if (grid_is_int8()) {
    uint pair = grid_words[pixel >> 1u] >> (16u * (pixel & 1u));
    ux = (pair & 0xFFu) ^ 0x80u;
    uy = ((pair >> 8u) & 0xFFu) ^ 0x80u;
  } else {
    uint pair = grid_words[pixel] ^ 0x80008000u;
    ux = pair & 0xFFFFu;
    uy = pair >> 16u;
  }
  int xh, yh;
  uint xl, yl;
  unnormalize(ux, p.x_multiplier_lo, p.x_multiplier_hi, p.x_addend_lo, p.x_addend_hi, x_shift(),
              p.x_offset_lo, p.x_offset_hi, xh, xl);
  apply_padding(xh, xl, p.x_size);
  unnormalize(uy, p.y_multiplier_lo, p.y_multiplier_hi, p.y_addend_lo, p.y_addend_hi, y_shift(),
              p.y_offset_lo, p.y_offset_hi, yh, yl);
  apply_padding(yh, yl, p.y_size);
  Sample s;
  if (mode() == 1) {
    s.x = round_half_even(xh, xl);
    s.y = round_half_even(yh, yl);
    s.wx = 0;
    s.wy = 0;
  } else {
    s.x = xh;
    s.y = yh;
    s.wx = weight_of(xl);
    s.wy = weight_of(yl);
  }
  return s;
}

// Step 4: accumulate, with v = q_image - zero_i (0 outside the image), |v| <= 255:
// top = v00 * 2^15 + (v01 - v00) * wx, bottom likewise, and
// shift_round(top * 2^15 + (bottom - top) * wy, 15) = top + h * wy + ((l * wy + 2^14) >> 15)
// with bottom - top = h * 2^15 + l, 0 <= l < 2^15: every product fits in 32 bits. With zero
// weights (nearest) it is v00 * 2^15.
int accumulate(int v00, int v01, int v10, int v11, int wx, int wy) {
  int top = (v00 << WEIGHT_BITS) + (v01 - v00) * wx;
  int bottom = (v10 << WEIGHT_BITS) + (v11 - v10) * wx;
  int diff = bottom - top;
  return top + (diff >> WEIGHT_BITS) * wy + (((diff & 0x7FFF) * wy + 0x4000) >> WEIGHT_BITS);
}

ivec4 accumulate(ivec4 v00, ivec4 v01, ivec4 v10, ivec4 v11, int wx, int wy) {
  ivec4 top = (v00 << WEIGHT_BITS) + (v01 - v00) * wx;
  ivec4 bottom = (v10 << WEIGHT_BITS) + (v11 - v10) * wx;
  ivec4 diff = bottom - top;
  return top + (diff >> WEIGHT_BITS) * wy + (((diff & 0x7FFF) * wy + 0x4000) >> WEIGHT_BITS);
}

// Step 5, int8 output: shift_round_half_even(value * M, S) + zero_o, clamped, where S = 32 + s
// with s = requant_shift_high in 1 .. 30 (the plan's S is 39 .. 62): value * M = hi * 2^32 + lo,
// whole = hi >> s, and the remainder (hi mod 2^s) * 2^32 + lo is compared with 2^(s-1) * 2^32.
ivec4 requantize(ivec4 value) {
  ivec4 hi, lo;
  imulExtended(value, ivec4(p.requant_multiplier), hi, lo);
  int s = requant_shift_high();
  ivec4 whole = hi >> s;
  ivec4 rest = hi & ((1 << s) - 1);
  ivec4 halfway = ivec4(1 << (s - 1));
  ivec4 up = ivec4(greaterThan(rest, halfway)) |
             (ivec4(equal(rest, halfway)) & (ivec4(notEqual(lo, ivec4(0))) | (whole & 1)));
  return clamp(whole + up + p.output_zero_point, p.output_min, p.output_max);
}

// Step 5, float32 output: float(value) * (scale_i * 2^-15), one rounding (value is exact).
vec4 to_float(ivec4 value) {
  precise vec4 result = vec4(value) * p.float_output_scale;
  return result;
}

uint pack_int8(ivec4 q) {
  uvec4 bytes = uvec4(q) & 0xFFu;
  return bytes.x | (bytes.y << 8u) | (bytes.z << 16u) | (bytes.w << 24u);
}

ivec4 unpack_int8(uint word) {
  return ivec4(int(word) << 24, int(word) << 16, int(word) << 8, int(word)) >> 24;
}

// One output pixel of a channels-last image with C = 4 * quads: every channel. The workgroup's
// z is the batch index n, `index` the pixel's index in its image (Ho x Wo).
void pixel_path(uint index) {
  uint n = gl_WorkGroupID.z;
  uint pixel = n * uint(p.out_height * p.out_width) + index;
  Sample s = sample_at(pixel);
  int quads = channel_quads();
  bool in_x0 = uint(s.x) < uint(p.width), in_x1 = uint(s.x + 1) < uint(p.width);
  bool in_y0 = uint(s.y) < uint(p.height), in_y1 = uint(s.y + 1) < uint(p.height);
  bool in00 = in_y0 && in_x0, in01 = in_y0 && in_x1, in10 = in_y1 && in_x0, in11 = in_y1 && in_x1;
  // word indices of the taps, and the words a tap outside the image reads instead (the zero
  // point in each byte, so that its v = q_image - zero_i is 0)
  int base = int(n) * (p.image_stride_n >> 2);
  int row = p.image_stride_y >> 2;
  int w00 = in00 ? base + s.y * row + s.x * quads : 0;
  int w01 = in01 ? base + s.y * row + (s.x + 1) * quads : 0;
  int w10 = in10 ? base + (s.y + 1) * row + s.x * quads : 0;
  int w11 = in11 ? base + (s.y + 1) * row + (s.x + 1) * quads : 0;
  uint outside = p.image_zero_word;
  ivec4 zero = ivec4(p.image_zero_point);
  uint out_word = pixel * uint(quads);
  for (int q = 0; q < quads; ++q) {
    ivec4 value;
    uint t00 = image_words[w00 + q];  // read unconditionally (w = 0 outside), then selected
    if (mode() == 1) {
      value = (unpack_int8(in00 ? t00 : outside) - zero) << WEIGHT_BITS;
    } else {
      uint t01 = image_words[w01 + q], t10 = image_words[w10 + q], t11 = image_words[w11 + q];
      ivec4 v00 = unpack_int8(in00 ? t00 : outside) - zero;
      ivec4 v01 = unpack_int8(in01 ? t01 : outside) - zero;
      ivec4 v10 = unpack_int8(in10 ? t10 : outside) - zero;
      ivec4 v11 = unpack_int8(in11 ? t11 : outside) - zero;
      value = accumulate(v00, v01, v10, v11, s.wx, s.wy);
    }
    if (float_output()) {
      uvec4 bits = floatBitsToUint(to_float(value));
      uint first = (out_word + uint(q)) * 4u;
      output_words[first] = bits.x;
      output_words[first + 1u] = bits.y;
      output_words[first + 2u] = bits.z;
      output_words[first + 3u] = bits.w;
    } else {
      output_words[out_word + uint(q)] = pack_int8(requantize(value));
    }
  }
}

int read_int8(int index) {
  return bitfieldExtract(int(image_words[index >> 2]), 8 * (index & 3), 8);
}

// v at tap (x, y) of the plane at `base`: q_image - zero_i, 0 outside the image.
int tap(int base, int x, int y) {
  if (uint(x) >= uint(p.width) || uint(y) >= uint(p.height)) {
    return 0;
  }
  return read_int8(base + y * p.image_stride_y + x * p.image_stride_x) - p.image_zero_point;
}

// Steps 4 and 5 for one output word of any layout: four int8 elements or one float32 element.
void word_path(uint word) {
  bool is_float = float_output();
  int first = int(word) * (is_float ? 1 : 4);
  int count = is_float ? 1 : min(4, p.total_elements - first);
  uint packed = 0u;
  uint last_pixel = 0xFFFFFFFFu;
  Sample s;
  for (int k = 0; k < count; ++k) {
    uint element = uint(first + k);
    uint n, c, pixel;
    if (p.output_channels_last != 0) {  // N, Ho, Wo, C in memory
      pixel = divide(element, p.channels_magic, p.channels_shift);
      c = element - pixel * uint(p.channels);
      n = divide(divide(pixel, p.out_width_magic, p.out_width_shift), p.out_height_magic,
                 p.out_height_shift);
    } else {  // N, C, Ho, Wo in memory
      uint row = divide(element, p.out_width_magic, p.out_width_shift);  // (n * C + c) * Ho + oy
      uint plane = divide(row, p.out_height_magic, p.out_height_shift);  // n * C + c
      uint plane_size = uint(p.out_height * p.out_width);
      n = divide(plane, p.channels_magic, p.channels_shift);
      c = plane - n * uint(p.channels);
      pixel = n * plane_size + (element - plane * plane_size);
    }
    if (pixel != last_pixel) {
      s = sample_at(pixel);
      last_pixel = pixel;
    }
    int base = int(n) * p.image_stride_n + int(c) * p.image_stride_c;
    int value;
    if (mode() == 1) {
      value = tap(base, s.x, s.y) << WEIGHT_BITS;
    } else {
      value = accumulate(tap(base, s.x, s.y), tap(base, s.x + 1, s.y), tap(base, s.x, s.y + 1),
                         tap(base, s.x + 1, s.y + 1), s.wx, s.wy);
    }
    if (is_float) {
      output_words[word] = floatBitsToUint(to_float(ivec4(value)).x);
    } else {
      packed |= (uint(requantize(ivec4(value)).x) & 0xFFu) << (8u * uint(k));
    }
  }
  if (!is_float) {
    output_words[word] = packed;
  }
}

void main() {
  p = params;
  uint index = gl_GlobalInvocationID.y * uint(p.invocations_per_row) + gl_GlobalInvocationID.x;
  if (index >= uint(p.invocations)) {
    return;
  }
  if (pixel_path_on()) {
    pixel_path(index);
  } else {
    word_path(index);
  }
}
