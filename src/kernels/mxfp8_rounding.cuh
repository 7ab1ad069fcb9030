// One thread's share of an Mxfp8Rounding job (quantize_mxfp8.cuh). Quantizing: four threads per
// 32-value group, 8 values each (so that a few tokens still spread over many threads: decode's
// latency is the chain of one thread), the group's amax by two shuffles, the E4M3 codes by the
// hardware conversion (round to nearest even, saturating to +-448, NaN kept: formats.h's
// float_to_e4m3, checked by tests/gpu/test_mxfp8_rounding.cu). Dequantizing: one thread per group,
// 32 code bytes + 1 scale byte in, 64 bytes of widened values out, as 16-byte vectors.
#pragma once

#include <cstdint>

#include "k3moe/formats.h"
#include "kernels/quantize_mxfp8.cuh"
#include "kernels/sm90/ptx.cuh"

namespace k3moe::kernels {

inline constexpr int kMxGroup = 32;
inline constexpr int kMxPiece = 8;                        // values per quantizing thread
inline constexpr int kMxPieceLanes = kMxGroup / kMxPiece;  // threads per group

// Two E4M3 codes (the lower value in the low byte) times the group's scale, as one bf16x2 word.
__device__ __forceinline__ uint32_t dequantize_pair(uint16_t pair, float scale) {
  const float2 v = ptx::widen_e4m3x2(pair);
  return uint32_t(float_to_bf16_bits(v.x * scale)) | (uint32_t(float_to_bf16_bits(v.y * scale)) << 16);
}

// Values 8 p .. 8 p + 7 of x; every lane of the warp takes part (the shuffles), pieces past the
// end load and store nothing.
__device__ __forceinline__ void quantize_piece(const Mxfp8Rounding& job, int64_t piece) {
  const bool inside = piece < job.items;
  const uint4 in = inside ? reinterpret_cast<const uint4*>(job.x)[piece] : make_uint4(0, 0, 0, 0);
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&in);
  float values[kMxPiece];
  uint32_t amax_bits = 0;  // |x| as bits: NaN orders above Inf, so it decides the scale
#pragma unroll
  for (int i = 0; i < kMxPiece; ++i) {
    values[i] = bf16_bits_to_float(h[i]);
    amax_bits = max(amax_bits, magnitude_bits(values[i]));
  }
#pragma unroll
  for (int offset = 1; offset < kMxPieceLanes; offset *= 2)
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  if (!inside) return;
  const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
  const float scale = e8m0_to_float(s);
  uint16_t pairs[kMxPiece / 2];  // two E4M3 codes each, the lower value in the low byte
  uint32_t widened[kMxPiece / 2];
#pragma unroll
  for (int i = 0; i < kMxPiece / 2; ++i) {
    pairs[i] = ptx::cvt_e4m3x2(scale_down_by_e8m0(values[2 * i], s), scale_down_by_e8m0(values[2 * i + 1], s));
    widened[i] = dequantize_pair(pairs[i], scale);
  }
  reinterpret_cast<uint2*>(job.out.codes)[piece] = make_uint2(uint32_t(pairs[0]) | (uint32_t(pairs[1]) << 16),
                                                              uint32_t(pairs[2]) | (uint32_t(pairs[3]) << 16));
  if (piece % kMxPieceLanes == 0) job.out.scales[piece / kMxPieceLanes] = s;
  if (job.out.x_dequant)
    reinterpret_cast<uint4*>(job.out.x_dequant)[piece] = make_uint4(widened[0], widened[1], widened[2], widened[3]);
}

__device__ __forceinline__ void dequantize_group(const Mxfp8Rounding& job, int64_t group) {
  if (group >= job.items) return;
  uint8_t c[kMxGroup];
#pragma unroll
  for (int v = 0; v < 2; ++v)
    reinterpret_cast<uint4*>(c)[v] = reinterpret_cast<const uint4*>(job.in_codes + group * kMxGroup)[v];
  const float scale = e8m0_to_float(job.in_scales[group]);
  uint4 packed[4];
  uint32_t* words = reinterpret_cast<uint32_t*>(packed);
#pragma unroll
  for (int i = 0; i < kMxGroup / 2; ++i) words[i] = dequantize_pair(uint16_t(c[2 * i] | (c[2 * i + 1] << 8)), scale);
#pragma unroll
  for (int v = 0; v < 4; ++v) reinterpret_cast<uint4*>(job.out.x_dequant + group * kMxGroup)[v] = packed[v];
}

// Item `item` of the job; every lane of the warp calls it (past the end too).
__device__ __forceinline__ void run_mxfp8_rounding(const Mxfp8Rounding& job, int64_t item) {
  if (job.x) quantize_piece(job, item);
  else dequantize_group(job, item);
}

}  // namespace k3moe::kernels
