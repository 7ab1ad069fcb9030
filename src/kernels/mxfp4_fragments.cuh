// What both expert-GEMM kernels (mma.sync and wgmma) do with one lane's MXFP4 weight fragments:
// the widening to bf16 A-fragment registers (bit placement: expert_layout.cuh) with the E8M0 scale
// folded in, and the epilogues' rounding of an output to MXFP8.
#pragma once

#include <cstdint>

#include "k3moe/formats.h"
#include "kernels/expert_layout.cuh"
#include "kernels/sm90/ptx.cuh"

namespace k3moe::kernels {

enum class Epilogue { Activation, GateUpRows, Rows };

// The scale word's multipliers and the widening are the layout's (expert_layout.cuh).
using layout::BlockMultipliers;
using layout::scale_multipliers;

// pairs[p] * the multiplier of its row in k-group kGroup: row g for pairs 0, 2, row g + 8 for 1, 3.
template <int kGroup>
__device__ __forceinline__ void scale_pairs(uint32_t (&pairs)[4], const BlockMultipliers& m) {
  pairs[0] = ptx::mul_bf16x2_by_half<kGroup>(pairs[0], m.row_g);
  pairs[1] = ptx::mul_bf16x2_by_half<kGroup>(pairs[1], m.row_g8);
  pairs[2] = ptx::mul_bf16x2_by_half<kGroup>(pairs[2], m.row_g);
  pairs[3] = ptx::mul_bf16x2_by_half<kGroup>(pairs[3], m.row_g8);
}

// One lane's fragments of weight block `block` (16 rows x 64 k) in a pipeline stage: its code
// word per 16-k step (fragment order, expert_layout.cuh) and its multipliers.
__device__ __forceinline__ void load_block_fragments(const uint8_t* s_codes, const uint8_t* s_scales, int block,
                                                     int lane, uint4& code, BlockMultipliers& mult) {
  code = ptx::ld_shared_v4(s_codes + block * layout::kBlockCodeBytes + lane * 16);
  mult = scale_multipliers(ptx::ld_shared_u32(s_scales + block * layout::kBlockScaleBytes + (lane / 4) * 4));
}

// The A registers of 16-k step kk (0..3) of such a block: widened, scaled (k-group kk / 2).
__device__ __forceinline__ void widen_step(const uint4& code, const BlockMultipliers& mult, int kk,
                                           uint32_t (&afrag)[4]) {
  const uint32_t word = kk == 0 ? code.x : kk == 1 ? code.y : kk == 2 ? code.z : code.w;
  layout::widen_codes(word, afrag);
  if (kk < 2) scale_pairs<0>(afrag, mult);
  else scale_pairs<1>(afrag, mult);
}

// Values rounded to the MXFP8 values of their group (E8M0 scale s), held exactly by floats: the
// hardware conversion to E4M3 (round to nearest even, saturating to +-448, NaN kept) gives the
// codes of formats.h's float_to_e4m3 (tests/gpu/test_mxfp8_rounding.cu checks every case class),
// and E4M3 widens exactly through f16.
// The two powers of two are computed once per scale; values of one group round two at a time.
struct Mxfp8Scale {
  float down, up;  // 2^(127 - s) (NaN for the NaN scale: scale_down_by_e8m0), 2^(s - 127)
  __device__ __forceinline__ explicit Mxfp8Scale(uint8_t s)
      : down(s == kE8M0NaN ? bits_float(0x7FC00000u) : e8m0_to_float(static_cast<uint8_t>(254 - s))),
        up(e8m0_to_float(s)) {}
  __device__ __forceinline__ void round2(float& a, float& b) const {
    const float2 w = ptx::widen_e4m3x2(ptx::cvt_e4m3x2(a * down, b * down));
    a = w.x * up;
    b = w.y * up;
  }
};

// This lane's kValues values rounded to MXFP8 in place, their group of 32 spread over kLanes
// adjacent lanes (kLanes x kValues = 32, lanes aligned to kLanes): the group's amax by shuffles,
// so every lane of the warp takes part.
template <int kValues, int kLanes>
__device__ __forceinline__ void round_group_to_mxfp8(float (&v)[kValues]) {
  static_assert(kValues * kLanes == 32 && kValues % 2 == 0, "an MX group of 32, rounded in pairs");
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kValues; ++i) bits = max(bits, magnitude_bits(v[i]));
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) bits = max(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
  const Mxfp8Scale scale(mx_scale_round_up(bits_float(bits), kE4M3Max));
#pragma unroll
  for (int i = 0; i < kValues; i += 2) scale.round2(v[i], v[i + 1]);
}

}  // namespace k3moe::kernels
