// The vectorized AArch64 kernel of the integer contract (Advanced SIMD, "NEON"): the same bits as
// the scalar kernel, sixteen output pixels at a time. Internal to the native library; quantized.cpp
// dispatches to it in AArch64 builds (quantized_neon.cpp defines nothing elsewhere).
//
// Advanced SIMD is part of every AArch64 CPU, so an AArch64 build always has the kernel.
#pragma once

#include <cstdint>

#include "quantized.h"

namespace etkit::gridsampler {

// Whether the NEON kernel handles this configuration: nearest or bilinear sampling, every padding
// mode and align_corners setting, int16 or int8 grids, int8 or float32 output, images of any
// channel count and layout (planar images, NCHW or one channel, and channels-last images of 2, 3,
// 4, 8 and 16k channels take passes of their own; any other layout reads its taps one by one),
// with sides below 2^15 pixels, a plane whose offsets fit 31 bits, an image zero point within
// int8, a grid zero point within int16 (the exact coordinate form), and for int8 output a
// requantization the vector step 5 serves (shift 32..62, multiplier below 2^31, output range
// within int8, output zero point within int16): every configuration the Python API and the
// delegate accept below those sizes. Every pixel of such a configuration is computed in vector
// lanes (taps outside the image read the image zero point).
template <typename OutT>
bool neon_kernel_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                         const QuantizedPlan& plan);

// Rows [row_begin, row_end) of the N * Ho output rows, where neon_kernel_applies holds.
template <typename GridT, typename OutT>
void grid_sample_quantized_neon(const View4<const int8_t>& image, const View4<const GridT>& grid,
                                const View4<OutT>& output, const QuantizedPlan& plan,
                                int64_t row_begin, int64_t row_end);

// What the NEON kernel has computed since the process started (all threads), for tests and
// benchmarks that must know which path ran: output pixels, the pixels whose steps 1 and 2 took
// each form, and the bilinear pixels with a tap outside the image (their taps copied one by one,
// still computed in vector lanes).
enum NeonCounter : int {
  kNeonPixels = 0,
  kNeonCoordinatesInteger,  // int16 grid, bilinear, zeros or border: 32 x 32-bit products
  kNeonCoordinatesNearest,  // int16 grid, nearest, zeros or border: the exact integer rounding
  kNeonCoordinatesExact,    // int16 grid, any mode and padding: exact 64-bit lanes
  kNeonCoordinatesTable,    // int8 grid: a table of the scalar steps' 256 results
  kNeonEdgePixels,          // bilinear pixels with a tap outside the image
  kNeonCounterCount
};
void neon_counters(uint64_t counts[kNeonCounterCount]);

}  // namespace etkit::gridsampler
