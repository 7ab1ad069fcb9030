// The gated activations, one definition for the float64 reference (Real = double) and the
// kernels (Real = float). The formulas are the contract's; see config.h for the list.
#pragma once

#include <cmath>

#include "k3moe/config.h"
#include "k3moe/formats.h"

namespace k3moe {

// Overloads chosen by type, so that float stays float on the device (expf / tanhf).
K3MOE_HD inline float exp_of(float x) { return expf(x); }
K3MOE_HD inline double exp_of(double x) { return exp(x); }
K3MOE_HD inline float tanh_of(float x) { return tanhf(x); }
K3MOE_HD inline double tanh_of(double x) { return tanh(x); }

template <class Real>
K3MOE_HD inline Real sigmoid(Real x) {
  return Real(1) / (Real(1) + exp_of(-x));
}

template <class Real>
K3MOE_HD inline Real situ(Real g, Real u, Real beta, Real beta_lin) {
  return beta * tanh_of(g / beta) * sigmoid(g) * (beta_lin * tanh_of(u / beta_lin));
}

template <class Real>
K3MOE_HD inline Real swiglu(Real g, Real u) {
  return g * sigmoid(g) * u;
}

template <class Real>
K3MOE_HD inline Real swiglu_oai(Real g, Real u, Real alpha, Real limit) {
  g = g > limit ? limit : g;  // written so that a NaN passes through (fmin would drop it)
  u = u < -limit ? -limit : (u > limit ? limit : u);
  return g * sigmoid(alpha * g) * (u + Real(1));
}

template <class Real>
K3MOE_HD inline Real apply_activation(Activation kind, const ActivationParams& p, Real g, Real u) {
  switch (kind) {
    case Activation::Situ:
      return situ<Real>(g, u, Real(p.situ_beta), Real(p.situ_linear_beta));
    case Activation::Swiglu:
      return swiglu<Real>(g, u);
    case Activation::SwigluOai:
    default:
      return swiglu_oai<Real>(g, u, Real(p.swiglu_alpha), Real(p.swiglu_limit));
  }
}

}  // namespace k3moe
