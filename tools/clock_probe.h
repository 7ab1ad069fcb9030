// The SM clock as the SMs count it. NVML's clock readings lag a change by tens of milliseconds
// (bench/NOTES.md, Session 39: a series ran at its slow speed from its first call while NVML still
// read 1980 MHz for 12 more), so `k3moe bench` also launches this probe after each timed call,
// outside its events: one thread counts clock64 ticks over ~30 us of the global timer.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

namespace k3moe::cli {

class ClockProbe {
 public:
  explicit ClockProbe(int capacity);
  ~ClockProbe();
  ClockProbe(const ClockProbe&) = delete;
  ClockProbe& operator=(const ClockProbe&) = delete;

  int capacity() const { return capacity_; }
  // Enqueues one measurement into `slot` (< capacity) on `stream`.
  void launch(cudaStream_t stream, int slot);
  // The first `count` slots in MHz, after `stream`'s work so far.
  std::vector<double> mhz(cudaStream_t stream, int count) const;

 private:
  float* slots_ = nullptr;
  int capacity_;
};

}  // namespace k3moe::cli
