// The public API's contract: device weights round-trip through the kernel layout, bad tensors
// are rejected with messages naming them, T = 0 returns at once, unsupported scales are refused.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "gpu_test.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "kernels/expert_gemm.cuh"
#include "k3moe/synthetic.h"
#include "runtime/device_buffer.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe {
namespace {

constexpr int64_t kTwoMiB = 2 << 20;

MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 256;
  c.intermediate = 384;
  c.num_experts = 8;
  c.top_k = 2;
  c.model_hidden = 256;
  return c;
}

RankExperts small_experts(ExpertParallel ep = {1, 0}) {
  SyntheticSpec spec;
  spec.config = small_config();
  spec.seed = 11;
  return synthesize_experts(spec, spec.config.first_moe_layer(), ep);
}


TEST(DeviceExperts, RoundTripThroughKernelLayout) {
  K3MOE_REQUIRE_GPU();
  for (ExpertParallel ep : {ExpertParallel{1, 0}, ExpertParallel{4, 3}}) {
    const RankExperts host = small_experts(ep);
    const RankExperts back = DeviceExperts::upload(host, 0).download();
    EXPECT_EQ(back.w13_packed, host.w13_packed);
    EXPECT_EQ(back.w13_scale, host.w13_scale);
    EXPECT_EQ(back.w2_packed, host.w2_packed);
    EXPECT_EQ(back.w2_scale, host.w2_scale);
  }
}

TEST(DeviceExperts, KernelLayoutRoundTripsOnTheHost) {
  // Host-only: the layout's conversions, whose experts run on the host's worker threads.
  for (ExpertParallel ep : {ExpertParallel{1, 0}, ExpertParallel{4, 3}}) {
    const RankExperts host = small_experts(ep);
    const RankExperts back = from_kernel_layout(to_kernel_layout(host), host.config, host.layer, ep);
    EXPECT_EQ(back.w13_packed, host.w13_packed);
    EXPECT_EQ(back.w13_scale, host.w13_scale);
    EXPECT_EQ(back.w2_packed, host.w2_packed);
    EXPECT_EQ(back.w2_scale, host.w2_scale);
  }
}

TEST(DeviceExperts, KernelLayoutRefusesDimensionsItCannotHold) {
  // Host-only. H or I a multiple of 64 but not of 128 wrote past the layout's buffers.
  for (auto [H, I] : {std::pair{192, 256}, std::pair{256, 320}}) {
    SyntheticSpec spec;
    spec.config = small_config();
    spec.config.hidden = spec.config.model_hidden = H;
    spec.config.intermediate = I;
    const RankExperts host = synthesize_experts(spec, spec.config.first_moe_layer(), {1, 0});
    const std::string got = "got H = " + std::to_string(H) + ", I = " + std::to_string(I);
    testing::expect_error([&] { to_kernel_layout(host); }, {"the kernel layout needs H and I to be multiples of 128", got});
    const KernelLayout empty;
    testing::expect_error([&] { from_kernel_layout(empty, spec.config, 0, {1, 0}); }, {"multiples of 128", got});
  }
}

TEST(DeviceExperts, RejectsScalesTheKernelsCannotHold) {
  K3MOE_REQUIRE_GPU();
  RankExperts host = small_experts();
  const MoeConfig& c = host.config;
  host.w13_scale[int64_t(c.intermediate + 5) * (c.hidden / 32) + 2] = 140;  // w3 (up) row 5, group 2, expert 0
  testing::expect_error([&] { DeviceExperts::upload(host, 0); }, {"expert 0", "w3.weight_scale[5, 2]", "140"});
}

// Host-only: the layout's sizes and buffers are checked against a valid configuration.
TEST(KernelLayout, SizesAndBuffersAreChecked) {
  testing::expect_error([] { kernel_layout_sizes(small_config(), ExpertParallel{0, 0}); }, {"EP size"});
  testing::expect_error([] { kernel_layout_sizes(small_config(), ExpertParallel{3, 5}); }, {"EP"});
  MoeConfig negative = small_config();
  negative.hidden = -128;
  testing::expect_error([&] { kernel_layout_sizes(negative, ExpertParallel{1, 0}); }, {"-128"});
  KernelLayout layout = to_kernel_layout(small_experts());
  layout.w2_scales.pop_back();
  testing::expect_error([&] { from_kernel_layout(layout, small_config(), 1, ExpertParallel{1, 0}); },
                        {"from_kernel_layout: w2_scales holds", "needs"});
  // Checked before the experts are allocated: a valid configuration of terabytes gets the named
  // error, not an allocation failure.
  MoeConfig huge = small_config();
  huge.hidden = huge.model_hidden = huge.intermediate = 32768;
  huge.num_experts = 1024;
  testing::expect_error([&] { from_kernel_layout(KernelLayout{}, huge, 1, ExpertParallel{1, 0}); },
                        {"from_kernel_layout: w13_codes holds 0 bytes", "needs 1099511627776"});
}

TEST(DeviceExperts, ViewRefusesPointersTheBulkCopiesCannotRead) {
  K3MOE_REQUIRE_GPU();
  const KernelLayoutSizes sizes = kernel_layout_sizes(small_config(), {1, 0});
  DeviceBuffer w13_codes(sizes.w13_codes), w13_scales(sizes.w13_scales), w2_codes(sizes.w2_codes),
      w2_scales(sizes.w2_scales);
  DeviceExperts::Pointers p{w13_codes.get<uint8_t>(), w13_scales.get<uint8_t>(), w2_codes.get<uint8_t>(),
                            w2_scales.get<uint8_t>()};
  EXPECT_NO_THROW(DeviceExperts::view(small_config(), {1, 0}, 1, 0, p));
  // Past the allocation's end: the driver knows where each buffer ends. (The pointers lie that
  // far before the end of a 2 MiB allocation, so no rounding of its size can hide the shortfall.)
  DeviceBuffer pages(kTwoMiB);
  p.w2_scales = pages.get<uint8_t>() + kTwoMiB - (sizes.w2_scales - 16);
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 0, p); },
                        {"w2_scales must hold " + std::to_string(sizes.w2_scales) + " bytes",
                         "got " + std::to_string(sizes.w2_scales - 16)});
  p.w2_scales = w2_scales.get<uint8_t>();
  p.w13_codes = pages.get<uint8_t>() + kTwoMiB - sizes.w13_codes / 2;
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 0, p); },
                        {"w13_codes must hold " + std::to_string(sizes.w13_codes) + " bytes",
                         "got " + std::to_string(sizes.w13_codes / 2)});
  p.w13_codes = w13_codes.get<uint8_t>();
  uint8_t* d = w2_codes.get<uint8_t>();
  p.w2_codes = d + 1;
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 0, p); },
                        {"w2_codes must be 16-byte aligned"});
  // Host memory (the kernel layout's vectors, say) would fault the GEMMs' bulk copies.
  alignas(16) static uint8_t host_bytes[64];
  p.w2_codes = host_bytes;
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 0, p); },
                        {"w2_codes must be", "memory of device 0", "got host memory"});
  p.w2_codes = nullptr;
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 0, p); }, {"all four pointers"});
  p.w2_codes = d;
  testing::expect_error([&] { DeviceExperts::view(small_config(), {1, 0}, 1, 99, p); },
                        {"DeviceExperts::view: device 99 does not exist"});
  testing::expect_error([&] { DeviceExperts::upload(small_experts(), 99); },
                        {"DeviceExperts::upload: device 99 does not exist"});
  MoeConfig odd = small_config();
  odd.intermediate = 192;
  testing::expect_error([&] { DeviceExperts::view(odd, {1, 0}, 1, 0, p); }, {"multiples of 128", "I = 192"});
}

struct Buffers {
  DeviceTensor x, ids, weights, out;
  explicit Buffers(int T, const MoeConfig& c)
      : x({T, c.hidden}, kBf16, 0), ids({T, c.top_k}, kI32, 0), weights({T, c.top_k}, kF32, 0),
        out({T, c.hidden}, kBf16, 0) {}
  ForwardArgs args() {
    ForwardArgs a;
    a.x = x.dl();
    a.topk_ids = ids.dl();
    a.topk_weights = weights.dl();
    a.out = out.dl();
    return a;
  }
};

TEST(MoePlan, RejectsBadTensorsNamingThem) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = small_config();
  const DeviceExperts experts = DeviceExperts::upload(small_experts(), 0);
  const MoePlan plan = MoePlan::create({c, 16, Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0});
  Buffers b(4, c);

  DeviceTensor wrong_dtype({4, c.hidden}, kF32, 0);
  ForwardArgs a = b.args();
  a.x = wrong_dtype.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"x must be", "bfloat16", "float32", "[4, 256]"});

  DeviceTensor wrong_shape({4, c.hidden - 32}, kBf16, 0);
  a = b.args();
  a.x = wrong_shape.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"x must be", "[4, 224]"});

  DeviceTensor short_ids({3, c.top_k}, kI32, 0);
  a = b.args();
  a.topk_ids = short_ids.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"topk_ids must be [4, 2] int32", "[3, 2]"});

  DeviceTensor out_f32({4, c.hidden}, kF32, 0);
  a = b.args();
  a.out = out_f32.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"out must be", "float32"});

  std::vector<uint16_t> host(4 * c.hidden, 0);
  DLTensor on_cpu = *b.x.dl();
  on_cpu.data = host.data();
  on_cpu.device = DLDevice{kDLCPU, 0};
  a = b.args();
  a.x = &on_cpu;
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"x must be", "on cpu"});

  int64_t strides[2] = {1, 4};
  DLTensor transposed = *b.x.dl();
  transposed.strides = strides;
  a = b.args();
  a.x = &transposed;
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"x must be contiguous"});

  Buffers too_many(17, c);
  testing::expect_error([&] { plan.forward(experts, too_many.args(), nullptr); }, {"17 tokens", "at most 16"});

  DeviceTensor codes({4, c.hidden}, kU8, 0);
  a = b.args();
  a.x = codes.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"uint8", "a16"});

  a = b.args();
  a.topk_ids = nullptr;
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"topk_ids + topk_weights or router_logits"});

  // Arguments given where they are not used are errors, not ignored.
  a = b.args();
  a.x_scales = b.ids.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"x_scales is given but x is bf16"});
  a = b.args();
  a.router_bias = b.weights.dl();
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"router_bias is given without router_logits"});

  testing::expect_error([&] { plan.workspace_bytes(-1); }, {"workspace_bytes: -1 tokens", "split the batch"});

  // A caller's workspace: device memory of the plan's device, large enough for this T.
  std::vector<uint8_t> host_workspace(size_t(plan.workspace_bytes(4)) + 256);
  void* host_aligned = host_workspace.data() + (256 - reinterpret_cast<uintptr_t>(host_workspace.data()) % 256);
  testing::expect_error([&] { plan.forward(experts, b.args(), nullptr, host_aligned); },
                        {"workspace must be 256-byte aligned memory of device 0", "got host memory"});
  const int64_t needed = plan.workspace_bytes(4);
  ASSERT_LT(needed, kTwoMiB);
  DeviceBuffer pages(kTwoMiB);  // the short workspace ends where this allocation ends
  testing::expect_error(
      [&] { plan.forward(experts, b.args(), nullptr, pages.get<char>() + kTwoMiB - (needed - 256)); },
      {"workspace must hold " + std::to_string(needed) + " bytes", "got " + std::to_string(needed - 256)});
  DeviceBuffer workspace(plan.workspace_bytes(4));
  EXPECT_NO_THROW(plan.forward(experts, b.args(), nullptr, workspace.get<char>()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(MoePlan, ZeroTokensReturnsAtOnce) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = small_config();
  const DeviceExperts experts = DeviceExperts::upload(small_experts(), 0);
  const MoePlan plan = MoePlan::create({c, 16, Mode::Mxfp8, Activation::Situ, c.activation_params, {1, 0}, 0});
  Buffers b(0, c);
  plan.forward(experts, b.args(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // describe() takes the token counts forward() takes, and names the others.
  EXPECT_NE(plan.describe(0).find("expert GEMMs"), std::string::npos);
  testing::expect_error([&] { plan.describe(-5); }, {"describe: -5 tokens", "split the batch"});
}

TEST(MoePlan, TakesTheConfigsActivationUnlessGiven) {
  // Options built from a checkpoint's config run its activation, not a default.
  K3MOE_REQUIRE_GPU();
  MoeConfig c = small_config();
  c.activation = Activation::SwigluOai;
  c.activation_params.swiglu_alpha = 1.5f;
  PlanOptions o;
  o.config = c;
  o.max_tokens = 16;
  const MoePlan from_config = MoePlan::create(o);
  EXPECT_EQ(*from_config.options().activation, Activation::SwigluOai);
  EXPECT_EQ(from_config.options().activation_params->swiglu_alpha, 1.5f);
  EXPECT_NE(from_config.describe(4).find("activation swiglu_oai"), std::string::npos) << from_config.describe(4);
  o.activation = Activation::Situ;
  o.activation_params = ActivationParams{};
  const MoePlan given = MoePlan::create(o);
  EXPECT_EQ(*given.options().activation, Activation::Situ);
  EXPECT_EQ(given.options().activation_params->swiglu_alpha, ActivationParams{}.swiglu_alpha);
}

TEST(MoePlan, RejectsActivationSettingsTheKernelsCannotRun) {
  // The kernels run the plan's own activation and parameters, not the config's.
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = small_config();
  ActivationParams zero_beta = c.activation_params;
  zero_beta.situ_beta = 0.0f;
  testing::expect_error([&] { MoePlan::create({c, 16, Mode::A16, Activation::Situ, zero_beta, {1, 0}, 0}); },
                        {"activation_situ_beta must be finite and > 0", "got 0"});
  testing::expect_error([&] { MoePlan::create({c, 16, Mode::A16, Activation(7), c.activation_params, {1, 0}, 0}); },
                        {"activation must be Situ, Swiglu or SwigluOai, got 7"});
}

TEST(MoePlan, RejectsShapesTheKernelsDoNotTake) {
  K3MOE_REQUIRE_GPU();
  MoeConfig c = small_config();
  c.hidden = 192;  // a multiple of 64, not of 128
  testing::expect_error([&] { MoePlan::create({c, 16, Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0}); },
                        {"multiples of 128", "H = 192"});
  c = small_config();
  testing::expect_error([&] { MoePlan::create({c, 16, Mode::A16, Activation::Situ, c.activation_params, {3, 0}, 0}); },
                        {"3"});
  c = small_config();
  const int64_t limit = kernels::max_gemm_tokens(c.top_k, c.hidden, c.intermediate);
  EXPECT_EQ(kernels::max_gemm_tokens(16, 3584, 3072), 599186);  // Kimi-K3: (2^32 - 2) / (16 x 3584 / 8)
  testing::expect_error(
      [&] { MoePlan::create({c, int(limit + 1), Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0}); },
      {"max_tokens must be <= " + std::to_string(limit), "got " + std::to_string(limit + 1)});
  // At the limit the workspace is larger than any GPU's memory: named, before any allocation.
  testing::expect_error(
      [&] { MoePlan::create({c, int(limit), Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0}); },
      {"the workspace for max_tokens " + std::to_string(limit) + " needs", "free of"});
  PlanOptions unknown_kernel{c, 16, Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0};
  unknown_kernel.gemm_kernel = GemmKernel(5);
  testing::expect_error([&] { MoePlan::create(unknown_kernel); }, {"gemm_kernel must be Auto, MmaSync or Wgmma, got 5"});
}

// The stage records follow the launch chain: every stage after the first passes its wait only after
// the stage before has ended (programmatic dependent launch), and a second forward raises them.
TEST(MoePlan, StageTimesFollowTheLaunchChain) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = small_config();
  const DeviceExperts experts = DeviceExperts::upload(small_experts(), 0);
  PlanOptions options{c, 16, Mode::Mxfp8, Activation::Situ, c.activation_params, {1, 0}, 0};
  options.gemm1_splits = 2;  // so the activation stage runs (K = 256: two ranges of 256-row units)
  options.gemm1_unit_rows = kernels::kGemmRowsPerCta;
  const MoePlan plan = MoePlan::create(options);
  const int T = 8;
  std::vector<uint16_t> x(size_t(T) * c.hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16_bits(float(int(i % 17) - 8) / 8.0f);
  std::vector<int32_t> ids(size_t(T) * c.top_k);
  std::vector<float> weights(ids.size(), 0.5f), logits(size_t(T) * c.num_experts), bias(size_t(c.num_experts), 0.0f);
  for (int t = 0; t < T; ++t) {
    ids[size_t(t) * c.top_k] = t % c.num_experts;
    ids[size_t(t) * c.top_k + 1] = (t + 3) % c.num_experts;
  }
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int(i * 7 % 13) - 6) / 4.0f;
  DeviceTensor x_d = DeviceTensor::from_host(x, {T, c.hidden}, kBf16, 0);
  DeviceTensor ids_d = DeviceTensor::from_host(ids, {T, c.top_k}, kI32, 0);
  DeviceTensor weights_d = DeviceTensor::from_host(weights, {T, c.top_k}, kF32, 0);
  DeviceTensor logits_d = DeviceTensor::from_host(logits, {T, c.num_experts}, kF32, 0);
  DeviceTensor bias_d = DeviceTensor::from_host(bias, {c.num_experts}, kF32, 0);
  DeviceTensor out({T, c.hidden}, kBf16, 0);
  DeviceBuffer records(kForwardStages * int64_t(sizeof(StageTimes)));
  K3MOE_CUDA_CHECK(cudaMemset(records.get(), 0, size_t(records.bytes())));
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the forward runs on a non-blocking stream
  ForwardArgs a;
  a.x = x_d.dl();
  a.topk_ids = ids_d.dl();
  a.topk_weights = weights_d.dl();
  a.out = out.dl();
  a.stage_times = records.get<StageTimes>();

  const auto check_chain = [&](const std::vector<StageTimes>& t, bool routed) {
    const auto at = [&](ForwardStage s) { return t[size_t(s)]; };
    EXPECT_EQ(at(ForwardStage::Routing).last_start != 0, routed);
    ForwardStage previous = ForwardStage::Routing;
    for (ForwardStage s : {ForwardStage::Permutation, ForwardStage::Gemm1, ForwardStage::Activation,
                           ForwardStage::Gemm2, ForwardStage::Combine}) {
      SCOPED_TRACE(std::string(to_string(s)));
      EXPECT_GT(at(s).last_start, 0u);
      EXPECT_GT(at(s).last_wait, 0u);
      EXPECT_LE(at(s).last_start, at(s).last_end);
      EXPECT_LE(at(s).last_wait, at(s).last_end);
      if (s != ForwardStage::Permutation || routed) EXPECT_GE(at(s).last_wait, at(previous).last_end);
      previous = s;
    }
  };
  plan.forward(experts, a, nullptr);
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<StageTimes> first = testing::to_host<StageTimes>(records);
  check_chain(first, false);

  a.topk_ids = a.topk_weights = nullptr;
  a.router_logits = logits_d.dl();
  a.router_bias = bias_d.dl();
  plan.forward(experts, a, nullptr);
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<StageTimes> second = testing::to_host<StageTimes>(records);
  check_chain(second, true);
  for (int s = int(ForwardStage::Permutation); s < kForwardStages; ++s)
    EXPECT_GT(second[size_t(s)].last_start, first[size_t(s)].last_end) << to_string(ForwardStage(s));

  StageTimes on_host[kForwardStages];
  a.stage_times = on_host;
  testing::expect_error([&] { plan.forward(experts, a, nullptr); }, {"stage_times must be", "host memory"});
}

}  // namespace
}  // namespace k3moe
