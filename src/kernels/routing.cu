// One CTA of 4 warps per token. An expert's key is its choice s + bias made orderable as an
// unsigned integer (larger choice, larger value; a NaN choice 1, below every number; 0 marks an
// absent or taken slot) with its id: key a goes before key b when its choice is larger, or equal
// with a lower id, so keys are distinct and their order is the reference's.
//   1. lane l of warp w scores experts 256 w + 32 j + l (sigmoid in float64, rounded once; the
//      scores wait in shared memory by id) and sorts its 8 keys;
//   2. each warp picks the top-K of its quarter in K rounds: the largest head key of the lanes
//      (redux.sync max of the choices, then min of the tied ids when several lanes tie) is
//      candidate k, and its lane drops it;
//   3. each of the 4 K candidates counts the candidates of the other warps before it: its own
//      slot plus that count is its rank among all, and the ranks below K are the top-K, in order.
// Every step runs on all lanes at once but the K rounds of step 2, whose chain is two or three
// warp-wide operations long; the loads of step 1 are all issued before any is used.
#include "kernels/routing.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/stage_marks.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = kRoutingMaxExperts / kThreads;  // keys per lane in step 2
constexpr int kWarpExperts = kRoutingMaxExperts / kWarps;
constexpr uint32_t kTaken = 0;

__device__ __forceinline__ uint32_t orderable(float choice) {
  if (is_nan(choice)) return 1;
  uint32_t u = float_bits(choice);
  if (u == 0x80000000u) u = 0;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct Key {
  uint32_t order, id;
};

__device__ __forceinline__ bool before(const Key& a, const Key& b) {
  return (a.order > b.order) | ((a.order == b.order) & (a.id < b.id));
}

__device__ __forceinline__ void compare_swap(Key& a, Key& b) {
  const bool swap = before(b, a);
  const Key lo = swap ? b : a, hi = swap ? a : b;
  a = lo;
  b = hi;
}

// The lane's 8 keys in order (Batcher's odd-even merge sort: 19 compare-swaps in 6 layers).
__device__ __forceinline__ void sort8(Key (&k)[8]) {
  static_assert(kPerLane == 8);
  constexpr int kPairs[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {1, 2}, {5, 6},
                                 {0, 4}, {1, 5}, {2, 6}, {3, 7}, {2, 4}, {3, 5}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
  for (int p = 0; p < 19; ++p) compare_swap(k[kPairs[p][0]], k[kPairs[p][1]]);
}

__global__ void __launch_bounds__(kThreads) routing_kernel(RoutingArgs a) {
  __shared__ float s_score[kRoutingMaxExperts];
  __shared__ Key s_cand[kWarps][kRoutingMaxTopK];
  __shared__ int32_t s_win_id[kRoutingMaxTopK];
  __shared__ float s_win_score[kRoutingMaxTopK];
  mark_start(a.times);
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  const int token = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* logits = a.logits + int64_t(token) * a.num_experts;

  // Every load first (absent experts read the last one's, in bounds): one round trip, not eight.
  float logit[kPerLane], bias[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = min(warp * kWarpExperts + j * 32 + lane, a.num_experts - 1);
    logit[j] = logits[e];
    bias[j] = a.bias[e];
  }
  Key key[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = warp * kWarpExperts + j * 32 + lane;
    // The contract's sigmoid: evaluated in float64, rounded once to fp32.
    const float s = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logit[j]))));
    const bool present = e < a.num_experts;
    key[j] = {present ? orderable(s + bias[j]) : kTaken, uint32_t(e)};  // absent: after every present one
    if (present) s_score[e] = s;
  }
  sort8(key);

  for (int k = 0; k < a.top_k; ++k) {
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key[0].order);
    uint32_t owners = __ballot_sync(0xFFFFFFFFu, key[0].order == top);
    if (__popc(owners) > 1) {  // equal choices: the lowest id goes first
      const uint32_t low = __reduce_min_sync(0xFFFFFFFFu, key[0].order == top ? key[0].id : 0xFFFFFFFFu);
      owners = __ballot_sync(0xFFFFFFFFu, key[0].order == top && key[0].id == low);
    }
    if (lane == __ffs(owners) - 1) {  // several only among the fillers of an exhausted warp
      s_cand[warp][k] = key[0];
#pragma unroll
      for (int j = 0; j + 1 < kPerLane; ++j) key[j] = key[j + 1];
      key[kPerLane - 1] = {kTaken, 0xFFFFFFFFu};
    }
  }
  __syncthreads();

  // Each warp's candidates are in order, so the count of another warp's before a key is found by
  // binary search (6 steps cover K <= 32).
  static_assert(kRoutingMaxTopK == 32 && kWarps * kRoutingMaxTopK == kThreads, "thread = (warp, slot)");
  if (lane < a.top_k) {
    const Key mine = s_cand[warp][lane];
    int rank = lane;
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const Key* list = s_cand[(warp + w) % kWarps];
      int count = 0;
#pragma unroll
      for (int step = kRoutingMaxTopK; step > 0; step /= 2)
        if (count + step <= a.top_k && before(list[count + step - 1], mine)) count += step;
      rank += count;
    }
    if (rank < a.top_k) {
      s_win_id[rank] = int32_t(mine.id);
      const float score = s_score[mine.id];
      s_win_score[rank] = is_nan(score) ? 0.0f : score;  // a NaN score weighs 0
    }
  }
  __syncthreads();
  if (warp != 0 || lane >= a.top_k) return;

  float weight = s_win_score[lane];
  if (a.renormalize) {
    float sum = 0.0f;  // in slot order, as the reference
#pragma unroll
    for (int k = 0; k < kRoutingMaxTopK; ++k)
      if (k < a.top_k) sum += s_win_score[k];
    weight = weight / (sum + 1e-20f);
  }
  a.ids[int64_t(token) * a.top_k + lane] = s_win_id[lane];
  a.weights[int64_t(token) * a.top_k + lane] = weight * a.scaling;
  if (lane == 0) mark_end(a.times);
}

}  // namespace

void launch_routing(const RoutingArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  launch_dependent(routing_kernel, args.tokens, kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
