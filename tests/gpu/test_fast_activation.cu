// The epilogues' fp32 activations (kernels/fast_activation.cuh) against the float64 formulas of
// activation.h, over a dense grid of gate and up values: the error bound stated in the header.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "gpu_test.h"
#include "kernels/fast_activation.cuh"

namespace k3moe {
namespace {

__global__ void evaluate(Activation kind, ActivationParams p, const float* g, const float* u, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = kernels::fast_activation(kind, p, g[i], u[i]);
}

// 0, +-Inf, NaN and +-10^e for e in [-30, 4] in steps of 1/16 decade.
std::vector<float> grid() {
  std::vector<float> v{0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  for (int i = -30 * 16; i <= 4 * 16; ++i) {
    const float x = float(std::pow(10.0, i / 16.0));
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

class FastActivation : public ::testing::TestWithParam<Activation> {};

TEST_P(FastActivation, WithinFourMillionthsOfFloat64) {
  K3MOE_REQUIRE_GPU();
  const Activation kind = GetParam();
  const ActivationParams p;
  const std::vector<float> axis = grid();
  std::vector<float> g, u;
  for (float a : axis)
    for (float b : axis) {
      g.push_back(a);
      u.push_back(b);
    }
  const int n = int(g.size());
  const DeviceBuffer d_g = testing::to_device(g), d_u = testing::to_device(u);
  DeviceBuffer d_out(n * int64_t(sizeof(float)));
  evaluate<<<(n + 255) / 256, 256>>>(kind, p, d_g.get<float>(), d_u.get<float>(), d_out.get<float>(), n);
  K3MOE_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = testing::to_host<float>(d_out);

  constexpr double kRel = 4e-6;
  double worst = 0.0;
  int failures = 0;
  for (int i = 0; i < n; ++i) {
    // NOTE: where sigmoid(g) underflows even float's subnormals, float gives 0 * Inf = NaN for an
    // infinite u, float64 a signed Inf: a range difference of the formats, not of the kernel.
    const double sigmoid_g = 1.0 / (1.0 + std::exp(-double(g[i])));
    if (kind == Activation::Swiglu && std::isinf(u[i]) && sigmoid_g < FLT_TRUE_MIN) continue;
    const double ref = apply_activation<double>(kind, p, g[i], u[i]);
    const double got = out[i];
    bool ok;
    if (std::isnan(ref)) {
      ok = std::isnan(got);
    } else if (std::fabs(ref) > FLT_MAX) {
      ok = got == ref * std::numeric_limits<double>::infinity();  // overflows to the same infinity
    } else {
      // Below the normal floats the kernel flushes to zero: an absolute floor of FLT_MIN.
      const double err = std::fabs(got - ref);
      const double bound = kRel * std::fabs(ref) + FLT_MIN;
      ok = err <= bound;
      worst = std::max(worst, err / bound);
    }
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << to_string(kind) << "(g = " << g[i] << ", u = " << u[i] << "): float64 " << ref << ", kernel "
                    << got;
  }
  EXPECT_EQ(failures, 0) << "of " << n << " inputs";
  std::printf("  %s: worst error %.3g of the bound over %d inputs\n", std::string(to_string(kind)).c_str(), worst, n);
}

INSTANTIATE_TEST_SUITE_P(Gpu, FastActivation,
                         ::testing::Values(Activation::Situ, Activation::Swiglu, Activation::SwigluOai));

}  // namespace
}  // namespace k3moe
