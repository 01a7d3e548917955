// A Google Highway (1.0.3 API) version of the integer grid sampler's hot case, for measuring
// against the hand-written AVX2 / AVX-512 kernels (libs/gridsampler/csrc/quantized_x86.cpp):
// bilinear sampling of a 4-channel channels-last int8 image with an int16 grid into an int8
// channels-last output. It computes the scalar steps' bits (quantized_steps.h); configurations
// outside its fast path run the scalar steps per pixel. Bench code, not part of the library.
#pragma once

#include <cstdint>

#include "quantized.h"

namespace etkit::hwybench {

using gridsampler::QuantizedPlan;
using gridsampler::View4;

// Which Highway target to run: the best this CPU has (dynamic dispatch), or one pinned.
enum class Target : int { kBest = 0, kAvx2, kAvx3, kAvx3Dl, kSse4, kNeon, kSve, kEmu128 };

// Whether this binary holds `target` and the CPU can run it.
bool target_available(Target target);
// The name of the target HWY_DYNAMIC_DISPATCH picks.
const char* best_target_name();

// Whether the Highway kernel takes this configuration (else callers use the scalar kernel):
// bilinear, a 4-channel channels-last image (x stride 4, channel stride 1, row stride a multiple
// of 4) of 2 .. 2^14 - 1 pixels a side and below 2^31 bytes, an int8 channels-last output
// within [-128, 127], image zero point within int8, requantization shift >= 32.
bool hwy_applies(const View4<const int8_t>& image, const View4<int8_t>& output,
                 const QuantizedPlan& plan);

// Rows [row_begin, row_end) of the N * Ho output rows, where hwy_applies holds.
void hwy_sample_rows(const View4<const int8_t>& image, const View4<const int16_t>& grid,
                     const View4<int8_t>& output, const QuantizedPlan& plan, int64_t row_begin,
                     int64_t row_end, Target target = Target::kBest);

}  // namespace etkit::hwybench
