// One thread per 4 consecutive outputs of a row; 8 threads hold 32 outputs, one MX group, so the
// group's amax is a reduction over 8 lanes. The splits' partial sums are loaded a few splits at a
// time and added in split order.
#include "kernels/activation.cuh"

#include <algorithm>

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/fast_activation.cuh"
#include "kernels/launch.cuh"
#include "kernels/mxfp4_fragments.cuh"
#include "kernels/sm90/ptx.cuh"
#include "kernels/stage_marks.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kGroup = 32;
constexpr int kVector = 4;                     // outputs per thread
constexpr int kGroupLanes = kGroup / kVector;  // threads per MX group
constexpr int kThreads = 256;
static_assert(kGroupLanes * kVector * sizeof(float) == 128, "a group of lanes reads one 128-byte line per split and half");

// Which kernel runs `splits` (kLoadBatch below): the 2-split one, or the 4-split one.
constexpr bool two_split_kernel(int splits) { return splits <= 2; }

__device__ __forceinline__ void add4(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// NOTE: the partial sums are read once: their lines can leave L2 without a write-back to HBM, which
// would otherwise share HBM with a weight stream (GEMM2's, or the next forward's). A second pass over
// the thread's items: each group of 8 lanes read one line per split and half (its lane b drops lines
// b, b + 8, ...: line l is split l / 2, gate or up), and the warp's lanes have consumed their loads.
__device__ __forceinline__ void discard_partial_sums(const ActivationArgs& a, uint32_t used, uint32_t quads) {
  __syncwarp();
  const int b = threadIdx.x % kGroupLanes;
  for (uint32_t index = blockIdx.x * kThreads + threadIdx.x; index < used; index += gridDim.x * kThreads) {
    const float* lines = a.h + int64_t(index / quads) * 2 * a.intermediate + int64_t(index % quads - b) * kVector;
    for (int line = b; line < 2 * a.splits; line += kGroupLanes)
      ptx::discard_l2_line(lines + (line / 2) * a.split_stride + (line % 2) * a.intermediate);
  }
}

// The gate and up halves of one item (4 outputs of a row): its splits' partial sums added in split
// order, kLoadBatch splits loaded together (2 kLoadBatch float4 in flight per thread).
template <int kLoadBatch>
__device__ __forceinline__ void sum_splits(const ActivationArgs& a, const float* h, float4& g, float4& u) {
  for (int s0 = 0; s0 < a.splits; s0 += kLoadBatch) {
    float4 gate[kLoadBatch], up[kLoadBatch];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b)
      if (s0 + b < a.splits) {
        gate[b] = *reinterpret_cast<const float4*>(h + (s0 + b) * a.split_stride);
        up[b] = *reinterpret_cast<const float4*>(h + (s0 + b) * a.split_stride + a.intermediate);
      }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b)
      if (s0 + b < a.splits) {
        if (s0 + b == 0) {
          g = gate[0];
          u = up[0];
        } else {
          add4(g, gate[b]);
          add4(u, up[b]);
        }
      }
  }
}

// The same for at most 2 splits, in straight-line code: the kernels take 40 and 44 registers, where
// the loop took 48 and 62.
template <>
__device__ __forceinline__ void sum_splits<2>(const ActivationArgs& a, const float* h, float4& g, float4& u) {
  g = *reinterpret_cast<const float4*>(h);
  u = *reinterpret_cast<const float4*>(h + a.intermediate);
  if (a.splits == 2) {
    add4(g, *reinterpret_cast<const float4*>(h + a.split_stride));
    add4(u, *reinterpret_cast<const float4*>(h + a.split_stride + a.intermediate));
  }
}

// NOTE: the stage is its CTAs' waves of one round of loads each (bench/NOTES.md, Session 22 Step 6),
// so registers set its time: the 4-split kernels hold 69-71 (3 CTAs of 256 per SM), the 2-split one
// (local28 T = 8-32) 40 beside GEMM1, 2 CTAs per SM. Capped at 32, three fit beside GEMM1's three
// 8-token CTAs (one round of loads at local28 T = 8), but ran 0.2-0.4 % slower there, and two of
// them 0.6-0.8 us longer than at 40 (H100s, bench/NOTES.md, Session 65).
// kDiscard: the partial sums' lines are dropped from L2 after use (H100 local28 T = 32 -4 %, the
// H200 unmoved: bench/NOTES.md, Session 50). The kernels beside GEMM1 do without: there they ran
// 0.3-0.8 % slower (local28 T = 8, ep32 T = 8 and 64; H100, Session 65).
template <int kLoadBatch, bool kDiscard>
__global__ void __launch_bounds__(kThreads, kLoadBatch == 2 ? (kDiscard ? 4 : 5) : 3) activation_kernel(ActivationArgs a) {
  // NOTE: released early, GEMM2 launches while GEMM1 still runs: its CTAs take the SMs that GEMM1's
  // tail frees and stream their first weights there. They read this stage's output only after
  // their own wait, which covers this stage's end (and so GEMM1's).
  mark_start(a.times);
  if (a.release_early) ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  if (!a.release_early) ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  // NOTE: a grid of a few waves strides over the rows in use (the grid is sized without knowing
  // how many of the T K slots are local). Whole warps leave together (I / 4 is a multiple of 32):
  // the shuffles below see all 32 lanes.
  // NOTE: 32-bit indices (launch_activation checks max_rows x I / 4 < 2^31): 64-bit division
  // is a library call with registers of its own.
  const uint32_t quads = uint32_t(a.intermediate / kVector);
  const uint32_t used = uint32_t(a.expert_offset[a.num_local]) * quads;
  for (uint32_t index = blockIdx.x * kThreads + threadIdx.x; index < used; index += gridDim.x * kThreads) {
    const uint32_t row = index / quads, j = (index - row * quads) * kVector;
    float4 g, u;
    sum_splits<kLoadBatch>(a, a.h + (int64_t(row) * 2 * a.intermediate + j), g, u);
    float v[kVector] = {fast_activation(a.activation, a.params, g.x, u.x),
                        fast_activation(a.activation, a.params, g.y, u.y),
                        fast_activation(a.activation, a.params, g.z, u.z),
                        fast_activation(a.activation, a.params, g.w, u.w)};
    if (a.mode == Mode::Mxfp8) round_group_to_mxfp8<kVector, kGroupLanes>(v);
    const uint2 packed{uint32_t(float_to_bf16_bits(v[0])) | (uint32_t(float_to_bf16_bits(v[1])) << 16),
                       uint32_t(float_to_bf16_bits(v[2])) | (uint32_t(float_to_bf16_bits(v[3])) << 16)};
    *reinterpret_cast<uint2*>(a.inter + int64_t(row) * a.intermediate + j) = packed;
  }
  if constexpr (kDiscard) discard_partial_sums(a, used, quads);
  if (threadIdx.x == 0) mark_end(a.times);
}

}  // namespace

void check_activation_rows(int64_t max_rows, int intermediate, int sm_count) {
  const int64_t items = max_rows * (intermediate / kVector);
  const int64_t max_items = (int64_t(1) << 31) - int64_t(sm_count) * 8 * kThreads;
  K3MOE_CHECK(items < max_items, "activation stage: ", max_rows, " rows x I / 4 = ", items,
              " items, its 32-bit indices hold fewer than ", max_items, " (fewer tokens per forward, or K whole)");
}

void launch_activation(const ActivationArgs& args, cudaStream_t stream) {
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxActivationSplits, "activation stage: ", args.splits,
              " splits, at most ", kMaxActivationSplits);
  K3MOE_CHECK(args.intermediate % (32 * kVector) == 0, "activation stage: I = ", args.intermediate,
              " must be a multiple of ", 32 * kVector);
  const int64_t threads = int64_t(args.max_rows) * (args.intermediate / kVector);
  if (threads == 0) return;
  check_activation_rows(args.max_rows, args.intermediate, args.sm_count);
  // Released early, as many CTAs per SM as fit beside GEMM1's: every CTA is then resident and has
  // released GEMM2 while GEMM1 runs.
  const int per_sm = args.release_early ? activation_ctas_beside_gemm1(args.splits) : 8;
  const int64_t blocks = std::min<int64_t>((threads + kThreads - 1) / kThreads, int64_t(args.sm_count) * per_sm);
  // Beside GEMM1 without the discards (registers); elsewhere with them.
  const auto kernel = two_split_kernel(args.splits) ? (args.release_early ? activation_kernel<2, false> : activation_kernel<2, true>)
                      : args.release_early ? activation_kernel<4, false> : activation_kernel<4, true>;
  launch_dependent(kernel, dim3(unsigned(blocks)), kThreads, 0, stream, args);
}

int activation_ctas_beside_gemm1(int splits) { return two_split_kernel(splits) ? 2 : 1; }

cudaFuncAttributes activation_kernel_attributes(int splits) {
  cudaFuncAttributes attributes{};
  if (two_split_kernel(splits)) K3MOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, activation_kernel<2, false>));
  else K3MOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, activation_kernel<4, false>));
  return attributes;
}

}  // namespace k3moe::kernels
