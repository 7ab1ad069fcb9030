// Uses the installed headers and library: a config, the formats, the reference routing.
#include <cstdio>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/formats.h"
#include "k3moe/reference.h"
#if K3MOE_WITH_CUDA
#include "k3moe/plan.h"
#endif

int main() {
  const k3moe::MoeConfig config = k3moe::MoeConfig::kimi_k3();
  std::vector<float> logits(config.num_experts, 0.0f), bias(config.num_experts, 0.0f);
  logits[5] = 3.0f;
  const k3moe::Routing r = k3moe::route_reference(logits, bias, 1, config);
  const bool ok = r.ids[0] == 5 && k3moe::e2m1_to_float(7) == 6.0f && config.expert_bytes() == 17547264;
#if K3MOE_WITH_CUDA
  std::printf("consumer: k3moe with CUDA, GPU %s\n", k3moe::hopper_gpu_available() ? "present" : "absent");
#endif
  std::printf("consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
