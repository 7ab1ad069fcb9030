// A thread takes 4 consecutive outputs of a row (an item), two items per pass; 8 threads hold 32
// outputs, one MX group, so the group's amax is a reduction over 8 lanes. The splits' partial sums
// are copied two splits at a time into the thread's own slots of shared memory (cp.async: the
// bytes in flight hold no registers, so an SM keeps ~200 KB in flight, or ~32 KB beside GEMM1's
// CTAs) and added in split order.
#include "kernels/activation.cuh"

#include <algorithm>

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/fast_activation.cuh"
#include "kernels/launch.cuh"
#include "kernels/mxfp4_fragments.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kGroup = 32;
constexpr int kVector = 4;                     // outputs per thread
constexpr int kGroupLanes = kGroup / kVector;  // threads per MX group
constexpr int kThreads = 256;
constexpr int kItems = 2;  // items per thread and pass
constexpr int kBatch = 2;  // splits copied per round

__device__ __forceinline__ void add4(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

__device__ __forceinline__ float4 ld_shared_f4(const float4* p) {
  const uint4 v = ptx::ld_shared_v4(p);
  return {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w)};
}

// The activation of one item from its summed gate and up, rounded and stored. Called by whole
// warps (see activation_kernel).
__device__ __forceinline__ void finish_item(const ActivationArgs& a, int64_t row, int j, const float4& g,
                                            const float4& u) {
  float v[kVector] = {fast_activation(a.activation, a.params, g.x, u.x),
                      fast_activation(a.activation, a.params, g.y, u.y),
                      fast_activation(a.activation, a.params, g.z, u.z),
                      fast_activation(a.activation, a.params, g.w, u.w)};
  if (a.mode == Mode::Mxfp8) {
    uint32_t amax_bits = 0;  // |v| as bits: NaN orders above Inf
#pragma unroll
    for (int i = 0; i < kVector; ++i) amax_bits = max(amax_bits, float_bits(v[i]) & 0x7FFFFFFFu);
#pragma unroll
    for (int offset = 1; offset < kGroupLanes; offset *= 2)
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
    const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
#pragma unroll
    for (int i = 0; i < kVector; ++i) v[i] = round_to_mxfp8(v[i], s);
  }
  const uint2 packed{uint32_t(float_to_bf16_bits(v[0])) | (uint32_t(float_to_bf16_bits(v[1])) << 16),
                     uint32_t(float_to_bf16_bits(v[2])) | (uint32_t(float_to_bf16_bits(v[3])) << 16)};
  *reinterpret_cast<uint2*>(a.inter + row * a.intermediate + j) = packed;
}

__global__ void __launch_bounds__(kThreads) activation_kernel(ActivationArgs a) {
  // NOTE: released early, GEMM2 launches while GEMM1 still runs: its CTAs take the SMs that GEMM1's
  // tail frees and stream their first weights there. They read this stage's output only after
  // their own wait, which covers this stage's end (and so GEMM1's).
  if (a.release_early) ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  if (!a.release_early) ptx::griddepcontrol_launch_dependents();
  // NOTE: a grid of a few waves strides over the rows in use (the grid is sized without knowing
  // how many of the T K slots are local). Items are whole warps apart and I / 4 is a multiple of
  // 32, so an item is valid or not for a whole warp: the shuffles see all 32 lanes. A thread reads
  // back only the slots it copied itself (no barrier).
  __shared__ float4 s_split[kItems][kBatch][2][kThreads];  // [item][split][gate, up][thread]
  const int quads = a.intermediate / kVector;
  const int64_t used = int64_t(a.expert_offset[a.num_local]) * quads;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x; first < used; first += kItems * stride) {
    const float* h[kItems];
    bool valid[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t index = first + i * stride;
      valid[i] = index < used;
      h[i] = a.h + (index / quads) * 2 * a.intermediate + (index % quads) * kVector;
    }
    float4 g[kItems], u[kItems];
    for (int s0 = 0; s0 < a.splits; s0 += kBatch) {
#pragma unroll
      for (int i = 0; i < kItems; ++i)
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (valid[i] && s0 + b < a.splits) {
            ptx::cp_async_16(&s_split[i][b][0][threadIdx.x], h[i] + (s0 + b) * a.split_stride);
            ptx::cp_async_16(&s_split[i][b][1][threadIdx.x], h[i] + (s0 + b) * a.split_stride + a.intermediate);
          }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
#pragma unroll
      for (int i = 0; i < kItems; ++i)
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (valid[i] && s0 + b < a.splits) {
            const float4 gate = ld_shared_f4(&s_split[i][b][0][threadIdx.x]);
            const float4 up = ld_shared_f4(&s_split[i][b][1][threadIdx.x]);
            if (s0 + b == 0) {
              g[i] = gate;
              u[i] = up;
            } else {
              add4(g[i], gate);
              add4(u[i], up);
            }
          }
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t index = first + i * stride;
      if (valid[i]) finish_item(a, index / quads, int(index % quads) * kVector, g[i], u[i]);
    }
  }
}

}  // namespace

void launch_activation(const ActivationArgs& args, cudaStream_t stream) {
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxActivationSplits, "activation stage: ", args.splits,
              " splits, at most ", kMaxActivationSplits);
  K3MOE_CHECK(args.intermediate % (32 * kVector) == 0, "activation stage: I = ", args.intermediate,
              " must be a multiple of ", 32 * kVector);
  const int64_t items = int64_t(args.max_rows) * (args.intermediate / kVector);
  if (items == 0) return;
  // Released early, one CTA per SM: every CTA is then resident (beside GEMM1's) and has released
  // GEMM2 while GEMM1 runs.
  const int64_t blocks = std::min<int64_t>((items + kItems * kThreads - 1) / (kItems * kThreads),
                                           int64_t(args.sm_count) * (args.release_early ? 1 : 8));
  launch_dependent(activation_kernel, dim3(unsigned(blocks)), kThreads, 0, stream, args);
}

cudaFuncAttributes activation_kernel_attributes() {
  cudaFuncAttributes attributes{};
  K3MOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, activation_kernel));
  return attributes;
}

}  // namespace k3moe::kernels
