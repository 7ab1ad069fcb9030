// Progress reporting for anything that can take more than a second (loading, generating).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace k3moe {

// Called with a stage name, the units done so far and the total. May be empty.
using ProgressFn = std::function<void(std::string_view stage, int64_t done, int64_t total)>;

inline void report(const ProgressFn& progress, std::string_view stage, int64_t done, int64_t total) {
  if (progress) progress(stage, done, total);
}

}  // namespace k3moe
