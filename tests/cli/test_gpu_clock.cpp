// The bench's SM clock summary (gpu_clock.h) and its sampler where no GPU answers.
#include "gpu_clock.h"

#include <gtest/gtest.h>

namespace k3moe::cli {
namespace {

TEST(ClockSummary, NoSamplesGiveAnEmptySummary) {
  const ClockSummary s = summarize_clock({});
  EXPECT_EQ(s.samples, 0);
  EXPECT_EQ(s.median_mhz, 0.0);
  EXPECT_EQ(s.power_capped_fraction, 0.0);
}

TEST(ClockSummary, MedianRangeAndTheShareUnderThePowerCap) {
  // 0x4 software power cap, 0x80 hardware power brake: capped; 0x1 idle, 0x20 software thermal: not.
  const ClockSummary s = summarize_clock({{1980, 0x0}, {1710, 0x4}, {1695, 0x4 | 0x20}, {1980, 0x1}, {1740, 0x80},
                                          {1830, 0x20}});
  EXPECT_EQ(s.samples, 6);
  EXPECT_EQ(s.min_mhz, 1695.0);
  EXPECT_EQ(s.max_mhz, 1980.0);
  EXPECT_EQ(s.median_mhz, 1830.0);  // sorted 1695 1710 1740 1830 1980 1980: element 3
  EXPECT_DOUBLE_EQ(s.power_capped_fraction, 3.0 / 6.0);
  EXPECT_EQ(s.reasons_seen, 0x4u | 0x20u | 0x1u | 0x80u);
}

TEST(ClockSummary, MemoryClockMedian) {
  const ClockSummary s = summarize_clock({{1980, 0, 3201}, {1700, 0x4, 2619}, {1800, 0, 3201}});
  EXPECT_EQ(s.median_mem_mhz, 3201.0);
  EXPECT_EQ(s.median_mhz, 1800.0);  // the SM clock's median is taken on its own
}

TEST(ClockSampler, WithoutAGpuAtTheBusIdItSaysWhyAndSamplesNothing) {
  ClockSampler sampler("ffff:ff:1f.7");
  EXPECT_FALSE(sampler.available());
  // No NVML here (a machine without the driver), or NVML without a GPU at that bus id.
  EXPECT_TRUE(sampler.why().find("NVML") != std::string::npos) << sampler.why();
  sampler.start();
  EXPECT_EQ(sampler.stop().samples, 0);
}

}  // namespace
}  // namespace k3moe::cli
