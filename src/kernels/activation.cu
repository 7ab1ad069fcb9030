// One thread per (row, output j); a warp holds 32 consecutive outputs of a row, one MX group, so
// the group's amax is a warp reduction. The splits' partial sums are loaded together, then added
// in split order.
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
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) activation_kernel(ActivationArgs a) {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  // NOTE: a grid of a few waves strides over the rows in use (the grid is sized without knowing
  // how many of the T K slots are local). Whole warps leave together (I is a multiple of 32):
  // the shuffles below see all 32 lanes.
  const int64_t used = int64_t(a.expert_offset[a.num_local]) * a.intermediate;
  for (int64_t index = int64_t(blockIdx.x) * kThreads + threadIdx.x; index < used;
       index += int64_t(gridDim.x) * kThreads) {
  const int64_t row = index / a.intermediate;
  const int j = int(index % a.intermediate);
  float gate[kMaxActivationSplits], up[kMaxActivationSplits];
  const float* h = a.h + row * 2 * a.intermediate + j;
#pragma unroll
  for (int s = 0; s < kMaxActivationSplits; ++s)
    if (s < a.splits) {
      gate[s] = h[s * a.split_stride];
      up[s] = h[s * a.split_stride + a.intermediate];
    }
  float g = gate[0], u = up[0];
#pragma unroll
  for (int s = 1; s < kMaxActivationSplits; ++s)
    if (s < a.splits) {
      g += gate[s];
      u += up[s];
    }
  float v = fast_activation(a.activation, a.params, g, u);
  if (a.mode == Mode::Mxfp8) {
    uint32_t amax_bits = float_bits(v) & 0x7FFFFFFFu;  // |v| as bits: NaN orders above Inf
#pragma unroll
    for (int offset = 1; offset < kGroup; offset *= 2)
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
    const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
    v = round_to_mxfp8(v, s);
  }
  a.inter[row * a.intermediate + j] = float_to_bf16_bits(v);
  }
}

}  // namespace

void launch_activation(const ActivationArgs& args, cudaStream_t stream) {
  K3MOE_CHECK(args.splits >= 1 && args.splits <= kMaxActivationSplits, "activation stage: ", args.splits,
              " splits, at most ", kMaxActivationSplits);
  const int64_t threads = int64_t(args.max_rows) * args.intermediate;
  if (threads == 0) return;
  const int64_t blocks = std::min<int64_t>((threads + kThreads - 1) / kThreads, int64_t(args.sm_count) * 8);
  launch_dependent(activation_kernel, dim3(unsigned(blocks)), kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
