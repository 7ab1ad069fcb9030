// The number formats of k3moe, one definition each, shared by quantizers, kernels, the reference
// and the tests (host and device: every function is `constexpr` and `__host__ __device__`).
//
//   bf16   1-8-7, round-to-nearest-even from fp32; NaN stays a (quiet) NaN.
//   E2M1   1-2-1 (OCP MX FP4): codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign. No NaN/Inf.
//          Encode: RNE, saturating at +-6 (+-Inf too); NaN encodes as +0 (the quantizers never
//          encode NaN: a group holding a NaN gets the NaN scale instead).
//   E4M3   1-4-3 "fn" (OCP FP8): max 448, NaN = 0x7F / 0xFF, no infinities, subnormals 2^-9 steps.
//          Encode: RNE, saturating finite values AND infinities at +-448, NaN -> 0x7F. This is the
//          hardware's `cvt.rn.satfinite` rule (ml_dtypes instead maps overflow and Inf to NaN).
//   E8M0   unsigned exponent (OCP MX scale): 2^(s-127), s = 0..254; s = 255 is NaN.
//   UE4M3  the NVFP4 block scale: an E4M3 code with the sign bit clear. A code with the sign bit
//          set, and 0x7F, decode as NaN. Encode: RNE, saturating at 448, negative values and NaN
//          -> 0x7F (NaN): a scale is never negative.
//
// Packing: two E2M1 codes per byte, the LOW nibble holds the even element (k = 2j), the HIGH nibble
// the odd one (k = 2j + 1).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define K3MOE_HD __host__ __device__
#else
#define K3MOE_HD
#endif

namespace k3moe {

K3MOE_HD constexpr uint32_t float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
K3MOE_HD constexpr float bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }
K3MOE_HD constexpr bool is_nan(float f) { return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
K3MOE_HD constexpr bool is_finite(float f) { return (float_bits(f) & 0x7F800000u) != 0x7F800000u; }
K3MOE_HD constexpr float abs_f(float f) { return bits_float(float_bits(f) & 0x7FFFFFFFu); }
// |f| as bits: orders like |f|, NaN above Inf (so that a maximum over them keeps a NaN).
K3MOE_HD constexpr uint32_t magnitude_bits(float f) { return float_bits(f) & 0x7FFFFFFFu; }
K3MOE_HD constexpr uint32_t sign_bit(float f) { return float_bits(f) >> 31; }

// Round a float in [0, 2^22] to the nearest integer, ties to even, in the default FP rounding
// mode (adding 2^23 pushes the fraction out of the mantissa).
K3MOE_HD constexpr float rint_small(float a) { return (a + 8388608.0f) - 8388608.0f; }

// ---------------------------------------------------------------- bf16
K3MOE_HD constexpr uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if (is_nan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
K3MOE_HD constexpr float bf16_bits_to_float(uint16_t b) { return bits_float(uint32_t{b} << 16); }
K3MOE_HD constexpr float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// ---------------------------------------------------------------- E2M1
inline constexpr float kE2M1Max = 6.0f;

K3MOE_HD constexpr float e2m1_to_float(uint8_t code) {
  const uint32_t mag = code & 7u, e = mag >> 1, m = mag & 1u;
  const float v = e == 0 ? 0.5f * static_cast<float>(m)
                         : static_cast<float>(2u + m) * static_cast<float>(1u << e) * 0.25f;
  return (code & 8u) ? -v : v;
}

K3MOE_HD constexpr uint8_t float_to_e2m1(float x) {
  if (is_nan(x)) return 0;
  const float a = abs_f(x);
  // Even codes own their tie points (round half to even).
  uint8_t mag = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
              : a <= 2.5f  ? 4 : a < 3.5f  ? 5 : a <= 5.0f  ? 6 : 7;
  return static_cast<uint8_t>(mag | (sign_bit(x) << 3));
}

K3MOE_HD constexpr uint8_t pack_e2m1(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}
K3MOE_HD constexpr uint8_t e2m1_nibble(uint8_t packed, int k) {
  return static_cast<uint8_t>((k & 1) ? (packed >> 4) : (packed & 0xFu));
}

// ---------------------------------------------------------------- E4M3 (fn)
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;

K3MOE_HD constexpr float e4m3_to_float(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
  float v = 0.0f;
  if ((code & 0x7Fu) == 0x7Fu) {
    v = bits_float(0x7FC00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * (1.0f / 512.0f);
  } else {
    v = bits_float(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e - 7)
  }
  return (code & 0x80u) ? -v : v;
}

K3MOE_HD constexpr uint8_t float_to_e4m3(float x) {
  if (is_nan(x)) return kE4M3NaN;
  const uint8_t sign = static_cast<uint8_t>(sign_bit(x) << 7);
  const float a = abs_f(x);
  if (a >= kE4M3Max) return sign | 0x7Eu;
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (a result of 8 is the first normal)
    return sign | static_cast<uint8_t>(rint_small(a * 512.0f));
  }
  uint32_t u = float_bits(a);
  u += 0x7FFFFu + ((u >> 20) & 1u);  // RNE to 3 mantissa bits; a carry bumps the exponent
  uint32_t code = (u >> 20) - (120u << 3);
  if (code > 0x7Eu) code = 0x7Eu;
  return sign | static_cast<uint8_t>(code);
}

// ---------------------------------------------------------------- E8M0
inline constexpr uint8_t kE8M0NaN = 0xFF;

K3MOE_HD constexpr float e8m0_to_float(uint8_t s) {
  return s == 0 ? bits_float(0x00400000u)           // 2^-127 is an fp32 subnormal
       : s == 0xFF ? bits_float(0x7FC00000u)
       : bits_float(uint32_t{s} << 23);
}

// The MX scale rule of k3moe ("round up"): the smallest power of two 2^e with
// amax <= elem_max * 2^e, so that no element of the group saturates, clamped to E8M0's
// [2^-127, 2^127]. amax below fp32's smallest normal counts as that floor (the group is ~zero).
// A non-finite amax gives the NaN scale. elem_max is 6 (E2M1) or 448 (E4M3).
// Exactly: amax = A * 2^Ea, elem_max = M * 2^P (A, M in [1, 2)) => e = Ea - P + (A > M).
K3MOE_HD constexpr uint8_t mx_scale_round_up(float amax, float elem_max) {
  if (!is_finite(amax)) return kE8M0NaN;
  const uint32_t a = float_bits(abs_f(amax)), m = float_bits(elem_max);
  if (a < 0x00800000u) return 0;
  int e = static_cast<int>(a >> 23) - static_cast<int>(m >> 23);
  if ((a & 0x7FFFFFu) > (m & 0x7FFFFFu)) ++e;
  e = e < -127 ? -127 : e > 127 ? 127 : e;
  return static_cast<uint8_t>(e + 127);
}

// x / 2^(s-127) as one fp32 multiply by 2^(127-s) (itself an E8M0 value, byte 254 - s): exact
// unless the result leaves fp32's normal range. The NaN scale gives NaN.
K3MOE_HD constexpr float scale_down_by_e8m0(float x, uint8_t s) {
  return s == kE8M0NaN ? bits_float(0x7FC00000u) : x * e8m0_to_float(static_cast<uint8_t>(254 - s));
}

// ---------------------------------------------------------------- UE4M3 (NVFP4 block scale)
K3MOE_HD constexpr float ue4m3_to_float(uint8_t code) {
  return (code & 0x80u) ? bits_float(0x7FC00000u) : e4m3_to_float(code);
}
K3MOE_HD constexpr uint8_t float_to_ue4m3(float x) {
  if (is_nan(x) || sign_bit(x)) return (x == 0.0f) ? 0 : kE4M3NaN;
  return float_to_e4m3(x);
}

}  // namespace k3moe
