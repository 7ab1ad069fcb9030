// Quantization: four threads per 32-value group, 8 values each (so that a few tokens still spread
// over many threads: decode's latency is the chain of one thread), the group's amax by two
// shuffles, the E4M3 codes by the hardware conversion (round to nearest even, saturating to
// +-448, NaN kept: formats.h's float_to_e4m3, checked by tests/gpu/test_mxfp8_rounding.cu).
// Dequantization of pre-quantized input: one thread per group, 32 code bytes + 1 scale byte in,
// 64 bytes of widened values out, as 16-byte vectors.
#include "kernels/quantize_mxfp8.cuh"

#include "k3moe/formats.h"
#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kGroup = 32;
constexpr int kPiece = 8;                       // values per quantizing thread
constexpr int kPieceLanes = kGroup / kPiece;    // threads per group
constexpr int kThreads = 256;

// Two E4M3 codes (the lower value in the low byte) times the group's scale, as one bf16x2 word.
__device__ __forceinline__ uint32_t dequantize_pair(uint16_t pair, float scale) {
  const float2 v = ptx::widen_e4m3x2(pair);
  return uint32_t(float_to_bf16_bits(v.x * scale)) | (uint32_t(float_to_bf16_bits(v.y * scale)) << 16);
}

__device__ __forceinline__ void store_dequantized(const uint8_t (&codes)[kGroup], uint8_t s, uint16_t* out) {
  uint4 packed[4];
  uint32_t* words = reinterpret_cast<uint32_t*>(packed);
  const float scale = e8m0_to_float(s);
#pragma unroll
  for (int i = 0; i < kGroup / 2; ++i)
    words[i] = dequantize_pair(uint16_t(codes[2 * i] | (codes[2 * i + 1] << 8)), scale);
#pragma unroll
  for (int v = 0; v < 4; ++v) reinterpret_cast<uint4*>(out)[v] = packed[v];
}

// Values 8 p .. 8 p + 7 of x; every lane of the warp takes part (the shuffles), pieces past the
// end load and store nothing.
__device__ __forceinline__ void quantize_piece(const uint16_t* x, int64_t piece, int64_t pieces,
                                               const Mxfp8Buffers& out) {
  const bool inside = piece < pieces;
  const uint4 in = inside ? reinterpret_cast<const uint4*>(x)[piece] : make_uint4(0, 0, 0, 0);
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&in);
  float values[kPiece];
  uint32_t amax_bits = 0;  // |x| as bits: NaN orders above Inf, so it decides the scale
#pragma unroll
  for (int i = 0; i < kPiece; ++i) {
    values[i] = bf16_bits_to_float(h[i]);
    amax_bits = max(amax_bits, float_bits(values[i]) & 0x7FFFFFFFu);
  }
#pragma unroll
  for (int offset = 1; offset < kPieceLanes; offset *= 2)
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  if (!inside) return;
  const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
  const float scale = e8m0_to_float(s);
  uint16_t pairs[kPiece / 2];  // two E4M3 codes each, the lower value in the low byte
  uint32_t widened[kPiece / 2];
#pragma unroll
  for (int i = 0; i < kPiece / 2; ++i) {
    pairs[i] = ptx::cvt_e4m3x2(scale_down_by_e8m0(values[2 * i], s), scale_down_by_e8m0(values[2 * i + 1], s));
    widened[i] = dequantize_pair(pairs[i], scale);
  }
  reinterpret_cast<uint2*>(out.codes)[piece] = make_uint2(uint32_t(pairs[0]) | (uint32_t(pairs[1]) << 16),
                                                          uint32_t(pairs[2]) | (uint32_t(pairs[3]) << 16));
  if (piece % kPieceLanes == 0) out.scales[piece / kPieceLanes] = s;
  if (out.x_dequant)
    reinterpret_cast<uint4*>(out.x_dequant)[piece] = make_uint4(widened[0], widened[1], widened[2], widened[3]);
}

// kWaitAtEnd: see launch_quantize_mxfp8's `overlap_previous`.
template <bool kWaitAtEnd>
__global__ void __launch_bounds__(kThreads)
    quantize_mxfp8_kernel(const uint16_t* x, int64_t pieces, Mxfp8Buffers out) {
  if (!kWaitAtEnd) ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  quantize_piece(x, int64_t(blockIdx.x) * kThreads + threadIdx.x, pieces, out);
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
  const int64_t pieces = int64_t(tokens) * hidden / kPiece;
  if (pieces == 0) return;
  launch_dependent(overlap_previous ? quantize_mxfp8_kernel<true> : quantize_mxfp8_kernel<false>,
                   dim3(blocks_for(pieces)), kThreads, 0, stream, x, pieces, out);
}

void launch_dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden,
                             uint16_t* x_dequant, cudaStream_t stream, bool overlap_previous) {
  const int64_t groups = int64_t(tokens) * hidden / kGroup;
  if (groups == 0) return;
  launch_dependent(overlap_previous ? dequantize_mxfp8_kernel<true> : dequantize_mxfp8_kernel<false>,
                   dim3(blocks_for(groups)), kThreads, 0, stream, codes, scales, groups, x_dequant);
}

}  // namespace k3moe::kernels
