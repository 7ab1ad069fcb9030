// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none); with
// K3MOE_REQUIRE_GPU=1 in the environment (scripts/gpu-check.sh on the GPU machine) they fail
// instead, so that a driver or device problem there cannot pass as skips. Host <-> device copies
// of whole vectors for the kernel-level tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "k3moe/plan.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

#define K3MOE_REQUIRE_GPU()                                                                              \
  do {                                                                                                   \
    std::string why_;                                                                                    \
    if (!k3moe::hopper_gpu_available(&why_)) {                                                           \
      if (k3moe::testing::gpu_required()) FAIL() << "needs a Hopper GPU (K3MOE_REQUIRE_GPU=1): " << why_; \
      GTEST_SKIP() << "needs a Hopper GPU: " << why_;                                                    \
    }                                                                                                    \
  } while (0)

namespace k3moe::testing {

inline bool gpu_required() {
  const char* value = std::getenv("K3MOE_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(int64_t(host.size() * sizeof(T)));
  K3MOE_CUDA_CHECK(cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the last DMA lands after cudaMemcpy returns
  return buffer;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& buffer) {
  std::vector<T> host(size_t(buffer.bytes()) / sizeof(T));
  K3MOE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace k3moe::testing
