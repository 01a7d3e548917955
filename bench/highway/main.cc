// Checks the Highway kernel (hwy_sampler.cc) against the scalar kernel bit for bit, then times
// it against the hand-written AVX2 / AVX-512 kernels and the scalar one in one interleaved run.
//
//   hwy_bench [--check-only] [--bench-only] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hwy_sampler.h"
#include "quantized.h"

namespace gs = etkit::gridsampler;
namespace hb = etkit::hwybench;

namespace {

struct Image {
  int64_t n, c, h, w;
  std::vector<int8_t> data;  // channels-last
  gs::View4<const int8_t> view() const {
    return {data.data(), {n, c, h, w}, {h * w * c, 1, w * c, c}};
  }
};

struct Grid {
  int64_t n, h, w;
  std::vector<int16_t> data;
  gs::View4<const int16_t> view() const { return {data.data(), {n, h, w, 2}, {h * w * 2, w * 2, 2, 1}}; }
};

struct Output {
  int64_t n, c, h, w;
  std::vector<int8_t> data;
  Output(int64_t n_, int64_t c_, int64_t h_, int64_t w_)
      : n(n_), c(c_), h(h_), w(w_), data(static_cast<size_t>(n_ * c_ * h_ * w_)) {}
  gs::View4<int8_t> view() { return {data.data(), {n, c, h, w}, {h * w * c, 1, w * c, c}}; }
};

Image random_image(int64_t h, int64_t w, int32_t qmin, int32_t qmax, uint32_t seed) {
  Image image{1, 4, h, w, std::vector<int8_t>(static_cast<size_t>(4 * h * w))};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(qmin, qmax);
  for (auto& v : image.data) v = static_cast<int8_t>(dist(rng));
  return image;
}

// Every int16 value for x, in a 256 x 256 grid; y runs through every value too, in another order.
Grid exhaustive_grid() {
  Grid grid{1, 256, 256, std::vector<int16_t>(2 * 65536)};
  for (uint32_t i = 0; i < 65536; ++i) {
    grid.data[2 * i] = static_cast<int16_t>(static_cast<uint16_t>(i));
    grid.data[2 * i + 1] = static_cast<int16_t>(static_cast<uint16_t>(i * 40503u + 12345u));
  }
  return grid;
}

// bench/gridsampler_bench.py's smooth_flow_grid, quantized to SNORM16.
Grid smooth_flow_grid(int64_t h, int64_t w) {
  Grid grid{1, h, w, std::vector<int16_t>(static_cast<size_t>(2 * h * w))};
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      const float gy = -1.0f + 2.0f * static_cast<float>(y) / static_cast<float>(h - 1);
      const float gx = -1.0f + 2.0f * static_cast<float>(x) / static_cast<float>(w - 1);
      const float fx = gx + 0.01f * std::sin(gy * 3.1f) + 0.004f * std::cos(gx * 5.3f);
      const float fy = gy + 0.008f * std::cos(gx * 2.7f) - 0.003f * std::sin(gy * 4.1f);
      const auto q = [](float v) {
        return static_cast<int16_t>(std::clamp(std::nearbyint(v * 32767.0f), -32767.0f, 32767.0f));
      };
      grid.data[static_cast<size_t>(2 * (y * w + x))] = q(fx);
      grid.data[static_cast<size_t>(2 * (y * w + x) + 1)] = q(fy);
    }
  }
  return grid;
}

struct QSet {
  const char* name;
  gs::QuantParams image, grid, output;
};

const QSet kQSets[] = {
    {"snorm8/snorm16/snorm8", {1 / 127.0, 0, -127, 127}, {1 / 32767.0, 0, -32767, 32767},
     {1 / 127.0, 0, -127, 127}},
    {"zp image 3, out 1/64 zp -5 (wide requant)", {1 / 127.0, 3, -128, 127},
     {1 / 32767.0, 0, -32768, 32767}, {1 / 64.0, -5, -128, 127}},
    {"out 2/127, range [-100, 100] (narrow m=1)", {1 / 127.0, 0, -127, 127},
     {1 / 32767.0, 0, -32767, 32767}, {2 / 127.0, 0, -100, 100}},
    {"image zp -128, grid 2/32767 zp 100", {1 / 255.0, -128, -128, 127},
     {2 / 32767.0, 100, -32768, 32767}, {1 / 255.0, -128, -128, 127}},
    {"scales 0.02 / 0.013, out zp 7 (wide)", {0.02, 0, -128, 127}, {1 / 32767.0, -7, -32768, 32767},
     {0.013, 7, -128, 127}},
    {"out 3/127 (narrow m=3)", {1 / 128.0, 1, -128, 127}, {1 / 16384.0, 0, -32768, 32767},
     {3 / 512.0, 0, -128, 127}},
};

const char* padding_name(gs::Padding p) {
  return p == gs::Padding::kZeros ? "zeros" : (p == gs::Padding::kBorder ? "border" : "reflection");
}

int run_checks(const std::vector<hb::Target>& targets, const std::vector<const char*>& names) {
  const Grid grid = exhaustive_grid();
  const int64_t sizes[][2] = {{1080, 1920}, {2, 2}, {7, 5}, {33, 100}, {3, 4096}};
  int64_t cases = 0, pixels = 0, failures = 0;
  for (const QSet& qs : kQSets) {
    for (const auto& size : sizes) {
      const Image image = random_image(size[0], size[1], qs.image.quant_min, qs.image.quant_max,
                                       static_cast<uint32_t>(size[0] * 131 + size[1]));
      for (const gs::Padding padding :
           {gs::Padding::kZeros, gs::Padding::kBorder, gs::Padding::kReflection}) {
        for (const bool align : {false, true}) {
          gs::QuantizedPlan plan{};
          const gs::SampleParams params{gs::Mode::kBilinear, padding, align};
          if (const char* error =
                  gs::plan_quantized(params, qs.image, qs.grid, gs::GridType::kInt16, false,
                                     qs.output, image.h, image.w, &plan)) {
            std::printf("  skip %s %lldx%lld %s: %s\n", qs.name, (long long)image.h,
                        (long long)image.w, padding_name(padding), error);
            continue;
          }
          Output expected(1, 4, grid.h, grid.w);
          gs::grid_sample_quantized<int16_t, int8_t>(image.view(), grid.view(), expected.view(),
                                                     plan, 0, grid.h, gs::Isa::kScalar);
          for (size_t k = 0; k < targets.size(); ++k) {
            Output got(1, 4, grid.h, grid.w);
            if (!hb::hwy_applies(image.view(), got.view(), plan)) {
              std::printf("  FAIL: the Highway kernel does not take %s\n", qs.name);
              ++failures;
              continue;
            }
            hb::hwy_sample_rows(image.view(), grid.view(), got.view(), plan, 0, grid.h,
                                targets[k]);
            int64_t bad = 0;
            for (size_t j = 0; j < got.data.size(); ++j) bad += got.data[j] != expected.data[j];
            ++cases;
            pixels += grid.h * grid.w;
            if (bad != 0) {
              ++failures;
              std::printf("  FAIL %s: %s, %lldx%lld, %s, align_corners=%d: %lld bytes differ\n",
                          names[k], qs.name, (long long)image.h, (long long)image.w,
                          padding_name(padding), align, (long long)bad);
            }
          }
        }
      }
    }
  }
  // The benchmark's own input, every target.
  const Image image = random_image(1080, 1920, -127, 127, 7);
  const Grid flow = smooth_flow_grid(1080, 1920);
  for (const gs::Padding padding : {gs::Padding::kZeros, gs::Padding::kBorder}) {
    gs::QuantizedPlan plan{};
    gs::plan_quantized({gs::Mode::kBilinear, padding, false}, kQSets[0].image, kQSets[0].grid,
                       gs::GridType::kInt16, false, kQSets[0].output, 1080, 1920, &plan);
    Output expected(1, 4, 1080, 1920);
    gs::grid_sample_quantized<int16_t, int8_t>(image.view(), flow.view(), expected.view(), plan, 0,
                                               1080, gs::Isa::kScalar);
    for (size_t k = 0; k < targets.size(); ++k) {
      Output got(1, 4, 1080, 1920);
      hb::hwy_sample_rows(image.view(), flow.view(), got.view(), plan, 0, 1080, targets[k]);
      ++cases;
      pixels += 1080 * 1920;
      if (got.data != expected.data) {
        ++failures;
        std::printf("  FAIL %s: 1080p smooth flow, %s\n", names[k], padding_name(padding));
      }
    }
  }
  std::printf("bit-identity vs scalar: %lld cases (%.1f M output pixels, every int16 grid value "
              "on both axes), %lld failing\n",
              (long long)cases, static_cast<double>(pixels) / 1e6, (long long)failures);
  return failures == 0 ? 0 : 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_bench(int rounds, const std::vector<hb::Target>& targets,
               const std::vector<const char*>& names) {
  const int64_t h = 1080, w = 1920;
  const Image image = random_image(h, w, -127, 127, 0);
  const Grid grid = smooth_flow_grid(h, w);
  gs::QuantizedPlan plan{};
  gs::plan_quantized({gs::Mode::kBilinear, gs::Padding::kBorder, false}, kQSets[0].image,
                     kQSets[0].grid, gs::GridType::kInt16, false, kQSets[0].output, h, w, &plan);
  Output out(1, 4, h, w);
  struct Variant {
    std::string name;
    std::function<void()> run;
    std::vector<double> times;
  };
  std::vector<Variant> variants;
  const auto add_isa = [&](const char* name, gs::Isa isa) {
    if (gs::cpu_supports(isa)) {
      variants.push_back({name, [&, isa] {
                            gs::grid_sample_quantized<int16_t, int8_t>(
                                image.view(), grid.view(), out.view(), plan, 0, h, isa);
                          }, {}});
    }
  };
  add_isa("scalar", gs::Isa::kScalar);
  add_isa("hand-written AVX2", gs::Isa::kAvx2);
  add_isa("hand-written AVX-512", gs::Isa::kAvx512);
  for (size_t k = 0; k < targets.size(); ++k) {
    const hb::Target target = targets[k];
    variants.push_back({std::string("Highway ") + names[k], [&, target] {
                          hb::hwy_sample_rows(image.view(), grid.view(), out.view(), plan, 0, h,
                                              target);
                        }, {}});
  }
  for (auto& v : variants) v.run();  // warm up
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) {
      const auto start = std::chrono::steady_clock::now();
      v.run();
      v.times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  const double mpix = static_cast<double>(h * w) / 1e6;
  std::printf("\n1x4x1080x1920 int8 channels-last, int16 SNORM16 grid (smooth flow), border, "
              "bilinear, int8 out; one thread; median of %d interleaved rounds\n\n",
              rounds);
  std::printf("| kernel | ms | Mpix/s | vs scalar |\n|---|---:|---:|---:|\n");
  const double scalar = median(variants[0].times);
  std::vector<double> medians;
  for (auto& v : variants) {
    const double t = median(v.times);
    medians.push_back(t);
    std::printf("| %s | %.2f | %.0f | %.2fx |\n", v.name.c_str(), t * 1e3, mpix / t, scalar / t);
  }
  const auto find = [&](const std::string& name) -> double {
    for (size_t k = 0; k < variants.size(); ++k) {
      if (variants[k].name == name) return medians[k];
    }
    return 0;
  };
  const double hw2 = find("hand-written AVX2"), hw512 = find("hand-written AVX-512");
  const double hy2 = find("Highway AVX2"), hy3 = find("Highway AVX3");
  std::printf("\n");
  if (hw2 > 0 && hy2 > 0) {
    std::printf("Highway AVX2 / hand-written AVX2 throughput: %.2f\n", hw2 / hy2);
  }
  if (hw512 > 0 && hy3 > 0) {
    std::printf("Highway AVX3 / hand-written AVX-512 throughput: %.2f\n", hw512 / hy3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool check = true, bench = true;
  int rounds = 21;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--check-only")) bench = false;
    else if (!std::strcmp(argv[i], "--bench-only")) check = false;
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
  }
  std::vector<hb::Target> targets;
  std::vector<const char*> names;
  const std::pair<hb::Target, const char*> all[] = {
      {hb::Target::kAvx2, "AVX2"},     {hb::Target::kAvx3, "AVX3"},
      {hb::Target::kAvx3Dl, "AVX3_DL"}, {hb::Target::kSse4, "SSE4"},
      {hb::Target::kNeon, "NEON"},     {hb::Target::kSve, "SVE"},
      {hb::Target::kEmu128, "EMU128"}};
  for (const auto& [target, name] : all) {
    if (hb::target_available(target)) {
      targets.push_back(target);
      names.push_back(name);
    }
  }
  std::printf("Highway targets in this binary that this CPU runs:");
  for (const char* name : names) std::printf(" %s", name);
  std::printf(" (dynamic dispatch picks %s)\n", hb::best_target_name());
  int rc = 0;
  if (check) rc = run_checks(targets, names);
  if (bench) run_bench(rounds, targets, names);
  return rc;
}
