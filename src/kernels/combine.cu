// Two mappings of one computation. Few tokens: a group of G lanes (G = top_k rounded up to a power
// of two) per 4 outputs of a token: lane k loads slot k's splits together, sums them in split
// order and scales by the slot's weight; the group then adds its lanes with a fixed butterfly.
// Every load of a token is in flight at once, so decode does not wait for top_k dependent round
// trips. Many tokens: one thread per 4 outputs does the same for all G slots and adds them in the
// butterfly's order (a pairwise tree over slot order), so both give the same bits with G times
// fewer threads (at prefill the lane groups were bound by launching threads, not by memory). From
// kCombineTokenWarpsFrom tokens, a warp takes 128 consecutive quads of one token (4 per lane): a
// token with more than two local slots adds each quad's tree as one thread per outputs does; one
// with at most two (expert parallelism: most slots are remote) loads their terms for its four quads
// together and applies what the tree's additions of +0 do to them (tree_of_two).
#include "kernels/combine.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/routing.cuh"
#include "kernels/stage_marks.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 256;
// The kernels are compiled for at most 1, 2, 4 or 8 splits (GEMM2's K ranges; 1 on the wgmma path):
// the split loop's predicated loads and adds are issued whether a split exists or not, and at 8
// they were ~7 of every 8 instructions of a one-split combine (local28 T = 4096: 322 -> 233 us alone
// without them, DRAM 62 -> 86 % of peak; bench/NOTES.md, Session 36).
constexpr int combine_max_splits(int splits) { return splits == 1 ? 1 : splits == 2 ? 2 : splits <= 4 ? 4 : 8; }
static_assert(kMaxCombineSplits == 8);
// NOTE: 8 blocks of 128 per SM leave the outputs kernel 64 registers (59 used at top-16); holding
// all 16 slots' values at once took 86-104, 4-5 blocks per SM, and ~1-2 us more at ep16 T = 256
// (bench/NOTES.md, Session 12). With fewer splits ptxas hoists more loads: the most blocks at
// which it does not spill.
constexpr int kOutputThreads = 128;
template <int kMaxSplits>
constexpr int kOutputBlocksPerSm = kMaxSplits == 1 ? 6 : kMaxSplits == 4 ? 7 : 8;

// Slot k's row of y (-1: none). The permutation wrote it and completed before GEMM2 started (the
// launches' chain of waits), so the kernels load it (or ask L1 for it) before their own wait.
__device__ __forceinline__ int32_t slot_row_of(const CombineArgs& a, int token, int k) {
  return k < a.top_k ? a.slot_row[int64_t(token) * a.top_k + k] : -1;
}

// A slot's contribution to outputs h .. h + 3 of its token: w * (sum of the splits of its row), or
// zeros (row -1).
template <int kMaxSplits>
__device__ __forceinline__ float4 slot_term(const CombineArgs& a, int32_t row, float w, int h) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row >= 0 && h < a.hidden) {
    const float* y = a.y + int64_t(row) * a.hidden + h;
    v = *reinterpret_cast<const float4*>(y);
#pragma unroll
    for (int s = 1; s < kMaxSplits; ++s)
      if (s < a.splits) {
        const float4 part = *reinterpret_cast<const float4*>(y + s * a.split_stride);
        v.x += part.x;
        v.y += part.y;
        v.z += part.z;
        v.w += part.w;
      }
    // NOTE: rounded products (no contraction into the adds that follow), in both mappings.
    v = make_float4(__fmul_rn(w, v.x), __fmul_rn(w, v.y), __fmul_rn(w, v.z), __fmul_rn(w, v.w));
  }
  return v;
}

// Slot k of `token`: its weight read only where its row is local.
template <int kMaxSplits>
__device__ __forceinline__ float4 slot_term(const CombineArgs& a, int token, int k, int32_t row, int h) {
  return slot_term<kMaxSplits>(a, row, row >= 0 && h < a.hidden ? a.weights[int64_t(token) * a.top_k + k] : 0.0f, h);
}

__device__ __forceinline__ void store_outputs(const CombineArgs& a, int token, int h, float4 v) {
  const uint2 packed{uint32_t(float_to_bf16_bits(v.x)) | (uint32_t(float_to_bf16_bits(v.y)) << 16),
                     uint32_t(float_to_bf16_bits(v.z)) | (uint32_t(float_to_bf16_bits(v.w)) << 16)};
  *reinterpret_cast<uint2*>(a.out + int64_t(token) * a.hidden + h) = packed;
}

template <int kMaxSplits>
__global__ void __launch_bounds__(kThreads) combine_lanes_kernel(CombineArgs a, int group) {
  const int token = blockIdx.x, k = threadIdx.x % group;
  const int h = (blockIdx.y * (kThreads / group) + threadIdx.x / group) * 4;
  const int32_t row = slot_row_of(a, token, k);
  mark_start(a.times);
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  float4 v = slot_term<kMaxSplits>(a, token, k, row, h);
  // NOTE: lanes i and i ^ offset add the same two values, so every lane of the group ends with the
  // same, order-fixed sum.
  for (int offset = 1; offset < group; offset *= 2) {
    v.x += __shfl_xor_sync(0xFFFFFFFFu, v.x, offset);
    v.y += __shfl_xor_sync(0xFFFFFFFFu, v.y, offset);
    v.z += __shfl_xor_sync(0xFFFFFFFFu, v.z, offset);
    v.w += __shfl_xor_sync(0xFFFFFFFFu, v.w, offset);
  }
  if (k == 0 && h < a.hidden) store_outputs(a, token, h, v);
  if (threadIdx.x == 0) mark_end(a.times);
}

// The butterfly's tree evaluated leaf by leaf (post-order): only one path of partial sums lives, so
// a thread needs few registers and more of them are resident (absent slots load nothing).
template <int kMaxSplits, int kLo, int kHi>
__device__ __forceinline__ float4 subtree(const CombineArgs& a, int token, int h) {
  if constexpr (kHi - kLo == 1) {
    return slot_term<kMaxSplits>(a, token, kLo, slot_row_of(a, token, kLo), h);
  } else {
    constexpr int kMid = (kLo + kHi) / 2;
    const float4 l = subtree<kMaxSplits, kLo, kMid>(a, token, h), r = subtree<kMaxSplits, kMid, kHi>(a, token, h);
    return make_float4(l.x + r.x, l.y + r.y, l.z + r.z, l.w + r.w);
  }
}

template <int kGroup, int kMaxSplits>
__global__ void __launch_bounds__(kOutputThreads, kOutputBlocksPerSm<kMaxSplits>)
    combine_outputs_kernel(CombineArgs a) {
  const int quads = a.hidden / 4;
  const int64_t index = int64_t(blockIdx.x) * kOutputThreads + threadIdx.x;
  mark_start(a.times);
  if (index >= int64_t(a.tokens) * quads) return;
  const int token = int(index / quads), h = int(index % quads) * 4;
  ptx::prefetch_l1(a.slot_row + int64_t(token) * a.top_k);  // the rows, re-read from L1 below
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  store_outputs(a, token, h, subtree<kMaxSplits, 0, kGroup>(a, token, h));
  if (threadIdx.x == 0) mark_end(a.times);
}

__device__ __forceinline__ float4 plus_zero(float4 v) {
  return make_float4(__fadd_rn(v.x, 0.0f), __fadd_rn(v.y, 0.0f), __fadd_rn(v.z, 0.0f), __fadd_rn(v.w, 0.0f));
}

// The tree's sum when only leaves i and j (j < 0: leaf i alone) are local, the others +0: what
// the tree's additions do to them, in the same order. A leaf meets its first +0 at the level below
// the pair's common subtree (x + 0 is x, but -0 becomes +0), the pair is added there, and the sum
// meets +0 again unless that subtree is the whole tree.
__device__ __forceinline__ float4 tree_of_two(float4 a, float4 b, int i, int j, int group) {
  if (j < 0) return group > 1 ? plus_zero(a) : a;
  const int level = 31 - __clz(i ^ j);  // the children of the common subtree hold 2^level leaves
  if (level > 0) {
    a = plus_zero(a);
    b = plus_zero(b);
  }
  const float4 s = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  return (2 << level) < group ? plus_zero(s) : s;
}

template <int kGroup, int kMaxSplits>
__global__ void __launch_bounds__(kOutputThreads, kOutputBlocksPerSm<kMaxSplits>)
    combine_token_warps_kernel(CombineArgs a) {
  const int quads = a.hidden / 4, lane = threadIdx.x % 32;
  const int warps_per_token = (quads + 127) / 128;
  const int64_t warp = (int64_t(blockIdx.x) * kOutputThreads + threadIdx.x) / 32;
  mark_start(a.times);
  if (warp >= int64_t(a.tokens) * warps_per_token) return;  // whole warps
  const int token = int(warp / warps_per_token);
  const int quad0 = int(warp % warps_per_token) * 128 + lane;
  const int32_t row = slot_row_of(a, token, lane);
  ptx::prefetch_l1(a.slot_row + int64_t(token) * a.top_k);  // every slot local: re-read from L1 below
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  const uint32_t present = __ballot_sync(0xFFFFFFFFu, row >= 0);
  if (__popc(present) > 2) {  // the whole tree, quad by quad (its leaf loads hoisted)
#pragma unroll 1
    for (int q = 0; q < 4; ++q)
      if ((quad0 + 32 * q) * 4 < a.hidden)
        store_outputs(a, token, (quad0 + 32 * q) * 4,
                      subtree<kMaxSplits, 0, kGroup>(a, token, (quad0 + 32 * q) * 4));
  } else {  // at most two local slots: their terms for the four quads, loaded together
    const int i = present ? __ffs(present) - 1 : 0;
    const int j = __popc(present) == 2 ? 31 - __clz(present) : -1;
    const float w = row >= 0 ? a.weights[int64_t(token) * a.top_k + lane] : 0.0f;
    const int32_t row_i = __shfl_sync(0xFFFFFFFFu, row, i), row_j = __shfl_sync(0xFFFFFFFFu, row, j < 0 ? i : j);
    const float w_i = __shfl_sync(0xFFFFFFFFu, w, i), w_j = __shfl_sync(0xFFFFFFFFu, w, j < 0 ? i : j);
    float4 term_i[4], term_j[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      term_i[q] = slot_term<kMaxSplits>(a, row_i, w_i, (quad0 + 32 * q) * 4);
      term_j[q] = slot_term<kMaxSplits>(a, j < 0 ? -1 : row_j, w_j, (quad0 + 32 * q) * 4);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if ((quad0 + 32 * q) * 4 < a.hidden)
        store_outputs(a, token, (quad0 + 32 * q) * 4, tree_of_two(term_i[q], term_j[q], i, j, kGroup));
  }
  if (threadIdx.x == 0) mark_end(a.times);
}

template <int kGroup, int kMaxSplits>
void launch_outputs(const CombineArgs& a, cudaStream_t stream) {
  const bool token_warps = a.mapping == CombineMapping::TokenWarps ||
                           (a.mapping == CombineMapping::Auto && a.mostly_remote && a.tokens >= kCombineTokenWarpsFrom);
  if (token_warps) {
    const int64_t threads = int64_t(a.tokens) * ((a.hidden / 4 + 127) / 128) * 32;
    return launch_dependent(combine_token_warps_kernel<kGroup, kMaxSplits>,
                            dim3(unsigned((threads + kOutputThreads - 1) / kOutputThreads)), kOutputThreads, 0, stream,
                            a);
  }
  const int64_t threads = int64_t(a.tokens) * (a.hidden / 4);
  launch_dependent(combine_outputs_kernel<kGroup, kMaxSplits>,
                   dim3(unsigned((threads + kOutputThreads - 1) / kOutputThreads)), kOutputThreads, 0, stream, a);
}

template <int kMaxSplits>
void launch_combine_kernel(const CombineArgs& args, int group, cudaStream_t stream) {
  const bool by_output = args.mapping == CombineMapping::ThreadPerOutputs || args.mapping == CombineMapping::TokenWarps ||
                         (args.mapping == CombineMapping::Auto && args.tokens >= kCombineThreadPerOutputsFrom);
  if (by_output) {
    switch (group) {
      case 1: return launch_outputs<1, kMaxSplits>(args, stream);
      case 2: return launch_outputs<2, kMaxSplits>(args, stream);
      case 4: return launch_outputs<4, kMaxSplits>(args, stream);
      case 8: return launch_outputs<8, kMaxSplits>(args, stream);
      case 16: return launch_outputs<16, kMaxSplits>(args, stream);
      default: break;  // larger top_k: the lane groups
    }
  }
  const int outputs_per_block = kThreads / group * 4;
  const dim3 grid(args.tokens, (args.hidden + outputs_per_block - 1) / outputs_per_block);
  launch_dependent(combine_lanes_kernel<kMaxSplits>, grid, kThreads, 0, stream, args, group);
}

}  // namespace

void launch_combine(const CombineArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxCombineSplits, "combine: splits must be 1..",
              kMaxCombineSplits, ", got ", args.splits);
  int group = 1;
  while (group < args.top_k) group *= 2;
  switch (combine_max_splits(args.splits)) {
    case 1: return launch_combine_kernel<1>(args, group, stream);
    case 2: return launch_combine_kernel<2>(args, group, stream);
    case 4: return launch_combine_kernel<4>(args, group, stream);
    default: return launch_combine_kernel<8>(args, group, stream);
  }
}

}  // namespace k3moe::kernels
