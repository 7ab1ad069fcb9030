// Two mappings of one computation. Few tokens: a group of G lanes (G = top_k rounded up to a power
// of two) per 4 outputs of a token: lane k loads slot k's splits together, sums them in split
// order and scales by the slot's weight; the group then adds its lanes with a fixed butterfly.
// Every load of a token is in flight at once, so decode does not wait for top_k dependent round
// trips. Many tokens: one thread per 4 outputs does the same for all G slots and adds them in the
// butterfly's order (a pairwise tree over slot order), so both give the same bits with G times
// fewer threads (at prefill the lane groups were bound by launching threads, not by memory).
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
// NOTE: 8 blocks of 128 per SM leave the outputs kernel 64 registers (59 used at top-16); holding
// all 16 slots' values at once took 86-104, 4-5 blocks per SM, and ~1-2 us more at ep16 T = 256
// (bench/NOTES.md, Session 12).
constexpr int kOutputThreads = 128;
constexpr int kOutputBlocksPerSm = 8;

// Slot k's row of y (-1: none). The permutation wrote it and completed before GEMM2 started (the
// launches' chain of waits), so the kernels load it (or ask L1 for it) before their own wait.
__device__ __forceinline__ int32_t slot_row_of(const CombineArgs& a, int token, int k) {
  return k < a.top_k ? a.slot_row[int64_t(token) * a.top_k + k] : -1;
}

// Slot k's contribution to outputs h .. h + 3 of a token: w * (sum of its splits), or zeros.
__device__ __forceinline__ float4 slot_term(const CombineArgs& a, int token, int k, int32_t row, int h) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row >= 0 && h < a.hidden) {
    const float* y = a.y + int64_t(row) * a.hidden + h;
    v = *reinterpret_cast<const float4*>(y);
#pragma unroll
    for (int s = 1; s < kMaxCombineSplits; ++s)
      if (s < a.splits) {
        const float4 part = *reinterpret_cast<const float4*>(y + s * a.split_stride);
        v.x += part.x;
        v.y += part.y;
        v.z += part.z;
        v.w += part.w;
      }
    const float w = a.weights[int64_t(token) * a.top_k + k];
    // NOTE: rounded products (no contraction into the adds that follow), in both mappings.
    v = make_float4(__fmul_rn(w, v.x), __fmul_rn(w, v.y), __fmul_rn(w, v.z), __fmul_rn(w, v.w));
  }
  return v;
}

__device__ __forceinline__ void store_outputs(const CombineArgs& a, int token, int h, float4 v) {
  const uint2 packed{uint32_t(float_to_bf16_bits(v.x)) | (uint32_t(float_to_bf16_bits(v.y)) << 16),
                     uint32_t(float_to_bf16_bits(v.z)) | (uint32_t(float_to_bf16_bits(v.w)) << 16)};
  *reinterpret_cast<uint2*>(a.out + int64_t(token) * a.hidden + h) = packed;
}

__global__ void __launch_bounds__(kThreads) combine_lanes_kernel(CombineArgs a, int group) {
  const int token = blockIdx.x, k = threadIdx.x % group;
  const int h = (blockIdx.y * (kThreads / group) + threadIdx.x / group) * 4;
  const int32_t row = slot_row_of(a, token, k);
  mark_start(a.times);
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  float4 v = slot_term(a, token, k, row, h);
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
template <int kLo, int kHi>
__device__ __forceinline__ float4 subtree(const CombineArgs& a, int token, int h) {
  if constexpr (kHi - kLo == 1) {
    return slot_term(a, token, kLo, slot_row_of(a, token, kLo), h);
  } else {
    constexpr int kMid = (kLo + kHi) / 2;
    const float4 l = subtree<kLo, kMid>(a, token, h), r = subtree<kMid, kHi>(a, token, h);
    return make_float4(l.x + r.x, l.y + r.y, l.z + r.z, l.w + r.w);
  }
}

template <int kGroup>
__global__ void __launch_bounds__(kOutputThreads, kOutputBlocksPerSm) combine_outputs_kernel(CombineArgs a) {
  const int quads = a.hidden / 4;
  const int64_t index = int64_t(blockIdx.x) * kOutputThreads + threadIdx.x;
  mark_start(a.times);
  if (index >= int64_t(a.tokens) * quads) return;
  const int token = int(index / quads), h = int(index % quads) * 4;
  ptx::prefetch_l1(a.slot_row + int64_t(token) * a.top_k);  // the rows, re-read from L1 below
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  store_outputs(a, token, h, subtree<0, kGroup>(a, token, h));
  if (threadIdx.x == 0) mark_end(a.times);
}

template <int kGroup>
void launch_outputs(const CombineArgs& a, cudaStream_t stream) {
  const int64_t threads = int64_t(a.tokens) * (a.hidden / 4);
  launch_dependent(combine_outputs_kernel<kGroup>, dim3(unsigned((threads + kOutputThreads - 1) / kOutputThreads)),
                   kOutputThreads, 0, stream, a);
}

}  // namespace

void launch_combine(const CombineArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxCombineSplits, "combine: splits must be 1..",
              kMaxCombineSplits, ", got ", args.splits);
  int group = 1;
  while (group < args.top_k) group *= 2;
  const bool by_output = args.mapping == CombineMapping::ThreadPerOutputs ||
                         (args.mapping == CombineMapping::Auto && args.tokens >= kCombineThreadPerOutputsFrom);
  if (by_output) {
    switch (group) {
      case 1: return launch_outputs<1>(args, stream);
      case 2: return launch_outputs<2>(args, stream);
      case 4: return launch_outputs<4>(args, stream);
      case 8: return launch_outputs<8>(args, stream);
      case 16: return launch_outputs<16>(args, stream);
      default: break;  // larger top_k: the lane groups
    }
  }
  const int outputs_per_block = kThreads / group * 4;
  const dim3 grid(args.tokens, (args.hidden + outputs_per_block - 1) / outputs_per_block);
  launch_dependent(combine_lanes_kernel, grid, kThreads, 0, stream, args, group);
}

}  // namespace k3moe::kernels
