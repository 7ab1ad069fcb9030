// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none). Host <-> device
// copies of whole vectors for the kernel-level tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "k3moe/plan.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

#define K3MOE_REQUIRE_GPU()                                             \
  do {                                                                  \
    std::string why_;                                                   \
    if (!k3moe::hopper_gpu_available(&why_)) GTEST_SKIP() << "needs a Hopper GPU: " << why_; \
  } while (0)

namespace k3moe::testing {

template <class T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(int64_t(host.size() * sizeof(T)));
  K3MOE_CUDA_CHECK(cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& buffer) {
  std::vector<T> host(size_t(buffer.bytes()) / sizeof(T));
  K3MOE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace k3moe::testing
