// ForwardGraph: a forward enqueued as one graph launch gives MoePlan::forward's output bits, call
// after call, as its tensors, T, mode, routing and plan change under it; it reuses its graphs; on
// a capturing stream it leaves the kernels to the caller's graph; bad tensors fail as in forward().
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "expect_error.h"
#include "forward_inputs.h"
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

using testing::graph_config;
using testing::graph_experts;
using testing::Inputs;

MoePlan graph_plan(Mode mode, GemmKernel kernel = GemmKernel::Auto) {
  const MoeConfig c = graph_config();
  PlanOptions o{c, 512, mode, Activation::Situ, c.activation_params, {1, 0}, 0};
  o.gemm_kernel = kernel;
  return MoePlan::create(o);
}


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
