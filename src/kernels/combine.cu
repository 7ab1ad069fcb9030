// A group of G lanes (G = top_k rounded up to a power of two) per 4 outputs of a token: lane k
// loads slot k's splits together, sums them in split order and scales by the slot's weight; the
// group then adds its lanes with a fixed butterfly. Every load of a token is in flight at once,
// so decode does not wait for top_k dependent round trips.
#include "kernels/combine.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/routing.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) combine_kernel(CombineArgs a, int group) {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int token = blockIdx.x, k = threadIdx.x % group;
  const int h = (blockIdx.y * (kThreads / group) + threadIdx.x / group) * 4;
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  const int32_t row = k < a.top_k ? a.slot_row[int64_t(token) * a.top_k + k] : -1;
  if (row >= 0 && h < a.hidden) {
    float4 part[kMaxCombineSplits];
#pragma unroll
    for (int s = 0; s < kMaxCombineSplits; ++s)
      if (s < a.splits) part[s] = *reinterpret_cast<const float4*>(a.y + s * a.split_stride + int64_t(row) * a.hidden + h);
    v = part[0];
#pragma unroll
    for (int s = 1; s < kMaxCombineSplits; ++s)
      if (s < a.splits) {
        v.x += part[s].x;
        v.y += part[s].y;
        v.z += part[s].z;
        v.w += part[s].w;
      }
    const float w = a.weights[int64_t(token) * a.top_k + k];
    v = make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
  }
  // NOTE: lanes i and i ^ offset add the same two values, so every lane of the group ends with the
  // same, order-fixed sum.
  for (int offset = 1; offset < group; offset *= 2) {
    v.x += __shfl_xor_sync(0xFFFFFFFFu, v.x, offset);
    v.y += __shfl_xor_sync(0xFFFFFFFFu, v.y, offset);
    v.z += __shfl_xor_sync(0xFFFFFFFFu, v.z, offset);
    v.w += __shfl_xor_sync(0xFFFFFFFFu, v.w, offset);
  }
  if (k == 0 && h < a.hidden) {
    const uint2 packed{uint32_t(float_to_bf16_bits(v.x)) | (uint32_t(float_to_bf16_bits(v.y)) << 16),
                       uint32_t(float_to_bf16_bits(v.z)) | (uint32_t(float_to_bf16_bits(v.w)) << 16)};
    *reinterpret_cast<uint2*>(a.out + int64_t(token) * a.hidden + h) = packed;
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxCombineSplits, "combine: splits must be 1..",
              kMaxCombineSplits, ", got ", args.splits);
  int group = 1;
  while (group < args.top_k) group *= 2;
  const int outputs_per_block = kThreads / group * 4;
  const dim3 grid(args.tokens, (args.hidden + outputs_per_block - 1) / outputs_per_block);
  launch_dependent(combine_kernel, grid, kThreads, 0, stream, args, group);
}

}  // namespace k3moe::kernels
