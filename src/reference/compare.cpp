// Error metrics between a result and its reference (see reference.h).
#include <cmath>

#include "k3moe/error.h"
#include "k3moe/reference.h"

namespace k3moe {

// rel_l2 = ||a - b|| / ||b|| and cosine = <a, b> / (||a|| ||b||) over the elements finite in both.
// Degenerate norms: both vectors zero -> rel 0, cosine 1; ||b|| = 0 < ||a - b|| -> rel +Inf; one
// of ||a||, ||b|| zero and not the other -> cosine 0. An element counts as a non-finite mismatch
// when it is finite in one vector and not in the other, or non-finite in both but different
// (NaN vs +-Inf, +Inf vs -Inf).
Comparison compare(std::span<const double> actual, std::span<const double> expected) {
  K3MOE_CHECK(actual.size() == expected.size(), "compare: actual holds ", actual.size(),
              " values, expected holds ", expected.size());
  double diff2 = 0.0, a2 = 0.0, b2 = 0.0, ab = 0.0;
  Comparison c;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], b = expected[i];
    const bool fa = std::isfinite(a), fb = std::isfinite(b);
    if (fa && fb) {
      diff2 += (a - b) * (a - b);
      a2 += a * a;
      b2 += b * b;
      ab += a * b;
    } else if (fa != fb) {
      ++c.nonfinite_mismatch;
    } else if (!(std::isnan(a) && std::isnan(b)) && a != b) {
      ++c.nonfinite_mismatch;  // NaN vs Inf, or opposite infinities
    }
  }
  if (b2 > 0.0) {
    c.rel_l2 = std::sqrt(diff2 / b2);
  } else {
    c.rel_l2 = diff2 > 0.0 ? HUGE_VAL : 0.0;
  }
  if (a2 > 0.0 && b2 > 0.0) {
    c.cosine = ab / (std::sqrt(a2) * std::sqrt(b2));
  } else {
    c.cosine = (a2 == 0.0 && b2 == 0.0) ? 1.0 : 0.0;
  }
  return c;
}

}  // namespace k3moe
