// A small layer for the forward's GPU tests (H and I multiples of 256, so every unit size
// runs), and one forward's random inputs with an output buffer of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "k3moe/formats.h"
#include "k3moe/plan.h"
#include "k3moe/synthetic.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe::testing {

inline MoeConfig graph_config() {
  MoeConfig c;
  c.hidden = 512;
  c.intermediate = 256;
  c.num_experts = 16;
  c.top_k = 4;
  c.model_hidden = 512;
  return c;
}

inline DeviceExperts graph_experts(uint32_t seed) {
  SyntheticSpec spec;
  spec.config = graph_config();
  spec.seed = seed;
  return DeviceExperts::upload(synthesize_experts(spec, spec.config.first_moe_layer(), {1, 0}), 0);
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

}  // namespace k3moe::testing
