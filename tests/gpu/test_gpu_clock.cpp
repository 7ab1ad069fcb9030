// The bench's clock sampler on the GPU machine: NVML answers for the device CUDA names, and a
// sampled period gives plausible SM clocks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu_clock.h"
#include "gpu_test.h"
#include "runtime/cuda_check.h"

namespace k3moe::cli {
namespace {

TEST(ClockSampler, SamplesTheSmClockOfTheCudaDevice) {
  K3MOE_REQUIRE_GPU();
  char bus_id[64] = {};
  K3MOE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
  ClockSampler sampler(bus_id);
  ASSERT_TRUE(sampler.available()) << sampler.why();
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ClockSummary s = sampler.stop();
  EXPECT_GE(s.samples, 10) << "1 ms period over 50 ms";
  int max_mhz = 0;
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&max_mhz, cudaDevAttrClockRate, 0));  // kHz
  max_mhz /= 1000;
  EXPECT_GT(s.min_mhz, 0.0);
  EXPECT_LE(s.max_mhz, max_mhz + 50.0) << "above the device's rated clock of " << max_mhz << " MHz";
  EXPECT_LE(s.min_mhz, s.median_mhz);
  EXPECT_LE(s.median_mhz, s.max_mhz);
}

}  // namespace
}  // namespace k3moe::cli
