// One thread per 32-value group: 64 bytes of bf16 in, 32 code bytes + 1 scale byte (+ 64 bytes
// of widened values) out, all as 16-byte vectors.
#include "kernels/quantize_mxfp8.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kGroup = 32;
constexpr int kThreads = 256;

__device__ __forceinline__ void store_dequantized(const uint8_t (&codes)[kGroup], uint8_t s, uint16_t* out) {
  uint4 packed[4];
  uint32_t* words = reinterpret_cast<uint32_t*>(packed);
  const float scale = e8m0_to_float(s);
#pragma unroll
  for (int i = 0; i < kGroup / 2; ++i)
    words[i] = uint32_t(float_to_bf16_bits(e4m3_to_float(codes[2 * i]) * scale)) |
               (uint32_t(float_to_bf16_bits(e4m3_to_float(codes[2 * i + 1]) * scale)) << 16);
#pragma unroll
  for (int v = 0; v < 4; ++v) reinterpret_cast<uint4*>(out)[v] = packed[v];
}

__device__ __forceinline__ void quantize_group(const uint16_t* x, int64_t group, const Mxfp8Buffers& out) {
  uint4 in[4];
#pragma unroll
  for (int v = 0; v < 4; ++v) in[v] = reinterpret_cast<const uint4*>(x + group * kGroup)[v];
  const uint16_t* h = reinterpret_cast<const uint16_t*>(in);
  float values[kGroup];
  uint32_t amax_bits = 0;  // |x| as bits: NaN orders above Inf, so it decides the scale
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    values[i] = bf16_bits_to_float(h[i]);
    amax_bits = max(amax_bits, float_bits(values[i]) & 0x7FFFFFFFu);
  }
  const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
  uint8_t codes[kGroup];
#pragma unroll
  for (int i = 0; i < kGroup; ++i) codes[i] = float_to_e4m3(scale_down_by_e8m0(values[i], s));
#pragma unroll
  for (int v = 0; v < 2; ++v)
    reinterpret_cast<uint4*>(out.codes + group * kGroup)[v] = reinterpret_cast<const uint4*>(codes)[v];
  out.scales[group] = s;
  if (out.x_dequant) store_dequantized(codes, s, out.x_dequant + group * kGroup);
}

// kWaitAtEnd: see launch_quantize_mxfp8's `overlap_previous`.
template <bool kWaitAtEnd>
__global__ void __launch_bounds__(kThreads)
    quantize_mxfp8_kernel(const uint16_t* x, int64_t groups, Mxfp8Buffers out) {
  if (!kWaitAtEnd) ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int64_t group = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (group < groups) quantize_group(x, group, out);
  if (kWaitAtEnd) ptx::griddepcontrol_wait();
}

template <bool kWaitAtEnd>
__global__ void __launch_bounds__(kThreads)
    dequantize_mxfp8_kernel(const uint8_t* codes, const uint8_t* scales, int64_t groups, uint16_t* x_dequant) {
  if (!kWaitAtEnd) ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int64_t group = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (group < groups) {
    uint8_t c[kGroup];
#pragma unroll
    for (int v = 0; v < 2; ++v)
      reinterpret_cast<uint4*>(c)[v] = reinterpret_cast<const uint4*>(codes + group * kGroup)[v];
    store_dequantized(c, scales[group], x_dequant + group * kGroup);
  }
  if (kWaitAtEnd) ptx::griddepcontrol_wait();
}

int64_t blocks_for(int64_t groups) { return (groups + kThreads - 1) / kThreads; }

}  // namespace

void launch_quantize_mxfp8(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out, cudaStream_t stream,
                           bool overlap_previous) {
  const int64_t groups = int64_t(tokens) * hidden / kGroup;
  if (groups == 0) return;
  launch_dependent(overlap_previous ? quantize_mxfp8_kernel<true> : quantize_mxfp8_kernel<false>,
                   dim3(blocks_for(groups)), kThreads, 0, stream, x, groups, out);
}

void launch_dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden,
                             uint16_t* x_dequant, cudaStream_t stream, bool overlap_previous) {
  const int64_t groups = int64_t(tokens) * hidden / kGroup;
  if (groups == 0) return;
  launch_dependent(overlap_previous ? dequantize_mxfp8_kernel<true> : dequantize_mxfp8_kernel<false>,
                   dim3(blocks_for(groups)), kThreads, 0, stream, codes, scales, groups, x_dequant);
}

}  // namespace k3moe::kernels
