// MoePlan objects for the ops, one per (config, mode, activation, parameters, EP, device), created
// on first use and kept for the life of the process. Plans are created with max_tokens = 0: they
// own no workspace (each forward brings one: stream_workspace.h), so a plan is stateless during
// forward() and is shared by every stream and thread.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <tuple>

#include "k3moe/plan.h"

namespace k3moe::torch_binding {

struct PlanKey {
  int num_experts = 0, top_k = 0, hidden = 0, intermediate = 0;
  Mode mode = Mode::A16;
  Activation activation = Activation::Situ;
  float situ_beta = 0, situ_linear_beta = 0, swiglu_alpha = 0, swiglu_limit = 0;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  int ep_size = 1, ep_rank = 0;
  int device = 0;

  // NOTE: floats compare by their bits, so that a NaN parameter is a key of its own (and fails
  // when its plan is created) instead of comparing equivalent to every other key.
  auto tie() const {
    return std::tuple(num_experts, top_k, hidden, intermediate, mode, activation, std::bit_cast<uint32_t>(situ_beta),
                      std::bit_cast<uint32_t>(situ_linear_beta), std::bit_cast<uint32_t>(swiglu_alpha),
                      std::bit_cast<uint32_t>(swiglu_limit), renormalize,
                      std::bit_cast<uint32_t>(routed_scaling_factor), ep_size, ep_rank, device);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

// The plan for `key`. Creating one validates the configuration and the device (k3moe::Error on
// failure) and must not happen while `stream` is being captured into a CUDA graph: the first call
// for a configuration has to run eagerly (KimiK3RoutedExperts does it at construction).
const MoePlan& plan_for(const PlanKey& key, cudaStream_t stream);

// The DeviceExperts view of four kernel-layout tensors for `plan` (layer 0, the plan's device),
// made once per (plan, pointers): a view checks its pointers with the driver, a few calls the
// eager forward would otherwise pay every time. Views hold pointers only; the tensors are checked
// on every call before one is used. At most 4096 are kept (then the set starts again).
std::shared_ptr<const DeviceExperts> experts_view(const MoePlan& plan, const DeviceExperts::Pointers& pointers);

}  // namespace k3moe::torch_binding
