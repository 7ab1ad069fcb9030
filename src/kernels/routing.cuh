// Routing: fp32 logits [T, E] + correction bias [E] -> top-K global ids int32 and fp32 weights,
// bit-identical to route_reference (reference.h states the rule).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/stage_times.h"

namespace k3moe::kernels {

inline constexpr int kRoutingMaxExperts = 1024;  // 8 per thread of the CTA that routes a token
inline constexpr int kRoutingMaxTopK = 32;       // one slot per lane

struct RoutingArgs {
  const float* logits = nullptr;
  const float* bias = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  int tokens = 0, num_experts = 0, top_k = 0;
  bool renormalize = true;
  float scaling = 1.0f;
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

void launch_routing(const RoutingArgs& args, cudaStream_t stream);

}  // namespace k3moe::kernels
