// The SM clock while a benchmark series runs, sampled through NVML: the H200 lowers its clock
// under its power cap 40-60 ms into heavy load, so a long "burst" series (local28 T >= 1024) may
// run partly or wholly below the clock its ceilings ran at (bench/NOTES.md, Sessions 38-39).
// NVML's clock and cap reasons lag the change by 10-40 ms; clock_probe.h counts the clock itself,
// and these samples keep the cap reasons and the memory clock. NVML is opened at run time
// (libnvidia-ml.so.1 comes with the driver), so the tools do not link it and a machine without it
// only loses those.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace k3moe::cli {

struct ClockSample {
  unsigned mhz = 0;
  uint64_t reasons = 0;  // NVML's clock event reasons (nvmlClocksEventReason*) at the sample
  unsigned mem_mhz = 0;  // the memory clock (0: not reported)
  double t_ms = 0;        // since the sampler's start()
};

// NVML's reasons that mean the power limit holds the clock down: the software power cap and the
// hardware power brake.
constexpr uint64_t kPowerCapReasons = 0x4 | 0x80;

struct ClockSummary {
  int samples = 0;  // 0: no samples (NVML absent, or the series was shorter than one period)
  double min_mhz = 0, median_mhz = 0, max_mhz = 0;
  double power_capped_fraction = 0;  // of the samples with a kPowerCapReasons bit
  double median_mem_mhz = 0;
  uint64_t reasons_seen = 0;  // every reason bit of any sample
  // The clock the SMs counted after each call (clock_probe.h; 0 without the probe).
  double counted_min_mhz = 0, counted_median_mhz = 0, counted_max_mhz = 0;
};

inline ClockSummary summarize_clock(std::vector<ClockSample> samples) {
  ClockSummary s;
  s.samples = int(samples.size());
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end(), [](const ClockSample& a, const ClockSample& b) { return a.mhz < b.mhz; });
  s.min_mhz = samples.front().mhz;
  s.max_mhz = samples.back().mhz;
  s.median_mhz = samples[samples.size() / 2].mhz;
  const auto capped = std::count_if(samples.begin(), samples.end(),
                                    [](const ClockSample& x) { return (x.reasons & kPowerCapReasons) != 0; });
  s.power_capped_fraction = double(capped) / double(samples.size());
  std::vector<unsigned> mem;
  for (const ClockSample& x : samples) mem.push_back(x.mem_mhz);
  std::nth_element(mem.begin(), mem.begin() + mem.size() / 2, mem.end());
  s.median_mem_mhz = mem[mem.size() / 2];
  for (const ClockSample& x : samples) s.reasons_seen |= x.reasons;
  return s;
}

// Samples one GPU's SM clock, clock event reasons and memory clock every `period_us` on a thread of its own,
// between start() and stop(). Not available (available() false, why() says why) without NVML or
// without a GPU at `pci_bus_id` (cudaDeviceGetPCIBusId's form); then stop() returns no samples.
class ClockSampler {
 public:
  explicit ClockSampler(const std::string& pci_bus_id, int period_us = 1000);
  ~ClockSampler();
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& why() const { return why_; }
  // The NVIDIA driver's release (e.g. "580.95.05"); empty where NVML did not report it.
  const std::string& driver_release() const { return driver_release_; }
  void start();
  ClockSummary stop();
  // The last series' samples, and the milliseconds from its start() to now (steady clock): a
  // caller marks its own events on the samples' time axis.
  const std::vector<ClockSample>& samples() const { return samples_; }
  double elapsed_ms() const;

 private:
  bool read(ClockSample& sample) const;

  void* library_ = nullptr;
  void* device_ = nullptr;
  int (*clock_info_)(void*, int, unsigned*) = nullptr;
  int (*event_reasons_)(void*, unsigned long long*) = nullptr;
  int (*shutdown_)() = nullptr;
  int period_us_;
  std::string why_;
  std::string driver_release_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<ClockSample> samples_;
};

}  // namespace k3moe::cli
