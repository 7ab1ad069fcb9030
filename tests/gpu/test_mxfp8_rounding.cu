// The epilogues' MXFP8 rounding (hardware E4M3 conversion, kernels/mxfp4_fragments.cuh) against
// the host definition (formats.h), bitwise, over every E8M0 scale and values around every E4M3
// step, the saturation point, the subnormals, zeros and non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu_test.h"
#include "k3moe/formats.h"
#include "kernels/mxfp4_fragments.cuh"

namespace k3moe {
namespace {

// Values 2i and 2i + 1 share a scale and round as the epilogues round them: as a pair.
__global__ void round_all(const float* v, const uint8_t* s, float* out, int pairs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  float a = v[2 * i], b = v[2 * i + 1];
  kernels::Mxfp8Scale(s[2 * i]).round2(a, b);
  out[2 * i] = a;
  out[2 * i + 1] = b;
}

TEST(Mxfp8Rounding, HardwareConversionEqualsHostBitwise) {
  K3MOE_REQUIRE_GPU();
  // Values relative to the scale: every E4M3 magnitude, the midpoints between neighbours (ties),
  // one ulp either side of them, beyond 448, tiny, zeros, Inf and NaN.
  std::vector<float> unit;
  for (int code = 0; code < 0x7F; ++code) {
    const float a = e4m3_to_float(uint8_t(code)), b = e4m3_to_float(uint8_t(code + 1));
    const float mid = code + 1 < 0x7F ? 0.5f * (a + b) : 464.0f;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      unit.push_back(x);
      unit.push_back(-x);
    }
  }
  for (float x : {500.0f, 1e6f, 1e-12f, 0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    unit.push_back(x);
  ASSERT_EQ(unit.size() % 2, 0u) << "every pair of values must share its scale";
  std::vector<float> v;
  std::vector<uint8_t> s;
  for (int scale = 0; scale < 256; ++scale)
    for (float x : unit) {
      const float step = scale == 255 ? 1.0f : e8m0_to_float(uint8_t(scale));
      v.push_back(x * step);  // may leave fp32's range at the extreme scales: then Inf or 0, also checked
      s.push_back(uint8_t(scale));
    }
  const int n = int(v.size());
  const DeviceBuffer d_v = testing::to_device(v), d_s = testing::to_device(s);
  DeviceBuffer d_out(n * int64_t(sizeof(float)));
  round_all<<<(n / 2 + 255) / 256, 256>>>(d_v.get<float>(), d_s.get<uint8_t>(), d_out.get<float>(), n / 2);
  K3MOE_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = testing::to_host<float>(d_out);
  int failures = 0;
  for (int i = 0; i < n; ++i) {
    const float want = e4m3_to_float(float_to_e4m3(scale_down_by_e8m0(v[i], s[i]))) * e8m0_to_float(s[i]);
    const bool same = (std::isnan(want) && std::isnan(out[i])) || float_bits(want) == float_bits(out[i]);
    if (!same && ++failures <= 5)
      ADD_FAILURE() << "v = " << v[i] << " (bits " << std::hex << float_bits(v[i]) << std::dec << "), scale "
                    << int(s[i]) << ": host " << want << ", kernel " << out[i];
  }
  EXPECT_EQ(failures, 0) << "of " << n << " values";
}

}  // namespace
}  // namespace k3moe
