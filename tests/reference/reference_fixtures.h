// Small problems for the reference tests, built without the checkpoint code: random MXFP4 experts
// (each global expert's weights depend only on the seed and its id, so every EP rank sees the same
// expert), explicit experts from float matrices, and bf16 token batches.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/experts.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"
#include "k3moe/reference.h"

namespace k3test {

inline k3moe::MoeConfig small_config(int hidden, int intermediate, int experts, int top_k) {
  k3moe::MoeConfig c;
  c.model_hidden = hidden;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_experts = experts;
  c.top_k = top_k;
  return c;
}

// The rank's buffers, zero-filled (written here rather than with RankExperts::allocate so that
// these tests depend on nothing but the reference and the formats).
inline k3moe::RankExperts empty_experts(const k3moe::MoeConfig& c, k3moe::ExpertParallel ep) {
  k3moe::RankExperts ex;
  ex.config = c;
  ex.layer = 1;
  ex.ep = ep;
  ex.num_local = c.num_experts / ep.size;
  ex.first_expert = ep.rank * ex.num_local;
  const size_t L = size_t(ex.num_local), H = size_t(c.hidden), I = size_t(c.intermediate);
  ex.w13_packed.assign(L * 2 * I * H / 2, 0);
  ex.w13_scale.assign(L * 2 * I * H / 32, 0);
  ex.w2_packed.assign(L * H * I / 2, 0);
  ex.w2_scale.assign(L * H * I / 32, 0);
  return ex;
}

// Quantizes float matrices W13 [2I, H] and W2 [H, I] into local expert `local`.
inline void set_expert(k3moe::RankExperts& ex, int local, const std::vector<float>& w13,
                       const std::vector<float>& w2) {
  const int H = ex.config.hidden, I = ex.config.intermediate;
  const auto q13 = k3moe::quantize_mxfp4(w13, 2 * I, H);
  const auto q2 = k3moe::quantize_mxfp4(w2, H, I);
  std::memcpy(ex.w13_packed.data() + q13.packed.size() * local, q13.packed.data(), q13.packed.size());
  std::memcpy(ex.w13_scale.data() + q13.scales.size() * local, q13.scales.data(), q13.scales.size());
  std::memcpy(ex.w2_packed.data() + q2.packed.size() * local, q2.packed.data(), q2.packed.size());
  std::memcpy(ex.w2_scale.data() + q2.scales.size() * local, q2.scales.data(), q2.scales.size());
}

// Weights N(0, 1/fan_in) times a per-row factor in [0.5, 2], as the synthetic checkpoints draw them.
inline std::vector<float> random_matrix(int rows, int cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_factor(-1.0f, 1.0f);
  std::vector<float> w(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float sd = std::exp2(log_factor(rng)) / std::sqrt(float(cols));
    for (int c = 0; c < cols; ++c) w[size_t(r) * cols + c] = normal(rng) * sd;
  }
  return w;
}

inline k3moe::RankExperts random_experts(const k3moe::MoeConfig& c, k3moe::ExpertParallel ep, uint64_t seed) {
  k3moe::RankExperts ex = empty_experts(c, ep);
  for (int e = 0; e < ex.num_local; ++e) {
    std::mt19937_64 rng(seed * 1000003u + uint64_t(ex.first_expert + e));
    const auto w13 = random_matrix(2 * c.intermediate, c.hidden, rng);
    const auto w2 = random_matrix(c.hidden, c.intermediate, rng);
    set_expert(ex, e, w13, w2);
  }
  return ex;
}

// N(0, 1) tokens rounded to bf16.
inline std::vector<uint16_t> random_tokens(int tokens, int hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(tokens) * hidden);
  for (auto& v : x) v = k3moe::float_to_bf16_bits(normal(rng));
  return x;
}

// Routing from N(0, 1) logits and a small bias, through the reference router.
inline k3moe::Routing random_routing(int tokens, const k3moe::MoeConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(size_t(tokens) * c.num_experts), bias(size_t(c.num_experts));
  for (auto& v : logits) v = normal(rng);
  for (auto& v : bias) v = 0.1f * normal(rng);
  return k3moe::route_reference(logits, bias, tokens, c);
}

}  // namespace k3test
