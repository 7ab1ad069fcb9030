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

// The four bf16x2 A registers of one 16-k step, widened from the step's code word (bit placement:
// expert_layout.cuh), each value * 2^-126.
__device__ __forceinline__ void widen_codes(uint32_t w, uint32_t (&pairs)[4]) {
  constexpr uint32_t kMask = layout::kWidenMask;
  pairs[0] = w & kMask;
  pairs[1] = (w << 6) & kMask;
  pairs[2] = __funnelshift_l(w, w, 28) & kMask;
  pairs[3] = ((w << 2) & layout::kWidenMaskShl2) | ((w >> 6) & layout::kWidenMaskShr6);
}

// bf16x2 {2^(s0-1), 2^(s1-1)} from bytes 2 `group` and 2 `group` + 1 (= s + 126) of a scale word,
// the multipliers of rows g and g + 8 of one k-group: the two bytes moved onto the two halves'
// exponent fields. The NaN scale's byte 255 gives +Inf, and its group's codes are zero (upload),
// so every weight of the group is 0 * Inf = NaN.
__device__ __forceinline__ uint32_t scale_multipliers(uint32_t scale_word, int group) {
  return __byte_perm(scale_word, 0u, group == 0 ? 0x4140u : 0x4342u) << 7;
}

// pairs[p] * the multiplier of its row: the low half for rows g (pairs 0, 2), the high for g + 8.
__device__ __forceinline__ void scale_pairs(uint32_t (&pairs)[4], uint32_t multipliers) {
  const uint32_t lo = __byte_perm(multipliers, 0u, 0x1010u), hi = __byte_perm(multipliers, 0u, 0x3232u);
  pairs[0] = ptx::mul_bf16x2(pairs[0], lo);
  pairs[1] = ptx::mul_bf16x2(pairs[1], hi);
  pairs[2] = ptx::mul_bf16x2(pairs[2], lo);
  pairs[3] = ptx::mul_bf16x2(pairs[3], hi);
}

// One lane's fragments of weight block `block` (16 rows x 64 k) in a pipeline stage: its code
// word per 16-k step (fragment order, expert_layout.cuh) and the bf16 multipliers of its two
// k-groups (scale_multipliers).
__device__ __forceinline__ void load_block_fragments(const uint8_t* s_codes, const uint8_t* s_scales, int block,
                                                     int lane, uint4& code, uint32_t (&mult)[2]) {
  code = ptx::ld_shared_v4(s_codes + block * layout::kBlockCodeBytes + lane * 16);
  const uint32_t sw = ptx::ld_shared_u32(s_scales + block * layout::kBlockScaleBytes + (lane / 4) * 4);
  mult[0] = scale_multipliers(sw, 0);
  mult[1] = scale_multipliers(sw, 1);
}

// The A registers of 16-k step kk (0..3) of such a block: widened, scaled.
__device__ __forceinline__ void widen_step(const uint4& code, const uint32_t (&mult)[2], int kk, uint32_t (&afrag)[4]) {
  const uint32_t word = kk == 0 ? code.x : kk == 1 ? code.y : kk == 2 ? code.z : code.w;
  widen_codes(word, afrag);
  scale_pairs(afrag, mult[kk / 2]);
}

// v rounded to the MXFP8 value of its group (E8M0 scale s), held exactly by a float: the
// hardware conversion to E4M3 (round to nearest even, saturating to +-448, NaN kept) gives the
// codes of formats.h's float_to_e4m3 (tests/gpu/test_mxfp8_rounding.cu checks every case class),
// and E4M3 widens exactly through f16.
__device__ __forceinline__ float round_to_mxfp8(float v, uint8_t s) {
  const float scaled = scale_down_by_e8m0(v, s);
  uint16_t code;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(code) : "f"(0.0f), "f"(scaled));
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(code));
  float widened;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(widened) : "h"(uint16_t(halves & 0xFFFFu)));
  return widened * e8m0_to_float(s);
}

}  // namespace k3moe::kernels
