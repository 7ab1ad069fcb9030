// Stage kernels against their host definitions, bit for bit: routing (route_reference), MXFP8
// quantization (quantize_mxfp8) and the combine's two thread mappings, on random and hostile inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu_test.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"
#include "k3moe/reference.h"
#include "kernels/combine.cuh"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe {
namespace {

MoePlan make_plan(const MoeConfig& config) {
  return MoePlan::create({config, 1024, Mode::Mxfp8, Activation::Situ, config.activation_params, {1, 0}, 0});
}

Routing gpu_route(const MoePlan& plan, const std::vector<float>& logits, const std::vector<float>& bias, int T) {
  const MoeConfig& c = plan.options().config;
  DeviceTensor dl = DeviceTensor::from_host(logits, {T, c.num_experts}, kF32, 0);
  DeviceTensor db = DeviceTensor::from_host(bias, {c.num_experts}, kF32, 0);
  DeviceTensor ids({T, c.top_k}, kI32, 0), weights({T, c.top_k}, kF32, 0);
  plan.route(*dl.dl(), *db.dl(), *ids.dl(), *weights.dl(), nullptr);
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
  return {T, c.top_k, ids.download<int32_t>(), weights.download<float>()};
}

TEST(RoutingKernel, EqualsReferenceBitwiseOnK3Shapes) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig config;  // 896 experts, top-16
  const MoePlan plan = make_plan(config);
  const int T = 1000;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(size_t(T) * config.num_experts), bias(config.num_experts);
  for (auto& v : logits) v = normal(rng);
  for (auto& v : bias) v = 0.1f * normal(rng);
  // Exact ties: a few tokens whose logits are all equal, and pairs of equal choices.
  for (int t = 0; t < 10; ++t)
    for (int e = 0; e < config.num_experts; ++e) logits[size_t(t) * config.num_experts + e] = 0.5f;
  const std::vector<float> flat_bias(config.num_experts, 0.0f);
  const Routing want = route_reference(logits, flat_bias, T, config);
  const Routing got = gpu_route(plan, logits, flat_bias, T);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.weights, want.weights);
  for (int k = 0; k < config.top_k; ++k) EXPECT_EQ(got.ids[k], k) << "all-equal choices go to the lowest ids";

  const Routing want_biased = route_reference(logits, bias, T, config);
  const Routing got_biased = gpu_route(plan, logits, bias, T);
  EXPECT_EQ(got_biased.ids, want_biased.ids);
  EXPECT_EQ(got_biased.weights, want_biased.weights);
}

TEST(RoutingKernel, NonFiniteLogitsGiveValidDistinctIdsAndFiniteWeights) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig config;
  const MoePlan plan = make_plan(config);
  const int T = 64, E = config.num_experts, K = config.top_k;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(size_t(T) * E), bias(E, 0.0f);
  for (auto& v : logits) v = normal(rng);
  const float hostile[] = {NAN, INFINITY, -INFINITY};
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      if ((t % 4 == 1 && e % 3 == 0) || t % 4 == 2 || (t % 4 == 3 && e < 40)) logits[size_t(t) * E + e] = hostile[(t + e) % 3];
  bias[7] = NAN;
  const Routing got = gpu_route(plan, logits, bias, T);
  const Routing want = route_reference(logits, bias, T, config);
  EXPECT_EQ(got.ids, want.ids);
  for (int t = 0; t < T; ++t) {
    std::vector<bool> seen(E, false);
    for (int k = 0; k < K; ++k) {
      const int id = got.ids[size_t(t) * K + k];
      ASSERT_TRUE(id >= 0 && id < E) << "token " << t << " slot " << k << " id " << id;
      EXPECT_FALSE(seen[id]) << "token " << t << " repeats expert " << id;
      seen[id] = true;
      EXPECT_TRUE(std::isfinite(got.weights[size_t(t) * K + k])) << "token " << t << " slot " << k;
    }
  }
}

TEST(QuantizeMxfp8Kernel, EqualsHostQuantizerBitwise) {
  K3MOE_REQUIRE_GPU();
  MoeConfig config;
  const MoePlan plan = make_plan(config);
  const int T = 37, H = config.hidden;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(T) * H);
  for (size_t i = 0; i < x.size(); ++i) {
    const float scale = std::ldexp(1.0f, int(i / 32 % 60) - 30);  // groups across 60 binades
    x[i] = float_to_bf16_bits(normal(rng) * scale);
  }
  for (int i = 0; i < 32; ++i) x[size_t(H) + i] = 0;                   // an all-zero group
  x[size_t(2) * H + 3] = float_to_bf16_bits(NAN);                      // NaN group
  x[size_t(3) * H + 40] = float_to_bf16_bits(-INFINITY);               // Inf group
  x[size_t(4) * H + 70] = float_to_bf16_bits(3.0e38f);                 // near bf16 max
  x[size_t(5) * H + 100] = 0x0001;                                     // a bf16 subnormal
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_bits_to_float(x[i]);
  const Mxfp8Matrix want = quantize_mxfp8(xf, T, H);

  DeviceTensor dx = DeviceTensor::from_host(x, {T, H}, kBf16, 0);
  DeviceTensor codes({T, H}, kU8, 0), scales({T, H / 128}, kI32, 0);
  plan.quantize_mxfp8(*dx.dl(), *codes.dl(), *scales.dl(), nullptr);
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(codes.download<uint8_t>(), want.codes);
  EXPECT_EQ(scales.download<uint8_t>(), want.scales);
}

TEST(CombineKernel, LaneGroupsAndThreadPerOutputsGiveTheSameBits) {
  K3MOE_REQUIRE_GPU();
  const int T = 70, K = 16, H = 256, splits = 2, rows = T * K;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> y(size_t(splits) * rows * H), w(size_t(T) * K);
  for (auto& v : y) v = normal(rng) * 1e3f;
  for (auto& v : w) v = normal(rng);
  std::vector<int32_t> slot_row(size_t(T) * K);
  for (int i = 0; i < T * K; ++i) slot_row[i] = (i % 5 == 3) ? -1 : int32_t((i * 7919) % rows);  // remote slots
  y[5] = NAN;  // one poisoned row element
  DeviceTensor dy = DeviceTensor::from_host(y, {int64_t(y.size())}, kF32, 0);
  DeviceTensor dw = DeviceTensor::from_host(w, {T, K}, kF32, 0);
  DeviceTensor ds = DeviceTensor::from_host(slot_row, {T, K}, kI32, 0);
  std::vector<std::vector<uint16_t>> outs;
  for (auto mapping : {kernels::CombineMapping::LaneGroups, kernels::CombineMapping::ThreadPerOutputs}) {
    DeviceTensor out({T, H}, kBf16, 0);
    kernels::CombineArgs a;
    a.y = static_cast<const float*>(dy.data());
    a.split_stride = int64_t(rows) * H;
    a.splits = splits;
    a.slot_row = static_cast<const int32_t*>(ds.data());
    a.weights = static_cast<const float*>(dw.data());
    a.out = static_cast<uint16_t*>(out.data());
    a.tokens = T;
    a.top_k = K;
    a.hidden = H;
    a.mapping = mapping;
    kernels::launch_combine(a, nullptr);
    K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
    outs.push_back(out.download<uint16_t>());
  }
  EXPECT_EQ(outs[0], outs[1]);
  // And a token by hand: the slots' split sums, weighted, added as a pairwise tree in slot order.
  for (int token : {0, 41}) {
    for (int h : {0, 5, 255}) {
      float t[K];
      for (int k = 0; k < K; ++k) {
        const int32_t row = slot_row[size_t(token) * K + k];
        t[k] = row < 0 ? 0.0f : w[size_t(token) * K + k] * (y[size_t(row) * H + h] + y[size_t(rows + row) * H + h]);
      }
      for (int width = 1; width < K; width *= 2)
        for (int k = 0; k < K; k += 2 * width) t[k] += t[k + width];
      const uint16_t want = float_to_bf16_bits(t[0]), got = outs[1][size_t(token) * H + h];
      EXPECT_TRUE(want == got || (std::isnan(t[0]) && std::isnan(bf16_bits_to_float(got))))
          << "token " << token << ", output " << h << ": host " << t[0] << ", kernel " << bf16_bits_to_float(got);
    }
  }
}

}  // namespace
}  // namespace k3moe
