// One CTA of 4 warps per token. A choice key packs the choice, made orderable as an unsigned
// integer, above the complement of the expert id: the larger key is the larger choice and, among
// equal choices, the lower id. A NaN choice gets the smallest live key; a taken expert gets 0.
//   1. every thread scores up to 8 experts (sigmoid in float64, rounded once) into shared memory;
//   2. each warp picks the top-K of its quarter of the experts by K rounds of (lane max, warp max);
//   3. warp 0 picks the top-K of the 4 K candidates the same way: the global top-K, in order.
#include "kernels/routing.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = kRoutingMaxExperts / kThreads;  // experts per lane in step 2
constexpr int kCandidatesPerLane = kWarps * kRoutingMaxTopK / 32;

__device__ __forceinline__ uint32_t orderable(float choice) {
  if (is_nan(choice)) return 1;
  uint32_t u = float_bits(choice);
  if (u == 0x80000000u) u = 0;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ int key_id(uint64_t key) { return int(0xFFFFFFFFu - uint32_t(key)); }

// K rounds over the lane's N keys: the k-th round's winner (key, score) lands in lane k's outputs.
template <int N>
__device__ __forceinline__ void select_top_k(uint64_t (&key)[N], const float (&score)[N], int top_k, int lane,
                                             uint64_t& out_key, float& out_score) {
  for (int k = 0; k < top_k; ++k) {
    uint64_t best = 0;
    float best_score = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j)
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
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (key[j] == best) key[j] = 0;
    if (lane == k) {
      out_key = best;
      out_score = best_score;
    }
  }
}

__global__ void __launch_bounds__(kThreads) routing_kernel(RoutingArgs a) {
  __shared__ uint64_t s_key[kRoutingMaxExperts];
  __shared__ float s_score[kRoutingMaxExperts];
  __shared__ uint64_t s_cand_key[kWarps * kRoutingMaxTopK];
  __shared__ float s_cand_score[kWarps * kRoutingMaxTopK];
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int token = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* logits = a.logits + int64_t(token) * a.num_experts;

  for (int e = threadIdx.x; e < kRoutingMaxExperts; e += kThreads) {
    uint64_t key = 0;
    float s = 0.0f;
    if (e < a.num_experts) {
      // The contract's sigmoid: evaluated in float64, rounded once to fp32.
      s = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[e]))));
      key = (uint64_t(orderable(s + a.bias[e])) << 32) | (0xFFFFFFFFu - uint32_t(e));
    }
    s_key[e] = key;
    s_score[e] = s;
  }
  __syncthreads();

  uint64_t key[kPerLane];
  float score[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = warp * (kRoutingMaxExperts / kWarps) + j * 32 + lane;
    key[j] = s_key[e];
    score[j] = s_score[e];
  }
  uint64_t cand_key = 0;
  float cand_score = 0.0f;
  select_top_k(key, score, a.top_k, lane, cand_key, cand_score);
  s_cand_key[warp * kRoutingMaxTopK + lane] = lane < a.top_k ? cand_key : 0;
  s_cand_score[warp * kRoutingMaxTopK + lane] = cand_score;
  __syncthreads();
  if (warp != 0) return;

  uint64_t ckey[kCandidatesPerLane];
  float cscore[kCandidatesPerLane];
#pragma unroll
  for (int j = 0; j < kCandidatesPerLane; ++j) {
    ckey[j] = s_cand_key[j * 32 + lane];
    cscore[j] = s_cand_score[j * 32 + lane];
  }
  uint64_t my_key = 0;
  float my_score = 0.0f;
  select_top_k(ckey, cscore, a.top_k, lane, my_key, my_score);
  if (is_nan(my_score)) my_score = 0.0f;  // a NaN score weighs 0

  float weight = my_score;
  if (a.renormalize) {
    float sum = 0.0f;  // in slot order, as the reference
    for (int k = 0; k < a.top_k; ++k) sum += __shfl_sync(0xFFFFFFFFu, my_score, k);
    weight = my_score / (sum + 1e-20f);
  }
  if (lane < a.top_k) {
    a.ids[int64_t(token) * a.top_k + lane] = key_id(my_key);
    a.weights[int64_t(token) * a.top_k + lane] = weight * a.scaling;
  }
}

}  // namespace

void launch_routing(const RoutingArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  launch_dependent(routing_kernel, args.tokens, kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
