// The bench's clock sampler on the GPU machine: NVML answers for the device CUDA names, and a
// sampled period gives plausible SM clocks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "clock_probe.h"
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
  EXPECT_GT(s.median_mem_mhz, 0.0) << "NVML reports the memory clock of every datacenter GPU";
  ASSERT_EQ(int(sampler.samples().size()), s.samples);
  for (size_t i = 1; i < sampler.samples().size(); ++i)
    EXPECT_GT(sampler.samples()[i].t_ms, sampler.samples()[i - 1].t_ms) << "sample " << i;
}

// The probe counts the SM clock its kernel ran at: at most the rated clock, and a running clock (its
// spin keeps the SM busy for 30 us), into the slot each launch names.
TEST(ClockProbe, CountsAPlausibleSmClockIntoEachSlot) {
  K3MOE_REQUIRE_GPU();
  int rated_mhz = 0;
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&rated_mhz, cudaDevAttrClockRate, 0));
  rated_mhz /= 1000;
  ClockProbe probe(4);
  for (int slot = 0; slot < 4; ++slot) probe.launch(nullptr, slot);
  const std::vector<double> mhz = probe.mhz(nullptr, 4);
  ASSERT_EQ(mhz.size(), 4u);
  for (int slot = 0; slot < 4; ++slot) {
    EXPECT_GT(mhz[slot], 100.0) << "slot " << slot;
    EXPECT_LE(mhz[slot], rated_mhz * 1.02) << "slot " << slot << ": above the rated " << rated_mhz << " MHz";
  }
  EXPECT_THROW(probe.launch(nullptr, 4), Error);
  EXPECT_THROW(probe.mhz(nullptr, 5), Error);
}

}  // namespace
}  // namespace k3moe::cli
