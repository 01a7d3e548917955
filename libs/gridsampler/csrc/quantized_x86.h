// The vectorized x86 kernel of the integer contract: the same bits as the scalar kernel, eight
// output pixels at a time with AVX2, sixteen with AVX-512. Internal to the native library;
// quantized.cpp dispatches to it.
#pragma once

#include <cstdint>

#include "quantized.h"

namespace etkit::gridsampler {

// Whether this CPU has AVX2 and FMA (false on every other architecture).
bool avx2_supported();
// Whether it also has the AVX-512 subsets the wide passes use: F, BW, DQ, VL, VBMI, VNNI.
bool avx512_supported();

// Whether the vectorized kernel handles this configuration: bilinear; a 4-channel
// channels-last image of at least 2 x 2 pixels, below 2^14 on each side, whose plane spans less
// than 2^31 bytes; a channels-last output; float32 output, or int8 output within [-128, 127]
// (requantization shift >= 32). Any grid: int16 grids with zeros or border padding take the
// vectorized coordinate path, the rest a scalar one.
template <typename OutT>
bool x86_kernel_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                        const QuantizedPlan& plan);

// Rows [row_begin, row_end) of the N * Ho output rows, where x86_kernel_applies holds; with
// `avx512` (and avx512_supported), sixteen pixels at a time in 512-bit lanes where that applies.
template <typename GridT, typename OutT>
void grid_sample_quantized_x86(const View4<const int8_t>& image, const View4<const GridT>& grid,
                               const View4<OutT>& output, const QuantizedPlan& plan,
                               int64_t row_begin, int64_t row_end, bool avx512);

// Whether the general vectorized kernel (quantized_x86_any.cpp, AVX-512 or AVX2) handles this
// configuration: nearest sampling in every layout below, or bilinear sampling of any image but
// the 4-channel channels-last one x86_kernel_applies takes; planar images (x stride 1: NCHW, or
// one channel) into planar outputs, or channels-last images of 2, 3, 4 (nearest), 8 or a
// multiple of 16 channels into channels-last outputs; sides below 2^15 (bilinear: width at
// least 2; 3, 8 and 16k channels: height too), an image zero point within int8, and the int8
// output x86_kernel_applies needs.
// Without `avx512` (AVX2 only): the same, and channels-last bilinear images of any channel
// count from 2.
template <typename OutT>
bool x86_any_applies(const View4<const int8_t>& image, const View4<OutT>& output,
                     const QuantizedPlan& plan, bool avx512);

// Rows [row_begin, row_end) of the N * Ho output rows, where x86_any_applies holds.
template <typename GridT, typename OutT>
void grid_sample_quantized_x86_any(const View4<const int8_t>& image,
                                   const View4<const GridT>& grid, const View4<OutT>& output,
                                   const QuantizedPlan& plan, int64_t row_begin, int64_t row_end,
                                   bool avx512);

}  // namespace etkit::gridsampler
