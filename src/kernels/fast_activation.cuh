// The gated activations of activation.h in fp32 for the kernels' epilogues, built on the MUFU
// units (ex2.approx, rcp.approx) instead of libdevice's expf / tanhf / division, which cost about
// three times the instructions and take divergent slow paths. Accuracy (over a dense grid of inputs,
// tests/gpu/test_fast_activation.cu, against float64): error below 4e-6 of the value plus FLT_MIN
// (a normal result is within a thousandth of a bf16 rounding step); NaN and +-Inf inputs give what
// the float64 formula gives.
#pragma once

#include "k3moe/activation.h"

namespace k3moe::kernels {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));  // subnormal results kept
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_exp(float x) { return exp2_approx(x * 1.44269504088896341f); }
// 1 / (1 + e^-x), from e = e^-|x| (no overflow): x >= 0 gives 1 / (1 + e), x < 0 gives e / (1 + e),
// which keeps the tiny (even subnormal) values far out on the negative side.
__device__ __forceinline__ float fast_sigmoid(float x) {
  const float e = fast_exp(-fabsf(x));
  const float r = rcp_approx(1.0f + e);
  return x >= 0.0f ? r : e * r;
}

// tanh(x): 1 - 2 / (e^2|x| + 1) from |x| = 1/4 on (no cancellation there), below it the odd Taylor
// series to x^9 (truncation below 1e-8 relative); both computed, one selected (no divergence).
__device__ __forceinline__ float fast_tanh(float x) {
  const float a = fabsf(x), a2 = a * a;
  const float large = 1.0f - 2.0f * rcp_approx(fast_exp(2.0f * a) + 1.0f);
  const float poly = -1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315 + a2 * (62.0f / 2835)));
  const float small = fmaf(a * a2, poly, a);
  return copysignf(a < 0.25f ? small : large, x);
}

// The contract's formulas (activation.h) with the functions above; divisions by the constant betas
// become products with their reciprocals (within an ulp of the quotient).
__device__ __forceinline__ float fast_activation(Activation kind, const ActivationParams& p, float g, float u) {
  switch (kind) {
    case Activation::Situ:
      return p.situ_beta * fast_tanh(g * (1.0f / p.situ_beta)) * fast_sigmoid(g) *
             (p.situ_linear_beta * fast_tanh(u * (1.0f / p.situ_linear_beta)));
    case Activation::Swiglu:
      return g * fast_sigmoid(g) * u;
    case Activation::SwigluOai:
    default: {
      const float limit = p.swiglu_limit;
      g = g > limit ? limit : g;  // a NaN passes through, as in activation.h
      u = u < -limit ? -limit : (u > limit ? limit : u);
      return g * fast_sigmoid(p.swiglu_alpha * g) * (u + 1.0f);
    }
  }
}

}  // namespace k3moe::kernels
