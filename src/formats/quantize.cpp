#include "k3moe/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "k3moe/error.h"
#include "k3moe/formats.h"

namespace k3moe {
namespace {

constexpr int kMxGroup = 32;
constexpr int kNvGroup = 16;

void check_matrix(std::span<const float> values, int rows, int cols, int group, const char* what) {
  K3MOE_CHECK(rows >= 0 && cols >= 0, what, ": rows and cols must be >= 0, got [", rows, ", ", cols, "]");
  K3MOE_CHECK(cols % group == 0, what, ": cols must be a multiple of ", group, ", got ", cols);
  K3MOE_CHECK(values.size() == size_t(rows) * size_t(cols), what, ": expected ", int64_t(rows) * cols,
              " values for [", rows, ", ", cols, "], got ", values.size());
}

float group_amax(const float* values, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = abs_f(values[i]);
    if (!is_finite(a)) return a;  // NaN or Inf decides the scale
    amax = std::max(amax, a);
  }
  return amax;
}

}  // namespace

uint8_t quantize_mxfp4_group(const float* values, int n, uint8_t* codes) {
  const uint8_t s = mx_scale_round_up(group_amax(values, n), kE2M1Max);
  for (int i = 0; i < n; ++i) codes[i] = s == kE8M0NaN ? 0 : float_to_e2m1(scale_down_by_e8m0(values[i], s));
  return s;
}

uint8_t quantize_mxfp8_group(const float* values, int n, uint8_t* codes) {
  const uint8_t s = mx_scale_round_up(group_amax(values, n), kE4M3Max);
  for (int i = 0; i < n; ++i) codes[i] = float_to_e4m3(scale_down_by_e8m0(values[i], s));
  return s;
}

Mxfp4Matrix quantize_mxfp4(std::span<const float> values, int rows, int cols) {
  check_matrix(values, rows, cols, kMxGroup, "quantize_mxfp4");
  Mxfp4Matrix m{rows, cols, std::vector<uint8_t>(size_t(rows) * cols / 2),
                std::vector<uint8_t>(size_t(rows) * cols / kMxGroup)};
  uint8_t codes[kMxGroup];
  for (int64_t g = 0; g < int64_t(rows) * cols / kMxGroup; ++g) {
    m.scales[g] = quantize_mxfp4_group(values.data() + g * kMxGroup, kMxGroup, codes);
    for (int j = 0; j < kMxGroup / 2; ++j) m.packed[g * kMxGroup / 2 + j] = pack_e2m1(codes[2 * j], codes[2 * j + 1]);
  }
  return m;
}

Mxfp8Matrix quantize_mxfp8(std::span<const float> values, int rows, int cols) {
  check_matrix(values, rows, cols, kMxGroup, "quantize_mxfp8");
  Mxfp8Matrix m{rows, cols, std::vector<uint8_t>(size_t(rows) * cols),
                std::vector<uint8_t>(size_t(rows) * cols / kMxGroup)};
  for (int64_t g = 0; g < int64_t(rows) * cols / kMxGroup; ++g)
    m.scales[g] = quantize_mxfp8_group(values.data() + g * kMxGroup, kMxGroup, m.codes.data() + g * kMxGroup);
  return m;
}

Nvfp4Matrix quantize_nvfp4(std::span<const float> values, int rows, int cols) {
  check_matrix(values, rows, cols, kNvGroup, "quantize_nvfp4");
  Nvfp4Matrix m{rows, cols, std::vector<uint8_t>(size_t(rows) * cols / 2),
                std::vector<uint8_t>(size_t(rows) * cols / kNvGroup), 1.0f};
  const float amax = values.empty() ? 0.0f : group_amax(values.data(), int64_t(values.size()));
  K3MOE_CHECK(is_finite(amax), "quantize_nvfp4: the tensor holds NaN or Inf (NVFP4 has no NaN scale)");
  // NOTE: at least the smallest float: a tensor of tiny non-zero values keeps a scale it can be
  // decoded with (amax / 2688 underflows to 0 below ~4e-42).
  if (amax > 0.0f) m.global_scale = std::max(amax / (kE4M3Max * kE2M1Max), std::numeric_limits<float>::denorm_min());
  for (int64_t g = 0; g < int64_t(rows) * cols / kNvGroup; ++g) {
    const float* v = values.data() + g * kNvGroup;
    const uint8_t s = float_to_ue4m3(group_amax(v, kNvGroup) / (kE2M1Max * m.global_scale));
    m.scales[g] = s;
    const float block = ue4m3_to_float(s) * m.global_scale;
    for (int j = 0; j < kNvGroup / 2; ++j) {
      const uint8_t even = block > 0.0f ? float_to_e2m1(v[2 * j] / block) : 0;
      const uint8_t odd = block > 0.0f ? float_to_e2m1(v[2 * j + 1] / block) : 0;
      m.packed[g * kNvGroup / 2 + j] = pack_e2m1(even, odd);
    }
  }
  return m;
}

double Mxfp4Matrix::at(int r, int c) const {
  const size_t i = size_t(r) * cols + c;
  return double(e2m1_to_float(e2m1_nibble(packed[i / 2], c))) * double(e8m0_to_float(scales[i / kMxGroup]));
}

double Mxfp8Matrix::at(int r, int c) const {
  const size_t i = size_t(r) * cols + c;
  return double(e4m3_to_float(codes[i])) * double(e8m0_to_float(scales[i / kMxGroup]));
}

double Nvfp4Matrix::at(int r, int c) const {
  const size_t i = size_t(r) * cols + c;
  return double(e2m1_to_float(e2m1_nibble(packed[i / 2], c))) * double(ue4m3_to_float(scales[i / kNvGroup])) *
         double(global_scale);
}

}  // namespace k3moe
