// The float64 reference of the routed-expert forward, on the same quantized inputs the kernels see.
//
// Routing is the contract's fp32 definition, bit for bit: s = sigmoid(logit) evaluated in float64
// and rounded once to fp32 (so every platform gets the same s); choice = s + bias in fp32; the K
// largest choices, ties to the lower expert id, a NaN choice ranking below every number (a NaN
// score then weighs 0); w = s / (sum of the K s in slot order, in fp32, + 1e-20) * scaling.
//
// The expert forward has two precisions per mode:
//   Ideal:   everything in float64 from the inputs as given (bf16 x, exact MXFP4 weights).
//   Emulate: float64 arithmetic with exactly the mode's roundings applied (see config.h Mode):
//            a16:   a = bf16(fp32(act(h))),        out = bf16(fp32(sum_k w_k y_k))
//            mxfp8: x -> MXFP8, a = MXFP8(fp32(act(h))) (per 32 along I), out as a16
//            where h and y are each rounded to fp32 (the kernels' accumulator precision) and the
//            activation is evaluated in float64 on the rounded h.
// Expert parallelism: a slot whose id is -1 or another rank's expert contributes nothing; an id
// >= E or < -1 is rejected (k3moe::Error naming the token and slot).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/experts.h"

namespace k3moe {

struct Routing {
  int tokens = 0;
  int top_k = 0;
  std::vector<int32_t> ids;    // [T, K] global expert ids
  std::vector<float> weights;  // [T, K]
};

// The contract's sigmoid: float64 evaluation, rounded once to fp32.
float routing_sigmoid(float logit);

// logits [T, E] fp32, bias [E] fp32.
Routing route_reference(std::span<const float> logits, std::span<const float> bias, int tokens,
                        const MoeConfig& config);

// Throws k3moe::Error for an id >= E or < -1 (names token and slot).
void check_routing_ids(std::span<const int32_t> ids, int tokens, int top_k, int num_experts);

enum class Precision { Ideal, Emulate };

struct ReferenceProblem {
  const RankExperts* experts = nullptr;
  int tokens = 0;
  std::span<const uint16_t> x_bf16;  // [T, H] bf16 bits
  const Routing* routing = nullptr;  // global ids, -1 allowed
  Mode mode = Mode::A16;
  Activation activation = Activation::Situ;
  ActivationParams params;
};

// out [T, H] in float64 (Emulate: the values are bf16-representable).
std::vector<double> reference_forward(const ReferenceProblem& problem, Precision precision);

// ||a - b|| / ||b|| and cosine(a, b), over the elements where both are finite; counts the rest.
struct Comparison {
  double rel_l2 = 0.0;
  double cosine = 1.0;
  int64_t nonfinite_mismatch = 0;  // elements finite in one and not the other (or NaN vs Inf)
};
Comparison compare(std::span<const double> actual, std::span<const double> expected);

}  // namespace k3moe
