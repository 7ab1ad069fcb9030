// The benchmark's rotated input sets. A timed series cycles through them (its i-th call runs set
// (first + i) mod sets), and each set has its own routing: its own active experts, bytes, FLOPs and
// floor. A case is reported over its sets: the time is the mean of each set's median call and the
// floor the mean of the sets' floors, so that floor / time sets one mix of inputs against itself.
// (The median of the mixed series sits at whichever set is the middle one by time, while a floor
// from the mean routing is every set's.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "k3moe/error.h"

namespace k3moe::cli {

// The median of each set's calls in a series timed in order, `first` being the first call's set.
inline std::vector<double> median_per_set(std::span<const double> in_order, int first, int sets) {
  K3MOE_CHECK(sets > 0 && first >= 0, "median_per_set: sets must be > 0 and first >= 0, got ", sets, " and ", first);
  std::vector<std::vector<double>> by_set(static_cast<size_t>(sets));
  for (size_t i = 0; i < in_order.size(); ++i) by_set[(size_t(first) + i) % size_t(sets)].push_back(in_order[i]);
  std::vector<double> medians;
  for (std::vector<double>& calls : by_set) {
    K3MOE_CHECK(!calls.empty(), "median_per_set: ", in_order.size(), " timed calls leave one of ", sets,
                " input sets untimed");
    std::sort(calls.begin(), calls.end());
    const size_t n = calls.size();
    medians.push_back(n % 2 ? calls[n / 2] : 0.5 * (calls[n / 2 - 1] + calls[n / 2]));
  }
  return medians;
}

inline double mean_of(std::span<const double> values) {
  K3MOE_CHECK(!values.empty(), "mean_of: no values");
  return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

}  // namespace k3moe::cli
