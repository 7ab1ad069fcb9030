#include "plan_cache.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>

#include "k3moe/error.h"

namespace k3moe::torch_binding {

const MoePlan& plan_for(const PlanKey& key, cudaStream_t stream) {
  // NOTE: plans are never erased, so a reference stays valid after the lock is released.
  static std::mutex mutex;
  static std::map<PlanKey, std::unique_ptr<MoePlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = plans.find(key); it != plans.end()) return *it->second;

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) cudaGetLastError();
  K3MOE_CHECK(capture == cudaStreamCaptureStatusNone,
              "the first call for a configuration (E ", key.num_experts, ", K ", key.top_k, ", H ", key.hidden,
              ", I ", key.intermediate, ", mode ", to_string(key.mode), ", activation ", to_string(key.activation),
              ", EP ", key.ep_rank, "/", key.ep_size, ", cuda:", key.device,
              ") creates its plan and must run before CUDA graph capture: call it once eagerly first "
              "(KimiK3RoutedExperts does this when it is built)");

  PlanOptions options;
  MoeConfig& c = options.config;
  c.num_experts = key.num_experts;
  c.top_k = key.top_k;
  c.hidden = key.hidden;
  c.intermediate = key.intermediate;
  c.model_hidden = key.hidden;
  c.renormalize = key.renormalize;
  c.routed_scaling_factor = key.routed_scaling_factor;
  c.activation = key.activation;
  c.activation_params = {key.situ_beta, key.situ_linear_beta, key.swiglu_alpha, key.swiglu_limit};
  options.max_tokens = 0;
  options.mode = key.mode;
  options.activation = key.activation;
  options.activation_params = c.activation_params;
  options.ep = {key.ep_size, key.ep_rank};
  options.device = key.device;
  auto plan = std::make_unique<MoePlan>(MoePlan::create(options));
  return *plans.emplace(key, std::move(plan)).first->second;
}

std::shared_ptr<const DeviceExperts> experts_view(const MoePlan& plan, const DeviceExperts::Pointers& p) {
  using Key = std::tuple<const MoePlan*, const void*, const void*, const void*, const void*>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const DeviceExperts>> views;
  const Key key{&plan, p.w13_codes, p.w13_scales, p.w2_codes, p.w2_scales};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = views.find(key); it != views.end()) return it->second;
  }
  const PlanOptions& o = plan.options();
  auto view = std::make_shared<const DeviceExperts>(DeviceExperts::view(o.config, o.ep, /*layer=*/0, o.device, p));
  std::lock_guard<std::mutex> lock(mutex);
  if (views.size() >= 4096) views.clear();  // callers keep theirs alive
  views.emplace(key, view);
  return view;
}

}  // namespace k3moe::torch_binding
