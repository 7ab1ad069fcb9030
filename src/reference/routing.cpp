// The contract's routing in fp32, bit for bit (see reference.h): sigmoid, biased top-K selection
// with ties to the lower expert id, renormalised unbiased weights.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/reference.h"

namespace k3moe {

float routing_sigmoid(float logit) {
  // NOTE: float64 evaluation rounded once to fp32, so every platform's s is the same (the fp32
  // libm's expf differs between platforms by an ulp; the double result is within 1 ulp of
  // the true value and almost never straddles an fp32 rounding boundary).
  const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(logit)));
  return static_cast<float>(s);
}

namespace {

// Strict weak order "a is picked before b": larger choice first, ties to the lower id, a NaN
// choice after every number (including -Inf). +0 and -0 compare equal (a tie).
struct PickedBefore {
  const float* choice;
  bool operator()(int a, int b) const {
    const bool nan_a = is_nan(choice[a]), nan_b = is_nan(choice[b]);
    if (nan_a != nan_b) return nan_b;
    if (!nan_a && choice[a] != choice[b]) return choice[a] > choice[b];
    return a < b;
  }
};

}  // namespace

Routing route_reference(std::span<const float> logits, std::span<const float> bias, int tokens,
                        const MoeConfig& config) {
  const int E = config.num_experts, K = config.top_k;
  K3MOE_CHECK(tokens >= 0, "route_reference: tokens must be >= 0, got ", tokens);
  K3MOE_CHECK(E >= 1, "route_reference: num_experts must be >= 1, got ", E);
  K3MOE_CHECK(K >= 1 && K <= E, "route_reference: top_k must be in [1, num_experts = ", E, "], got ", K);
  K3MOE_CHECK(std::isfinite(config.routed_scaling_factor) && config.routed_scaling_factor > 0.0f,
              "route_reference: routed_scaling_factor must be finite and > 0, got ", config.routed_scaling_factor);
  K3MOE_CHECK(logits.size() == size_t(tokens) * size_t(E), "route_reference: logits must be [", tokens,
              ", ", E, "] fp32 (", int64_t(tokens) * E, " values), got ", logits.size(), " values");
  K3MOE_CHECK(bias.size() == size_t(E), "route_reference: bias must be [", E, "] fp32, got ",
              bias.size(), " values");

  Routing r;
  r.tokens = tokens;
  r.top_k = K;
  r.ids.resize(size_t(tokens) * K);
  r.weights.resize(size_t(tokens) * K);

  std::vector<float> s(E), choice(E);
  std::vector<int> order(E);
  for (int t = 0; t < tokens; ++t) {
    const float* row = logits.data() + size_t(t) * E;
    for (int e = 0; e < E; ++e) {
      s[e] = routing_sigmoid(row[e]);
      choice[e] = s[e] + bias[e];  // fp32 add: the bias only selects
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), PickedBefore{choice.data()});

    int32_t* ids = r.ids.data() + size_t(t) * K;
    float* w = r.weights.data() + size_t(t) * K;
    float sum = 0.0f;  // fp32, slot order
    for (int k = 0; k < K; ++k) {
      ids[k] = order[k];
      w[k] = is_nan(s[order[k]]) ? 0.0f : s[order[k]];  // a NaN score weighs 0
      sum += w[k];
    }
    const float denom = sum + 1e-20f;
    for (int k = 0; k < K; ++k) {
      if (config.renormalize) w[k] = w[k] / denom;
      w[k] = w[k] * config.routed_scaling_factor;
    }
  }
  return r;
}

void check_routing_ids(std::span<const int32_t> ids, int tokens, int top_k, int num_experts) {
  K3MOE_CHECK(tokens >= 0 && top_k >= 1, "routing ids: tokens must be >= 0 and top_k >= 1, got tokens ",
              tokens, ", top_k ", top_k);
  K3MOE_CHECK(ids.size() == size_t(tokens) * size_t(top_k), "routing ids must be [", tokens, ", ", top_k,
              "] int32 (", int64_t(tokens) * top_k, " values), got ", ids.size(), " values");
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    K3MOE_CHECK(id >= -1 && id < num_experts, "routing ids: token ", i / size_t(top_k), " slot ",
                i % size_t(top_k), " holds expert id ", id, "; valid ids are -1 (empty slot) and 0..",
                num_experts - 1);
  }
}

}  // namespace k3moe
