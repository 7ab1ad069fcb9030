// The validation matrix's a16 bound against the mode-emulating reference (validation.cpp,
// docs/PRECISION.md) must hold for any fp32 summation order the kernels could have, and fail the
// roundings a defect would make. Kimi-K3 at T = 1 on the 28 experts of an EP32 rank (the matrix's
// k3-local28 shape) is where one token's output, summed over 16 experts, moves most with the order.
// Runs on the host (the float64 reference only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "k3moe/formats.h"
#include "k3moe/reference.h"
#include "k3moe/synthetic.h"
#include "reference/forward_internal.h"
#include "validation/validation.h"

namespace k3moe {
namespace {

TEST(Tolerance, TheA16BoundTakesOtherSumOrdersAndFailsTruncation) {
  MoeConfig c;  // Kimi-K3's widths and routing ...
  c.num_experts = 28;  // ... among the 28 experts of one EP32 rank
  SyntheticSpec spec;
  spec.config = c;
  spec.seed = 54;
  const RankExperts experts = synthesize_experts(spec, c.first_moe_layer(), {1, 0});
  const double bound = validation::tolerance(Mode::A16).rel_l2;
  std::mt19937_64 rng(54);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double largest_other_order = 0.0;
  for (int set = 0; set < 4; ++set) {
    SCOPED_TRACE(::testing::Message() << "input set " << set);
    std::vector<uint16_t> x(c.hidden);
    for (auto& v : x) v = float_to_bf16_bits(normal(rng));
    std::vector<float> logits(c.num_experts), bias(c.num_experts);
    for (auto& v : logits) v = normal(rng);
    for (auto& v : bias) v = 0.1f * normal(rng);
    const Routing routing = route_reference(logits, bias, 1, c);
    const ReferenceProblem problem{&experts, 1, x, &routing, Mode::A16, Activation::Situ, c.activation_params};
    const auto emulate = [&](const detail::EmulationVariant& variant) {
      return detail::reference_forward_chunked(problem, Precision::Emulate, 1, variant);
    };
    const std::vector<double> contract = emulate({});
    const double other_order = compare(emulate({.fp32_block_sums = true}), contract).rel_l2;
    const double truncated_activation = compare(emulate({.truncate_activation = true}), contract).rel_l2;
    const double truncated_output = compare(emulate({.truncate_output = true}), contract).rel_l2;
    EXPECT_LT(other_order, bound);
    largest_other_order = std::max(largest_other_order, other_order);
    EXPECT_GT(truncated_activation, 2.0 * bound);
    EXPECT_GT(truncated_output, 2.0 * bound);
  }
  EXPECT_GT(largest_other_order, 0.0) << "the other order changed no output bit";
}

}  // namespace
}  // namespace k3moe
