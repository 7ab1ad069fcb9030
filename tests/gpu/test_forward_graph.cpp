// ForwardGraph: a forward enqueued as one graph launch gives MoePlan::forward's output bits, call
// after call, as its tensors, T, mode, routing and plan change under it; it reuses its graphs; on
// a capturing stream it leaves the kernels to the caller's graph; bad tensors fail as in forward().
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "expect_error.h"
#include "gpu_test.h"
#include "k3moe/formats.h"
#include "k3moe/forward_graph.h"
#include "k3moe/synthetic.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe {
namespace {

MoeConfig graph_config() {
  MoeConfig c;
  c.hidden = 512;
  c.intermediate = 256;
  c.num_experts = 16;
  c.top_k = 4;
  c.model_hidden = 512;
  return c;
}

DeviceExperts graph_experts(uint32_t seed) {
  SyntheticSpec spec;
  spec.config = graph_config();
  spec.seed = seed;
  return DeviceExperts::upload(synthesize_experts(spec, spec.config.first_moe_layer(), {1, 0}), 0);
}

MoePlan graph_plan(Mode mode, GemmKernel kernel = GemmKernel::Auto) {
  const MoeConfig c = graph_config();
  PlanOptions o{c, 512, mode, Activation::Situ, c.activation_params, {1, 0}, 0};
  o.gemm_kernel = kernel;
  return MoePlan::create(o);
}

// One forward's inputs, random for `seed`, and an output buffer of its own.
struct Inputs {
  DeviceTensor x, ids, weights, logits, bias, out;
  bool from_logits = false;

  Inputs(const MoeConfig& c, int T, uint32_t seed, bool route_from_logits) : from_logits(route_from_logits) {
    uint32_t state = seed * 2654435761u + 1;
    const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
    std::vector<uint16_t> xs(size_t(T) * c.hidden);
    for (uint16_t& v : xs) v = float_to_bf16_bits(float(int(next() % 2001) - 1000) / 500.0f);
    std::vector<int32_t> id(size_t(T) * c.top_k);
    std::vector<float> w(id.size());
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < c.top_k; ++k) {
        id[size_t(t) * c.top_k + k] = int32_t((next() % 4 + uint32_t(k) * 4) % uint32_t(c.num_experts));
        w[size_t(t) * c.top_k + k] = float(next() % 1000) / 1000.0f;
      }
    std::vector<float> l(size_t(T) * c.num_experts), b(size_t(c.num_experts));
    for (float& v : l) v = float(int(next() % 801) - 400) / 100.0f;
    for (float& v : b) v = float(int(next() % 21) - 10) / 100.0f;
    x = DeviceTensor::from_host(xs, {T, c.hidden}, kBf16, 0);
    ids = DeviceTensor::from_host(id, {T, c.top_k}, kI32, 0);
    weights = DeviceTensor::from_host(w, {T, c.top_k}, kF32, 0);
    logits = DeviceTensor::from_host(l, {T, c.num_experts}, kF32, 0);
    bias = DeviceTensor::from_host(b, {c.num_experts}, kF32, 0);
    out = DeviceTensor({T, c.hidden}, kBf16, 0);
    out.fill_bytes(0xFF);  // NaN: every element must be written
  }
  ForwardArgs args() {
    ForwardArgs a;
    a.x = x.dl();
    a.out = out.dl();
    if (from_logits) {
      a.router_logits = logits.dl();
      a.router_bias = bias.dl();
    } else {
      a.topk_ids = ids.dl();
      a.topk_weights = weights.dl();
    }
    return a;
  }
};

struct Case {
  Mode mode;
  int tokens;
  bool from_logits;
  GemmKernel kernel;
};

TEST(ForwardGraph, GivesTheForwardsBitsAsTensorsTokensAndPlansChange) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = graph_config();
  const DeviceExperts experts = graph_experts(5);
  std::unique_ptr<MoePlan> plans[2][3];
  for (Mode mode : {Mode::A16, Mode::Mxfp8})
    for (GemmKernel kernel : {GemmKernel::Auto, GemmKernel::MmaSync, GemmKernel::Wgmma})
      plans[int(mode)][int(kernel)] = std::make_unique<MoePlan>(graph_plan(mode, kernel));
  // Repeats and returns to earlier shapes, so that graphs are reused with other arguments.
  const std::vector<Case> cases = {
      {Mode::A16, 1, false, GemmKernel::Auto},       {Mode::A16, 1, false, GemmKernel::Auto},
      {Mode::A16, 7, false, GemmKernel::Auto},       {Mode::Mxfp8, 7, false, GemmKernel::Auto},
      {Mode::A16, 1, true, GemmKernel::Auto},        {Mode::A16, 64, false, GemmKernel::MmaSync},
      {Mode::A16, 64, false, GemmKernel::Wgmma},     {Mode::Mxfp8, 300, false, GemmKernel::Wgmma},
      {Mode::A16, 300, true, GemmKernel::Auto},      {Mode::A16, 2, false, GemmKernel::Auto},
      {Mode::Mxfp8, 1, false, GemmKernel::MmaSync},  {Mode::A16, 7, false, GemmKernel::Auto},
      {Mode::Mxfp8, 64, true, GemmKernel::Wgmma},    {Mode::A16, 1, false, GemmKernel::Auto},
  };
  const CudaStream stream;
  ForwardGraph graph;
  uint32_t seed = 1;
  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message() << "mode " << to_string(k.mode) << ", T = " << k.tokens << ", logits "
                                      << k.from_logits << ", kernel " << int(k.kernel) << ", call " << seed);
    const MoePlan& plan = *plans[int(k.mode)][int(k.kernel)];
    Inputs direct(c, k.tokens, seed, k.from_logits), graphed(c, k.tokens, seed, k.from_logits);
    ++seed;
    plan.forward(experts, direct.args(), stream);
    graph.forward(plan, experts, graphed.args(), stream);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> want = direct.out.download<uint16_t>(), got = graphed.out.download<uint16_t>();
    ASSERT_EQ(got, want);
    if (k.from_logits)
      EXPECT_EQ(graphed.ids.download<int32_t>(), direct.ids.download<int32_t>()) << "the routing's ids";
  }
  // One graph per kernel count, not per call.
  EXPECT_GT(graph.graphs_built(), 0);
  EXPECT_LE(graph.graphs_built(), 4);
}

TEST(ForwardGraph, ForwardsQueuedBackToBackEachKeepTheirArguments) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = graph_config();
  const DeviceExperts experts = graph_experts(6);
  const MoePlan plan = graph_plan(Mode::A16);
  const CudaStream stream;
  ForwardGraph graph;
  std::vector<std::unique_ptr<Inputs>> calls;
  for (uint32_t s = 0; s < 6; ++s) calls.push_back(std::make_unique<Inputs>(c, 3, 100 + s, false));
  for (auto& in : calls) graph.forward(plan, experts, in->args(), stream);  // no synchronization between
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (uint32_t s = 0; s < 6; ++s) {
    Inputs direct(c, 3, 100 + s, false);
    plan.forward(experts, direct.args(), stream);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(calls[s]->out.download<uint16_t>(), direct.out.download<uint16_t>()) << "call " << s;
  }
  EXPECT_EQ(graph.graphs_built(), 1);
}

TEST(ForwardGraph, OnACapturingStreamTheKernelsJoinTheCallersGraph) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = graph_config();
  const DeviceExperts experts = graph_experts(7);
  const MoePlan plan = graph_plan(Mode::Mxfp8);
  const CudaStream stream;
  ForwardGraph graph;
  Inputs direct(c, 5, 9, false), captured(c, 5, 9, false);
  const CapturedGraph callers(stream, [&] { graph.forward(plan, experts, captured.args(), stream); });
  EXPECT_EQ(graph.graphs_built(), 0);
  callers.launch(stream);
  plan.forward(experts, direct.args(), stream);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(captured.out.download<uint16_t>(), direct.out.download<uint16_t>());
}

TEST(ForwardGraph, BadTensorsFailAsInTheForwardAndLaunchNothing) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = graph_config();
  const DeviceExperts experts = graph_experts(8);
  const MoePlan plan = graph_plan(Mode::A16);
  const CudaStream stream;
  ForwardGraph graph;
  Inputs in(c, 4, 3, false);
  DeviceTensor short_ids({3, c.top_k}, kI32, 0);
  ForwardArgs a = in.args();
  a.topk_ids = short_ids.dl();
  testing::expect_error([&] { graph.forward(plan, experts, a, stream); }, {"topk_ids must be [4, 4] int32", "[3, 4]"});
  EXPECT_EQ(graph.graphs_built(), 0);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (uint16_t v : in.out.download<uint16_t>()) ASSERT_EQ(v, 0xFFFF) << "nothing ran";
  // The thread records no more: a direct forward afterwards runs.
  plan.forward(experts, in.args(), stream);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_NE(in.out.download<uint16_t>()[0], 0xFFFF);
  // Nothing to launch at T = 0.
  Inputs empty(c, 0, 4, false);
  graph.forward(plan, experts, empty.args(), stream);
  EXPECT_EQ(graph.graphs_built(), 0);
}

}  // namespace
}  // namespace k3moe
