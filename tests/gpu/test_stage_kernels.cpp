// Stage kernels against their host definitions, bit for bit: routing (route_reference), MXFP8
// quantization (quantize_mxfp8), the permutation's two kernels and the combine's two thread
// mappings, on random and hostile inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"
#include "k3moe/reference.h"
#include "kernels/activation.cuh"
#include "kernels/combine.cuh"
#include "kernels/expert_gemm.cuh"
#include "kernels/permute.cuh"
#include "kernels/quantize_mxfp8.cuh"
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

// Expert counts and K across the kernel's range: a warp with fewer than K experts (or none),
// K = E, K = 1, and the limits (1024 experts, K = 32), with ties among equal choices.
TEST(RoutingKernel, EqualsReferenceBitwiseAcrossExpertCountsAndK) {
  K3MOE_REQUIRE_GPU();
  const int shapes[][2] = {{28, 16}, {16, 16}, {8, 1}, {100, 7}, {257, 32}, {1024, 32}, {1024, 1}, {300, 20}};
  for (const auto& [E, K] : shapes) {
    MoeConfig config;
    config.num_experts = E;
    config.top_k = K;
    const MoePlan plan = make_plan(config);
    const int T = 200;
    std::mt19937_64 rng(uint64_t(E) * 131 + K);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits(size_t(T) * E), bias(E);
    for (auto& v : logits) v = normal(rng);
    for (auto& v : bias) v = 0.01f * normal(rng);
    for (int t = 0; t < T; t += 7)  // rounded logits: many equal choices
      for (int e = 0; e < E; ++e) logits[size_t(t) * E + e] = std::round(logits[size_t(t) * E + e]);
    for (int t = 3; t < T; t += 11)
      for (int e = 0; e < E; ++e) logits[size_t(t) * E + e] = -1.0f;
    std::vector<float> tie_bias = bias;
    for (int e = 0; e < E; e += 2) tie_bias[e] = 0.0f;
    for (const auto* b : {&bias, &tie_bias}) {
      const Routing want = route_reference(logits, *b, T, config);
      const Routing got = gpu_route(plan, logits, *b, T);
      EXPECT_EQ(got.ids, want.ids) << "E = " << E << ", K = " << K;
      EXPECT_EQ(got.weights, want.weights) << "E = " << E << ", K = " << K;
    }
  }
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
  EXPECT_EQ(got.weights, want.weights);  // bit-exact here too: a NaN score weighs 0 in both
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

TEST(DequantizeMxfp8Kernel, EveryCodeTimesEveryKindOfScaleEqualsTheHost) {
  K3MOE_REQUIRE_GPU();
  // Every E4M3 code (NaN included) in every group, under scales from the smallest to NaN.
  const std::vector<uint8_t> scale_values = {0, 1, 100, 120, 127, 128, 135, 200, 254, 255};
  const int groups_per_token = 8, H = 32 * groups_per_token;
  const int T = int(scale_values.size()) * 256 / H;  // 8 groups of 32 codes per scale
  std::vector<uint8_t> codes(size_t(T) * H), scales(size_t(T) * groups_per_token);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i % 256);
  for (size_t g = 0; g < scales.size(); ++g) scales[g] = scale_values[g / 8 % scale_values.size()];
  DeviceBuffer d_codes = testing::to_device(codes), d_scales = testing::to_device(scales);
  DeviceBuffer d_out(codes.size() * 2);
  kernels::launch_dequantize_mxfp8(d_codes.get<uint8_t>(), d_scales.get<uint8_t>(), T, H, d_out.get<uint16_t>(),
                                   nullptr);
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = testing::to_host<uint16_t>(d_out);
  for (size_t i = 0; i < codes.size(); ++i) {
    const float want = e4m3_to_float(codes[i]) * e8m0_to_float(scales[i / 32]);
    const float value = bf16_bits_to_float(got[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(value)) << "code " << int(codes[i]) << " scale " << int(scales[i / 32]);
    } else {
      ASSERT_EQ(got[i], float_to_bf16_bits(want)) << "code " << int(codes[i]) << " scale " << int(scales[i / 32]);
    }
  }
}

// KernelChoice::activation_beside_gemm1 lets GEMM2 start in GEMM1's tail only if the activation's
// CTAs (activation_ctas_beside_gemm1: 2 of the 2-split kernel, 1 of the other) are resident next to
// the three CTAs of the 8-token GEMM1 (either unit size) on every SM (registers are allocated per
// warp, in steps of 8 per thread; shared memory with a reserve per CTA); a kernel change that grows either kernel past
// that would keep the results and silently lose the overlap (heuristics.cpp). The arithmetic counts
// all of an SM's shared memory, which holds only where GEMM1 asks for the largest carveout: left to
// the driver, three 128-row CTAs got 196 KB on an H100 and room for one activation CTA (Session 65).
TEST(ActivationStage, ItsCtasFitBesideThreeEightTokenGemm1Ctas) {
  K3MOE_REQUIRE_GPU();
  int device = 0, registers = 0, smem = 0, threads = 0, reserved = 0;
  K3MOE_CUDA_CHECK(cudaGetDevice(&device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&registers, cudaDevAttrMaxRegistersPerMultiprocessor, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const auto cta_registers = [](const cudaFuncAttributes& a, int cta_threads) {
    return (cta_threads + 31) / 32 * 32 * ((a.numRegs + 7) / 8 * 8);
  };
  kernels::configure_expert_gemm_kernels();
  const int gemm_ctas = kernels::gemm_ctas_per_sm(kernels::TokenTile::T8);
  ASSERT_EQ(gemm_ctas, 3);
  const int act_threads = 256;
  for (const int unit_rows : {kernels::kGemmRowsPerCta, kernels::kGemmHalfUnitRows})
    for (const int splits : {2, kernels::kMaxActivationSplits}) {
      SCOPED_TRACE(::testing::Message() << "units of " << unit_rows << " rows");
      size_t gemm_dynamic = 0;
      const cudaFuncAttributes gemm =
          kernels::expert_gemm1_split_attributes(kernels::TokenTile::T8, unit_rows, &gemm_dynamic);
      EXPECT_EQ(gemm.preferredShmemCarveout, int(cudaSharedmemCarveoutMaxShared));
      const cudaFuncAttributes act = kernels::activation_kernel_attributes(splits);
      const int act_ctas = kernels::activation_ctas_beside_gemm1(splits);
      EXPECT_LE(gemm_ctas * cta_registers(gemm, gemm.maxThreadsPerBlock) + act_ctas * cta_registers(act, act_threads),
                registers)
          << splits << " splits: GEMM1 " << gemm.numRegs << " registers x " << gemm.maxThreadsPerBlock
          << " threads, " << act_ctas << " activation CTAs of " << act.numRegs << " x " << act_threads;
      EXPECT_LE(gemm_ctas * gemm.maxThreadsPerBlock + act_ctas * act_threads, threads) << splits << " splits";
      const size_t gemm_smem = gemm_ctas * (gemm_dynamic + gemm.sharedSizeBytes + reserved);
      EXPECT_LE(gemm_smem + act_ctas * (act.sharedSizeBytes + reserved), size_t(smem))
          << splits << " splits: GEMM1 " << gemm_dynamic + gemm.sharedSizeBytes << " bytes, activation "
          << act.sharedSizeBytes;
    }
}

// The stage indexes its items in 32 bits; more rows than that hold are refused before any launch.
TEST(ActivationStage, RefusesMoreRowsThanItsIndicesHold) {
  kernels::ActivationArgs big;
  big.intermediate = 3072;
  big.sm_count = 132;
  big.max_rows = int((int64_t(1) << 31) / (big.intermediate / 4));  // just under 2^31 items
  try {
    kernels::launch_activation(big, nullptr);
    ADD_FAILURE() << "launch_activation took " << big.max_rows << " rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(big.max_rows) + " rows x I / 4"), std::string::npos) << e.what();
  }
}

// The three mappings give the same bits (tokens with some, all or none of their slots local), and
// the host's tree, with GEMM2's K kept whole or split.
void check_combine_mappings(int splits) {
  SCOPED_TRACE("splits " + std::to_string(splits));
  const int T = 70, K = 16, H = 256, rows = T * K;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> y(size_t(splits) * rows * H), w(size_t(T) * K);
  for (auto& v : y) v = normal(rng) * 1e3f;
  for (auto& v : w) v = normal(rng);
  std::vector<int32_t> slot_row(size_t(T) * K);
  for (int i = 0; i < T * K; ++i) slot_row[i] = (i % 5 == 3) ? -1 : int32_t((i * 7919) % rows);  // remote slots
  for (int i = 16 * K; i < 20 * K; ++i) slot_row[i] = int32_t((i * 7919) % rows);  // tokens 16-19: every slot local
  for (int i = 20 * K; i < 25 * K; ++i) slot_row[i] = -1;  // tokens 20-24: one or two local slots
  slot_row[20 * K + 5] = 100;
  slot_row[21 * K + 2] = 101, slot_row[21 * K + 3] = 102;  // siblings
  slot_row[22 * K + 1] = 103, slot_row[22 * K + 9] = 104;  // halves of the tree
  slot_row[23 * K + 4] = 105, slot_row[23 * K + 6] = 106;
  slot_row[24 * K + 3] = 107;  // a -0 term: w = -1, a zero row
  w[24 * K + 3] = -1.0f;
  for (int s = 0; s < splits; ++s)
    for (int h = 0; h < H; ++h) y[(size_t(s) * rows + 107) * H + h] = 0.0f;
  for (int i = 30 * K; i < 31 * K; ++i) slot_row[i] = -1;  // token 30: none
  y[5] = NAN;  // one poisoned row element
  DeviceTensor dy = DeviceTensor::from_host(y, {int64_t(y.size())}, kF32, 0);
  DeviceTensor dw = DeviceTensor::from_host(w, {T, K}, kF32, 0);
  DeviceTensor ds = DeviceTensor::from_host(slot_row, {T, K}, kI32, 0);
  std::vector<std::vector<uint16_t>> outs;
  for (auto mapping : {kernels::CombineMapping::LaneGroups, kernels::CombineMapping::ThreadPerOutputs,
                       kernels::CombineMapping::TokenWarps}) {
    DeviceTensor out({T, H}, kBf16, 0);
    // NaN-filled: a mapping that wrote nothing cannot pass on the previous mapping's freed output.
    K3MOE_CUDA_CHECK(cudaMemset(out.data(), 0xFF, size_t(out.bytes())));
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
  EXPECT_EQ(outs[0], outs[2]);
  // And a token by hand: the slots' split sums, weighted, added as a pairwise tree in slot order.
  for (int token : {0, 17, 20, 21, 22, 23, 24, 30, 41}) {
    for (int h : {0, 5, 255}) {
      float t[K];
      for (int k = 0; k < K; ++k) {
        const int32_t row = slot_row[size_t(token) * K + k];
        t[k] = 0.0f;
        if (row < 0) continue;
        float sum = y[size_t(row) * H + h];
        for (int s = 1; s < splits; ++s) sum += y[(size_t(s) * rows + row) * H + h];
        t[k] = w[size_t(token) * K + k] * sum;
      }
      for (int width = 1; width < K; width *= 2)
        for (int k = 0; k < K; k += 2 * width) t[k] += t[k + width];
      const uint16_t want = float_to_bf16_bits(t[0]), got = outs[1][size_t(token) * H + h];
      EXPECT_TRUE(want == got || (std::isnan(t[0]) && std::isnan(bf16_bits_to_float(got))))
          << "token " << token << ", output " << h << ": host " << t[0] << ", kernel " << bf16_bits_to_float(got);
    }
  }
}

TEST(CombineKernel, LaneGroupsAndThreadPerOutputsGiveTheSameBits) {
  K3MOE_REQUIRE_GPU();
  for (int splits : {1, 2, 3, 8}) check_combine_mappings(splits);  // each of the kernels' split bounds
}

TEST(PermuteKernel, EveryKernelGivesTheHostSchedule) {
  K3MOE_REQUIRE_GPU();
  kernels::configure_permute_kernel();
  struct Case {
    int tokens, top_k, first_expert, num_local, tile_rows;
  };
  // Shapes of one rank on each side of the kernels' limits (512 and 8192 slots) and prefill's
  // (local28 T = 4096, ep16 T = 8192: many rounds per warp of the large kernel's blocks); ids
  // include -1, other ranks' experts and values outside [0, 896); 1024 local experts, every id local.
  for (const Case c : {Case{1, 16, 28, 28, 8}, Case{8, 16, 0, 28, 8}, Case{32, 16, 56, 56, 16}, Case{32, 16, 0, 28, 32},
                       Case{5, 3, 2, 40, 8}, Case{33, 16, 0, 28, 8}, Case{256, 16, 56, 56, 8}, Case{512, 16, 0, 56, 16},
                       Case{513, 16, 28, 28, 128}, Case{1000, 7, 3, 5, 64}, Case{300, 16, 0, 1024, 8},
                       Case{4096, 16, 0, 28, 128}, Case{8192, 16, 56, 56, 128}}) {
    const int slots = c.tokens * c.top_k;
    std::mt19937_64 rng(uint64_t(slots) * 31 + c.num_local);
    std::vector<int32_t> ids(static_cast<size_t>(slots));
    for (auto& id : ids) {
      const uint64_t r = rng() % 10;
      id = c.num_local == 1024 ? int32_t(rng() % 1024)
           : r == 0          ? -1
           : r == 1          ? int32_t(900 + rng() % 100)
           : r < 6           ? int32_t(c.first_expert + rng() % 5)
                             : int32_t(rng() % 896);
    }
    // The host's schedule: each local expert's rows in slot order.
    std::vector<std::vector<int>> by_expert(size_t(c.num_local));
    for (int s = 0; s < slots; ++s)
      if (ids[s] >= c.first_expert && ids[s] < c.first_expert + c.num_local) by_expert[ids[s] - c.first_expert].push_back(s);
    std::vector<int32_t> want_offset{0}, want_row_token, want_slot_row(size_t(slots), -1);
    std::vector<int4> want_tiles;
    for (int e = 0; e < c.num_local; ++e) {
      const int first = want_offset.back(), count = int(by_expert[e].size());
      for (int i = 0; i < count; ++i) {
        want_slot_row[by_expert[e][i]] = first + i;
        want_row_token.push_back(by_expert[e][i] / c.top_k);
      }
      for (int t = 0; t * c.tile_rows < count; ++t)
        want_tiles.push_back({e, first + t * c.tile_rows, std::min(c.tile_rows, count - t * c.tile_rows), 0});
      want_offset.push_back(first + count);
    }
    // The MXFP8 rounding that rides in the launch (blocks 1..): the same bits as its own kernel's,
    // from bf16 (odd kernels) and from the codes (even).
    constexpr int kH = 96;
    std::vector<uint16_t> x(size_t(c.tokens) * kH);
    for (auto& v : x) v = float_to_bf16_bits(std::ldexp(float(int(rng() % 2001) - 1000), int(rng() % 40) - 20));
    DeviceBuffer d_x = testing::to_device(x), want_codes(x.size()), want_scales(x.size() / 32),
                 want_dequant(2 * x.size());
    const kernels::Mxfp8Buffers want{want_codes.get<uint8_t>(), want_scales.get<uint8_t>(),
                                     want_dequant.get<uint16_t>()};
    kernels::launch_quantize_mxfp8(d_x.get<uint16_t>(), c.tokens, kH, want, nullptr);
    using kernels::PermuteKernel;
    for (auto kernel : {PermuteKernel::Auto, PermuteKernel::Warp, PermuteKernel::Block, PermuteKernel::Large}) {
      if ((kernel == PermuteKernel::Warp && slots > 512) || (kernel == PermuteKernel::Block && slots > 8192)) continue;
      SCOPED_TRACE("T " + std::to_string(c.tokens) + " x " + std::to_string(c.top_k) + ", kernel " +
                   std::to_string(int(kernel)));
      DeviceBuffer d_ids = testing::to_device(ids);
      DeviceBuffer offset(4 * (c.num_local + 1)), row_token(4 * slots), slot_row(4 * slots),
          tiles(16 * kernels::max_tiles(slots, c.num_local, c.tile_rows)), num_tiles(4);
      DeviceBuffer counters = testing::to_device(std::vector<int>{7, 9});
      DeviceBuffer scratch(kernels::permute_scratch_bytes(c.num_local));
      // Stale counts in every tile's fourth field: the wgmma GEMM2 starts a tile when GEMM1's count
      // there reaches its target, so the permutation must zero it.
      K3MOE_CUDA_CHECK(cudaMemset(tiles.get<uint8_t>(), 0x7F, size_t(tiles.bytes())));
      // Every other output starts as garbage (0xAB bytes), not as the previous kernel's freed results.
      for (DeviceBuffer* b : {&offset, &row_token, &slot_row, &num_tiles})
        if (b->bytes() > 0) K3MOE_CUDA_CHECK(cudaMemset(b->get<uint8_t>(), 0xAB, size_t(b->bytes())));
      kernels::PermuteArgs a;
      a.ids = d_ids.get<int32_t>();
      a.tokens = c.tokens;
      a.top_k = c.top_k;
      a.first_expert = c.first_expert;
      a.num_local = c.num_local;
      a.expert_offset = offset.get<int32_t>();
      a.row_token = row_token.get<int32_t>();
      a.slot_row = slot_row.get<int32_t>();
      a.tile_rows = c.tile_rows;
      a.tile_info = tiles.get<int4>();
      a.num_tiles = num_tiles.get<int32_t>();
      a.unit_counters = counters.get<int>();
      a.block_rows = scratch.get<int32_t>();
      DeviceBuffer codes(x.size()), scales(x.size() / 32), dequant(2 * x.size());
      for (DeviceBuffer* b : {&codes, &scales, &dequant})
        if (b->bytes() > 0) K3MOE_CUDA_CHECK(cudaMemset(b->get<uint8_t>(), 0xAB, size_t(b->bytes())));
      const bool from_codes = int(kernel) % 2 == 0;
      const kernels::Mxfp8Buffers got{codes.get<uint8_t>(), scales.get<uint8_t>(), dequant.get<uint16_t>()};
      a.rounding = from_codes ? kernels::dequantizing(want.codes, want.scales, c.tokens, kH, got.x_dequant)
                              : kernels::quantizing(d_x.get<uint16_t>(), c.tokens, kH, got);
      kernels::launch_permute(a, nullptr, kernel);
      K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(testing::to_host<uint16_t>(dequant), testing::to_host<uint16_t>(want_dequant));
      if (!from_codes) {
        EXPECT_EQ(testing::to_host<uint8_t>(codes), testing::to_host<uint8_t>(want_codes));
        EXPECT_EQ(testing::to_host<uint8_t>(scales), testing::to_host<uint8_t>(want_scales));
      }
      EXPECT_EQ(testing::to_host<int32_t>(offset), want_offset);
      EXPECT_EQ(testing::to_host<int32_t>(slot_row), want_slot_row);
      std::vector<int32_t> got_row_token = testing::to_host<int32_t>(row_token);
      got_row_token.resize(want_row_token.size());
      EXPECT_EQ(got_row_token, want_row_token);
      ASSERT_EQ(testing::to_host<int32_t>(num_tiles)[0], int32_t(want_tiles.size()));
      const std::vector<int4> got_tiles = testing::to_host<int4>(tiles);
      for (size_t t = 0; t < want_tiles.size(); ++t)
        EXPECT_TRUE(got_tiles[t].x == want_tiles[t].x && got_tiles[t].y == want_tiles[t].y &&
                    got_tiles[t].z == want_tiles[t].z && got_tiles[t].w == 0)
            << "tile " << t;
      EXPECT_EQ(testing::to_host<int>(counters), (std::vector<int>{0, 0}));
    }
  }
  // The warp and block kernels refuse what they cannot hold.
  kernels::PermuteArgs big;
  big.tokens = 33;
  big.top_k = 16;
  EXPECT_THROW(kernels::launch_permute(big, nullptr, kernels::PermuteKernel::Warp), Error);
  big.tokens = 513;
  EXPECT_THROW(kernels::launch_permute(big, nullptr, kernels::PermuteKernel::Block), Error);
  big.tokens = 1;
  big.num_local = 1025;
  EXPECT_THROW(kernels::launch_permute(big, nullptr, kernels::PermuteKernel::Large), Error);
}

}  // namespace
}  // namespace k3moe
