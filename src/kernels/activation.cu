// One thread per (row, 32 consecutive outputs): one MX group.
#include "kernels/activation.cuh"

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kGroup = 32;
constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) activation_kernel(ActivationArgs a) {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int groups_per_row = a.intermediate / kGroup;
  const int64_t index = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = index / groups_per_row;
  if (row >= a.expert_offset[a.num_local]) return;
  const int j0 = int(index % groups_per_row) * kGroup;
  float v[kGroup];
  uint32_t amax_bits = 0;  // |v| as bits: orders like the values, and NaN above Inf
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    float gate = 0.0f, up = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const float* h = a.h + s * a.split_stride + row * 2 * a.intermediate;
      gate += h[j0 + j];
      up += h[a.intermediate + j0 + j];
    }
    v[j] = apply_activation<float>(a.activation, a.params, gate, up);
    amax_bits = max(amax_bits, float_bits(v[j]) & 0x7FFFFFFFu);
  }
  if (a.mode == Mode::Mxfp8) {
    const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      v[j] = e4m3_to_float(float_to_e4m3(scale_down_by_e8m0(v[j], s))) * e8m0_to_float(s);
  }
  uint4 packed[kGroup / 8];
  uint32_t* words = reinterpret_cast<uint32_t*>(packed);
#pragma unroll
  for (int j = 0; j < kGroup / 2; ++j)
    words[j] = uint32_t(float_to_bf16_bits(v[2 * j])) | (uint32_t(float_to_bf16_bits(v[2 * j + 1])) << 16);
  uint4* dst = reinterpret_cast<uint4*>(a.inter + row * a.intermediate + j0);
#pragma unroll
  for (int i = 0; i < kGroup / 8; ++i) dst[i] = packed[i];
}

}  // namespace

void launch_activation(const ActivationArgs& args, cudaStream_t stream) {
  const int64_t threads = int64_t(args.max_rows) * (args.intermediate / kGroup);
  if (threads == 0) return;
  launch_dependent(activation_kernel, dim3((threads + kThreads - 1) / kThreads), kThreads, 0, stream, args);
}

}  // namespace k3moe::kernels
