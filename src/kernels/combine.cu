// One CTA per (token, 512 outputs); each thread owns 4 consecutive outputs (16-byte loads of y).
#include "kernels/combine.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/routing.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads, 4) combine_kernel(CombineArgs a) {
  __shared__ int32_t rows[kRoutingMaxTopK];
  __shared__ float weights[kRoutingMaxTopK];
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int token = blockIdx.x;
  if (threadIdx.x < a.top_k) {
    rows[threadIdx.x] = a.slot_row[int64_t(token) * a.top_k + threadIdx.x];
    weights[threadIdx.x] = a.weights[int64_t(token) * a.top_k + threadIdx.x];
  }
  __syncthreads();
  const int h = (blockIdx.y * kThreads + threadIdx.x) * 4;
  if (h < a.hidden) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < a.top_k; ++k) {
      const int32_t row = rows[k];
      if (row < 0) continue;
      const float w = weights[k];
      float4 v = *reinterpret_cast<const float4*>(a.y + int64_t(row) * a.hidden + h);
      for (int s = 1; s < a.splits; ++s) {
        const float4 p = *reinterpret_cast<const float4*>(a.y + s * a.split_stride + int64_t(row) * a.hidden + h);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
      }
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
    const uint2 packed{uint32_t(float_to_bf16_bits(acc.x)) | (uint32_t(float_to_bf16_bits(acc.y)) << 16),
                       uint32_t(float_to_bf16_bits(acc.z)) | (uint32_t(float_to_bf16_bits(acc.w)) << 16)};
    *reinterpret_cast<uint2*>(a.out + int64_t(token) * a.hidden + h) = packed;
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  const dim3 grid(args.tokens, (args.hidden + kThreads * 4 - 1) / (kThreads * 4));
  launch_dependent(combine_kernel, grid, kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
