// One warp per token. Each lane keeps the choice keys of experts lane, lane + 32, ...; K rounds of
// (lane max, warp max) pick the winners in order. A key packs the choice, made orderable as an
// unsigned integer, above the complement of the expert id, so that the larger key is the larger
// choice and, among equal choices, the lower id. A NaN choice gets the smallest live key; a taken
// expert gets 0.
#include "kernels/routing.cuh"

#include "k3moe/formats.h"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kRoutingMaxExperts / 32;

__device__ __forceinline__ uint32_t orderable(float choice) {
  if (is_nan(choice)) return 1;
  uint32_t u = float_bits(choice);
  if (u == 0x80000000u) u = 0;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock) routing_kernel(RoutingArgs a) {
  const int lane = threadIdx.x % 32;
  const int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= a.tokens) return;
  const float* logits = a.logits + int64_t(token) * a.num_experts;

  uint64_t key[kPerLane];
  float score[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    key[j] = 0;
    score[j] = 0.0f;
    if (e < a.num_experts) {
      // The contract's sigmoid: evaluated in float64, rounded once to fp32.
      const float s = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[e]))));
      score[j] = s;
      key[j] = (uint64_t(orderable(s + a.bias[e])) << 32) | (0xFFFFFFFFu - uint32_t(e));
    }
  }

  int my_id = -1;
  float my_score = 0.0f;
  for (int k = 0; k < a.top_k; ++k) {
    uint64_t best = 0;
    float best_score = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (key[j] > best) {
        best = key[j];
        best_score = score[j];
      }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const uint64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
      const float other_score = __shfl_xor_sync(0xFFFFFFFFu, best_score, offset);
      if (other > best) {
        best = other;
        best_score = other_score;
      }
    }
    const int id = int(0xFFFFFFFFu - uint32_t(best));
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (key[j] == best) key[j] = 0;
    if (lane == k) {
      my_id = id;
      my_score = is_nan(best_score) ? 0.0f : best_score;  // a NaN score weighs 0
    }
  }

  float weight = my_score;
  if (a.renormalize) {
    float sum = 0.0f;  // in slot order, as the reference
    for (int k = 0; k < a.top_k; ++k) sum += __shfl_sync(0xFFFFFFFFu, my_score, k);
    weight = my_score / (sum + 1e-20f);
  }
  if (lane < a.top_k) {
    a.ids[int64_t(token) * a.top_k + lane] = my_id;
    a.weights[int64_t(token) * a.top_k + lane] = weight * a.scaling;
  }
}

}  // namespace

void launch_routing(const RoutingArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  const int blocks = (args.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  routing_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(args);
  K3MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace k3moe::kernels
