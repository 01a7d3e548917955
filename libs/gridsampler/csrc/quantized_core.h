// The instruction-set-neutral core of the vectorized kernels (quantized_x86_any.cpp: AVX-512 and
// AVX2; quantized_neon.cpp: AArch64 Advanced SIMD; quantized_x86.cpp shares its requantization
// limit and form choice): written once, in plain integers, no intrinsics:
//
// - the kernel kinds (which second pass reads the image) and the layout that decides them;
// - the limits every vector kernel shares (sides, zero points, requantization in 32-bit lanes);
// - the set-up: the coordinate forms of steps 1 and 2 each instruction set has, the
//   requantization plan, the nearest output table; and the choice of one compiled pass 1 per
//   form (with_form);
// - the rows loop: output rows cut into runs (a row, the rows of one batch element, or many batch
//   elements at a time), runs into blocks of kRun pixels, each block's batch-element offsets, and
//   the two passes per block (pass 1 a block ahead where the instruction set prefetches), and the
//   scalar redo of the pixels a pass leaves.
//
// The instruction sets' own files hold the vector forms of the steps: how taps are fetched
// (gathers, or staging where there are none), the byte dot products and permutes, the lane
// widths. quantized.cpp's dispatch table picks the kernel; docs/kernels.md says which runs where.
// Internal to the native library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "quantized.h"
#include "quantized_forms.h"
#include "quantized_steps.h"

namespace etkit::gridsampler::core {

constexpr int64_t kRun = 256;  // output pixels per block (two blocks of coordinates stay in L1)

// How a kernel's second pass reads the image: one list for every instruction set (each serves
// the kinds its select function returns; docs/kernels.md has the table).
enum class Kind : uint8_t {
  // bilinear
  kPlanar,    // image x stride 1 (NCHW, or one channel): per channel plane, lanes are pixels
  kStrided,   // any other layout: per channel, taps read one by one (NEON)
  kPairs,     // 2 channels-last
  kTriples,   // 3 channels-last
  kQuads,     // 4 channels-last (x86: quantized_x86.cpp's kernel; NEON: lanes are pixels)
  kEights,    // 8 channels-last: lanes are channels
  kSixteens,  // a multiple of 16 channels-last
  kChannels,  // channels-last, any count from 2 (AVX2: per channel, one 32-bit gather per tap)
  // nearest
  kNearPlanar,
  kNearStrided,  // NEON
  kNear2,
  kNear3,
  kNear4,
  kNear8,
  kNear16,  // a multiple of 16
};

inline bool is_nearest(Kind kind) { return kind >= Kind::kNearPlanar; }

// The image and output layout, as the kinds see it.
struct Layout {
  int64_t channels, height, width;
  bool planar;         // image and output x stride 1 (NCHW, or one channel)
  bool channels_last;  // image and output channels-last (c stride 1, x stride = channels)
  bool nonnegative;    // no negative image or output stride
  int64_t extent;      // image bytes from its first element to past its last
};

template <typename OutT>
inline Layout layout_of(const View4<const int8_t>& image, const View4<OutT>& output) {
  Layout l{};
  l.channels = image.sizes[1];
  l.height = image.sizes[2];
  l.width = image.sizes[3];
  const int64_t* const is = image.strides;
  const int64_t* const os = output.strides;
  l.planar = is[3] == 1 && os[3] == 1;
  l.channels_last = is[1] == 1 && is[3] == l.channels && os[1] == 1 && os[3] == l.channels;
  l.nonnegative = true;
  l.extent = 1;
  for (int d = 0; d < 4; ++d) {
    l.nonnegative = l.nonnegative && is[d] >= 0 && os[d] >= 0;
    l.extent += (image.sizes[d] - 1) * is[d];
  }
  return l;
}

// The kind of a layout: planar, then channels-last 2, 3, 4, 8 or 16k channels, else strided.
// Each instruction set then takes it (or its own variant of it) or leaves it to another kernel.
inline Kind natural_kind(const Layout& l, bool nearest) {
  if (l.planar) {
    return nearest ? Kind::kNearPlanar : Kind::kPlanar;
  }
  if (l.channels_last) {
    switch (l.channels) {
      case 2:
        return nearest ? Kind::kNear2 : Kind::kPairs;
      case 3:
        return nearest ? Kind::kNear3 : Kind::kTriples;
      case 4:
        return nearest ? Kind::kNear4 : Kind::kQuads;
      case 8:
        return nearest ? Kind::kNear8 : Kind::kEights;
      default:
        if (l.channels % 16 == 0) {
          return nearest ? Kind::kNear16 : Kind::kSixteens;
        }
    }
  }
  return nearest ? Kind::kNearStrided : Kind::kStrided;
}

// Step 5 in vector lanes (int8 output): a shift of 32..62 (the 64-bit form's upper half), a
// multiplier below 2^31 (one 32 x 32-bit product), an output range within int8 and an output
// zero point within int16. Float output: always.
template <typename OutT>
inline bool requant_fits_lanes(const QuantizedPlan& plan) {
  if constexpr (std::is_same_v<OutT, int8_t>) {
    return plan.requant_shift >= 32 && plan.requant_shift <= 62 && plan.output_min >= -128 &&
           plan.output_max <= 127 && plan.output_zero_point >= -32768 &&
           plan.output_zero_point <= 32767 && plan.requant_multiplier > 0 &&
           plan.requant_multiplier < (int64_t(1) << 31);
  } else {
    (void)plan;
    return true;
  }
}

// What every vector kernel of quantized_x86_any.cpp and quantized_neon.cpp asks: sides below 2^15
// pixels (indexes and 16-bit products), an image zero point within int8 (a tap outside reads it
// as a raw byte), no negative stride, and step 5 in lanes.
template <typename OutT>
inline bool vector_limits_hold(const Layout& l, const QuantizedPlan& plan) {
  return l.height < (1 << 15) && l.width < (1 << 15) && plan.image_zero_point >= -128 &&
         plan.image_zero_point <= 127 && l.nonnegative && requant_fits_lanes<OutT>(plan);
}

// ---- set-up ----

// How steps 1 and 2 are computed (quantized_forms.h, quantized_x86_common.h): int16 grids in 32-
// bit integer lanes (kInteger; kSplit: 16-bit multiply-adds of (x, y) pairs), float64 lanes
// (kFloat), the exact integer rounding of nearest (kNearest), exact 64-bit lanes (kExact), or the
// scalar steps (kScalar); int8 grids read a table of the 256 results (kTable).
enum class Coordinates { kInteger, kFloat, kScalar, kExact, kTable, kNearest, kSplit };

// The coordinate forms an instruction set has (the table and the exact form: all of them).
struct FormSet {
  bool split;            // AxisSplit (x86)
  bool floating;         // AxisVector (x86)
  bool scalar_fallback;  // the scalar steps where no vector form applies (x86); else the exact
                         // form must apply (NEON's select checks it)
  int integer_min_shift;  // AxisInteger with S below this is left to the exact form (NEON: 1)
  int64_t exact_grid_min, exact_grid_max;  // the grid values the exact form must cover (0, 0:
                                           // those of the grid's dtype)
};

// Calls body(std::integral_constant<Coordinates, F>(), std::bool_constant<N>()) with F = `form`
// and N = `nearest` (for the forms that serve both modes: kExact, kScalar; kNearest is nearest
// only, the others bilinear only), so that each pass 1 is compiled for one form. `kForms`: the
// forms the instruction set has; grids other than int16 take kTable where it is among them,
// else kScalar.
template <typename GridT, Coordinates... kForms, typename Body>
inline void with_form(Coordinates form, bool nearest, const Body& body) {
  using C = Coordinates;
  constexpr bool kTable = ((kForms == C::kTable) || ...);
  const auto call = [&](auto f) {
    constexpr C kF = decltype(f)::value;
    if constexpr (kF == C::kNearest) {
      body(f, std::true_type());
    } else if constexpr (kF == C::kExact || kF == C::kScalar) {
      if (nearest) {
        body(f, std::true_type());
      } else {
        body(f, std::false_type());
      }
    } else {
      body(f, std::false_type());
    }
  };
  if constexpr (!std::is_same_v<GridT, int16_t>) {
    if constexpr (kTable) {
      call(std::integral_constant<C, C::kTable>());
    } else {
      call(std::integral_constant<C, C::kScalar>());
    }
  } else {
    const auto one = [&](auto f) {
      if constexpr (decltype(f)::value == C::kTable) {
        return false;  // (int8 grids only)
      } else {
        if (form != decltype(f)::value) {
          return false;
        }
        call(f);
        return true;
      }
    };
    (one(std::integral_constant<C, kForms>()) || ...);
  }
}

// The exact form (AxisExact) for `form_set`'s grid range.
template <typename GridT>
inline AxisExact plan_exact(const AxisPlan& axis, const QuantizedPlan& p, bool nearest,
                            const FormSet& form_set) {
  constexpr bool kInt16 = std::is_same_v<GridT, int16_t>;
  int64_t grid_min = kInt16 ? -32768 : -128, grid_max = kInt16 ? 32767 : 127;
  if (form_set.exact_grid_min != form_set.exact_grid_max) {
    grid_min = form_set.exact_grid_min;
    grid_max = form_set.exact_grid_max;
    // d = q - zero in 32-bit lanes
    const int64_t max_d = std::max(std::llabs(grid_min - p.grid_zero_point),
                                   std::llabs(grid_max - p.grid_zero_point));
    if (max_d >= (int64_t(1) << 31)) {
      return AxisExact{};
    }
  }
  return plan_axis_exact(axis, p.grid_zero_point, p.params.padding, p.params.align_corners,
                         nearest, grid_min, grid_max);
}

// Everything the passes of every instruction set need, derived once per call; an instruction
// set's own Setup adds its registers' plans to it.
struct Setup {
  Kind kind;
  Coordinates coordinates;
  bool nearest;
  bool pairs;  // the grid is (x, y) pairs, one after the other
  AxisInteger integer_x, integer_y;
  AxisNearest nearest_x, nearest_y;
  AxisExact exact_x, exact_y;
  alignas(64) int32_t table_x[256];  // int8 grids: pass 1's result of each grid value
  alignas(64) int32_t table_y[256];
  int32_t grid_zero_point, image_zero_point;
  int32_t width, height, channels;
  int64_t stride_c, stride_y, stride_x;  // image, bytes
  int64_t extent;                        // image bytes from its start to past its last element
  // step 5
  NarrowRequant narrow;                // the 32-bit form (int8 output)
  int64_t wide_multiplier, wide_shift;  // the 64-bit form
  int32_t output_zero_point;
  int8_t output_min, output_max;  // the output range, within int8
  float float_scale;
  bool identity_table;                    // nearest int8: the table maps each value to itself
  alignas(64) uint8_t output_table[256];  // nearest int8: the output of each raw value (& 0xFF)
};

// The set-up of `kind` for an instruction set with the forms `form_set`. AxisSplit and AxisVector
// are x86's: it plans them itself (quantized_x86_common.h) and may then change `coordinates`.
template <typename GridT, typename OutT>
inline void make_setup(const View4<const int8_t>& image, const View4<const GridT>& grid,
                       const QuantizedPlan& p, Kind kind, const FormSet& form_set, Setup* s) {
  constexpr bool kInt16 = std::is_same_v<GridT, int16_t>;
  constexpr bool kFloatOutput = std::is_same_v<OutT, float>;
  const Padding padding = p.params.padding;
  s->kind = kind;
  s->nearest = p.params.mode == Mode::kNearest;
  s->pairs = grid.strides[2] == 2 && grid.strides[3] == 1;
  const auto plan_axis = [&](const AxisPlan& axis, AxisInteger* integer, AxisNearest* nearest,
                             AxisExact* exact) {
    *integer = plan_axis_integer(axis, p.grid_zero_point, padding, kInt16);
    if (integer->shift < form_set.integer_min_shift) {
      *integer = AxisInteger{};
    }
    *nearest = plan_axis_nearest(axis, p.grid_zero_point, padding);
    *exact = plan_exact<GridT>(axis, p, s->nearest, form_set);
  };
  plan_axis(p.x, &s->integer_x, &s->nearest_x, &s->exact_x);
  plan_axis(p.y, &s->integer_y, &s->nearest_y, &s->exact_y);
  using C = Coordinates;
  if (!kInt16) {
    s->coordinates = C::kTable;
    fill_axis_tables(p, s->nearest, s->table_x, s->table_y);
  } else if (!s->nearest && s->integer_x.applies && s->integer_y.applies) {
    s->coordinates = C::kInteger;  // (x86 then takes kSplit where it applies)
  } else if (s->nearest && s->nearest_x.applies && s->nearest_y.applies) {
    s->coordinates = C::kNearest;
  } else if (!form_set.scalar_fallback || (s->exact_x.applies && s->exact_y.applies)) {
    s->coordinates = C::kExact;  // (x86 takes kFloat before it where that applies)
  } else {
    s->coordinates = C::kScalar;
  }
  s->grid_zero_point = static_cast<int32_t>(p.grid_zero_point);
  s->image_zero_point = static_cast<int32_t>(p.image_zero_point);
  s->channels = static_cast<int32_t>(image.sizes[1]);
  s->height = static_cast<int32_t>(image.sizes[2]);
  s->width = static_cast<int32_t>(image.sizes[3]);
  s->stride_c = image.strides[1];
  s->stride_y = image.strides[2];
  s->stride_x = image.strides[3];
  s->extent = 1;
  for (int d = 0; d < 4; ++d) {
    s->extent += (image.sizes[d] - 1) * image.strides[d];
  }
  s->narrow = kFloatOutput ? NarrowRequant{false, 1, 1}
                           : narrow_requant(p.requant_multiplier, p.requant_shift);
  s->wide_multiplier = kFloatOutput ? 1 : p.requant_multiplier;
  s->wide_shift = kFloatOutput ? 1 : p.requant_shift;
  s->output_zero_point = static_cast<int32_t>(p.output_zero_point);
  s->output_min = static_cast<int8_t>(std::max<int64_t>(p.output_min, -128));
  s->output_max = static_cast<int8_t>(std::min<int64_t>(p.output_max, 127));
  s->float_scale = p.float_output_scale;
  // nearest, int8 output: step 5 of each raw value v, (v - zero) * 2^15 requantized
  s->identity_table = true;
  for (int v = -128; v < 128; ++v) {
    const bool table = s->nearest && !kFloatOutput;
    const int8_t q = table ? steps::requantize((v - p.image_zero_point) << kWeightBits, p)
                           : static_cast<int8_t>(v);
    s->output_table[v & 0xFF] = static_cast<uint8_t>(q);
    s->identity_table = s->identity_table && q == v;
  }
}

// ---- the rows loop ----

// One run of output pixels: the rows of batch element n from row oy on (or, batched, whole
// elements from n on), `count` pixels.
template <typename GridT, typename OutT>
struct Run {
  int64_t n, oy, rows, count;
  const GridT* grid;  // the run's first grid point
  OutT* out;          // its first output pixel
};

// Whether runs may span batch elements: the grid and output rows of one element follow each
// other (a run of whole rows), and each element's follow the one before.
template <typename GridT, typename OutT>
inline bool rows_flat(const View4<const GridT>& grid, const View4<OutT>& output) {
  return grid.strides[1] == grid.sizes[2] * grid.strides[2] &&
         output.strides[2] == grid.sizes[2] * output.strides[3];
}

template <typename GridT, typename OutT>
inline bool batches_flat(const View4<const GridT>& grid, const View4<OutT>& output) {
  return rows_flat(grid, output) && grid.strides[0] == grid.sizes[1] * grid.strides[1] &&
         output.strides[0] == grid.sizes[1] * output.strides[2];
}

// Calls run_body(Run) for each run of rows [row_begin, row_end): a row; all the rows of one batch
// element where they follow each other in the grid and the output (rows_flat); or, with
// `across_batch`, every row at once (small outputs: a correlation lookup samples 9 x 9 pixels per
// image).
template <typename GridT, typename OutT, typename RunBody>
inline void for_each_run(const View4<const GridT>& grid, const View4<OutT>& output,
                         int64_t row_begin, int64_t row_end, bool across_batch,
                         const RunBody& run_body) {
  const int64_t out_height = grid.sizes[1], out_width = grid.sizes[2];
  const bool flat = rows_flat(grid, output);
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t n = row / out_height, oy = row % out_height;
    const int64_t rows = across_batch ? row_end - row
                                      : (flat ? std::min(row_end, (n + 1) * out_height) - row : 1);
    run_body(Run<GridT, OutT>{n, oy, rows, rows * out_width,
                              grid.data + n * grid.strides[0] + oy * grid.strides[1],
                              output.data + n * output.strides[0] + oy * output.strides[2]});
    row += rows;
  }
}

// Each pixel's batch element's image offset for the block of `block` pixels from pixel `first`
// of a run that starts at row oy of element n: (n + element) * image_n - `base`, for lanes
// [0, block), and the last pixel's for lanes [block, pad_to). Returns the last offset.
template <typename OffsetT>
inline int64_t element_offsets(int64_t n, int64_t oy, int64_t first, int64_t block,
                               int64_t out_height, int64_t out_width, int64_t image_n,
                               int64_t base, int64_t pad_to, OffsetT* offsets) {
  const int64_t per_element = out_height * out_width;
  const int64_t start = oy * out_width + first;  // pixels from element n's start
  int64_t element = start / per_element;
  int64_t k = 0;
  int64_t offset = (n + element) * image_n - base;
  while (k < block) {
    const int64_t end = std::min(block, (element + 1) * per_element - start);
    offset = (n + element) * image_n - base;
    std::fill(offsets + k, offsets + end, static_cast<OffsetT>(offset));
    k = end;
    ++element;
  }
  std::fill(offsets + k, offsets + std::max(k, pad_to), static_cast<OffsetT>(offset));
  return offset;
}

// The blocks of a run of `count` pixels: first_pass(first, block, Coords*) computes a block's
// coordinates, second_pass(first, block, const Coords&) samples it. With kAhead, pass 1 runs a
// block ahead of pass 2 (two Coords), so that what it prefetches has arrived.
template <bool kAhead, typename Coords, typename FirstPass, typename SecondPass>
inline void run_blocks(int64_t count, Coords* coords, const FirstPass& first_pass,
                       const SecondPass& second_pass) {
  if constexpr (kAhead) {
    int current = 0;
    first_pass(int64_t(0), std::min(kRun, count), &coords[0]);
    for (int64_t first = 0; first < count; first += kRun) {
      const int64_t block = std::min(kRun, count - first);
      if (first + kRun < count) {
        first_pass(first + kRun, std::min(kRun, count - first - kRun), &coords[current ^ 1]);
      }
      const Coords& c = coords[current];
      current ^= 1;
      second_pass(first, block, c);
    }
  } else {
    for (int64_t first = 0; first < count; first += kRun) {
      const int64_t block = std::min(kRun, count - first);
      first_pass(first, block, &coords[0]);
      second_pass(first, block, coords[0]);
    }
  }
}

// The pixels of a block a vector pass left (bit j of outside[j / 16]: a tap outside the image
// that carries weight), by the scalar steps.
template <typename GridT, typename OutT>
inline void redo_outside(const uint16_t* outside, int64_t first, int64_t block,
                         const GridT* grid_run, int64_t grid_x, int64_t grid_axis,
                         const steps::Plane& plane, OutT* output_run, int64_t output_x,
                         int64_t output_c, const QuantizedPlan& p) {
  for (int64_t j = 0; j < block; j += 16) {
    for (uint32_t bits = outside[j / 16]; bits != 0; bits &= bits - 1) {
      const int64_t k = first + j + __builtin_ctz(bits);
      const GridT* const point = grid_run + k * grid_x;
      steps::sample_pixel(steps::pixel_coordinate(point[0], p, p.x),
                          steps::pixel_coordinate(point[grid_axis], p, p.y), plane,
                          output_run + k * output_x, output_c, p);
    }
  }
}

}  // namespace etkit::gridsampler::core
