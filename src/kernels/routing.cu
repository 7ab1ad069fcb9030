// One CTA of 4 warps per token. The choice s + bias is made orderable as an unsigned integer
// (larger choice, larger value; a NaN choice 1, below every number; 0 marks a taken expert).
//   1. every thread scores up to 8 experts (sigmoid in float64, rounded once) into shared memory;
//   2. each warp picks the top-K of its quarter of the experts in K rounds: each lane's best, then
//      the warp's largest choice (redux.sync max) and, among the lanes holding it, the lowest id
//      (redux.sync min) -- ties go to the lower id;
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
constexpr uint32_t kTaken = 0;

__device__ __forceinline__ uint32_t orderable(float choice) {
  if (is_nan(choice)) return 1;
  uint32_t u = float_bits(choice);
  if (u == 0x80000000u) u = 0;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// K rounds over the lane's N entries (choice order, expert id, score). Round k's winner goes to
// lane k's outputs; winners are marked taken.
template <int N>
__device__ __forceinline__ void select_top_k(uint32_t (&order)[N], const uint32_t (&id)[N], const float (&score)[N],
                                             int top_k, int lane, uint32_t& out_order, uint32_t& out_id,
                                             float& out_score) {
  for (int k = 0; k < top_k; ++k) {
    uint32_t best_order = kTaken, best_id = 0xFFFFFFFFu;
    int best_j = 0;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (order[j] > best_order || (order[j] == best_order && order[j] != kTaken && id[j] < best_id)) {
        best_order = order[j];
        best_id = id[j];
        best_j = j;
      }
    const uint32_t warp_order = __reduce_max_sync(0xFFFFFFFFu, best_order);
    const uint32_t warp_id = __reduce_min_sync(0xFFFFFFFFu, best_order == warp_order ? best_id : 0xFFFFFFFFu);
    const bool mine = best_order == warp_order && best_id == warp_id;
    const int owner = __ffs(__ballot_sync(0xFFFFFFFFu, mine)) - 1;
    float winner_score = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (mine && j == best_j) {
        winner_score = score[j];
        order[j] = kTaken;
      }
    winner_score = __shfl_sync(0xFFFFFFFFu, winner_score, owner);
    if (lane == k) {
      out_order = warp_order;
      out_id = warp_id;
      out_score = winner_score;
    }
  }
}

__global__ void __launch_bounds__(kThreads) routing_kernel(RoutingArgs a) {
  __shared__ uint32_t s_order[kRoutingMaxExperts];
  __shared__ float s_score[kRoutingMaxExperts];
  __shared__ uint32_t s_cand_order[kWarps * kRoutingMaxTopK], s_cand_id[kWarps * kRoutingMaxTopK];
  __shared__ float s_cand_score[kWarps * kRoutingMaxTopK];
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int token = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* logits = a.logits + int64_t(token) * a.num_experts;

  for (int e = threadIdx.x; e < kRoutingMaxExperts; e += kThreads) {
    uint32_t order = kTaken;  // absent experts never win
    float s = 0.0f;
    if (e < a.num_experts) {
      // The contract's sigmoid: evaluated in float64, rounded once to fp32.
      s = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[e]))));
      order = orderable(s + a.bias[e]);
    }
    s_order[e] = order;
    s_score[e] = s;
  }
  __syncthreads();

  uint32_t order[kPerLane], id[kPerLane];
  float score[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = warp * (kRoutingMaxExperts / kWarps) + j * 32 + lane;
    order[j] = s_order[e];
    id[j] = uint32_t(e);
    score[j] = s_score[e];
  }
  uint32_t cand_order = kTaken, cand_id = 0xFFFFFFFFu;
  float cand_score = 0.0f;
  select_top_k(order, id, score, a.top_k, lane, cand_order, cand_id, cand_score);
  s_cand_order[warp * kRoutingMaxTopK + lane] = lane < a.top_k ? cand_order : kTaken;
  s_cand_id[warp * kRoutingMaxTopK + lane] = cand_id;
  s_cand_score[warp * kRoutingMaxTopK + lane] = cand_score;
  __syncthreads();
  if (warp != 0) return;

  uint32_t corder[kCandidatesPerLane], cid[kCandidatesPerLane];
  float cscore[kCandidatesPerLane];
#pragma unroll
  for (int j = 0; j < kCandidatesPerLane; ++j) {
    corder[j] = s_cand_order[j * 32 + lane];
    cid[j] = s_cand_id[j * 32 + lane];
    cscore[j] = s_cand_score[j * 32 + lane];
  }
  uint32_t my_order = kTaken, my_id = 0;
  float my_score = 0.0f;
  select_top_k(corder, cid, cscore, a.top_k, lane, my_order, my_id, my_score);
  if (is_nan(my_score)) my_score = 0.0f;  // a NaN score weighs 0

  float weight = my_score;
  if (a.renormalize) {
    float sum = 0.0f;  // in slot order, as the reference
    for (int k = 0; k < a.top_k; ++k) sum += __shfl_sync(0xFFFFFFFFu, my_score, k);
    weight = my_score / (sum + 1e-20f);
  }
  if (lane < a.top_k) {
    a.ids[int64_t(token) * a.top_k + lane] = int32_t(my_id);
    a.weights[int64_t(token) * a.top_k + lane] = weight * a.scaling;
  }
}

}  // namespace

void launch_routing(const RoutingArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  launch_dependent(routing_kernel, args.tokens, kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
