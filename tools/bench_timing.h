// Event timing for the benchmarks: warm up, then time each call with CUDA events; the median.
// With sustain_ms > 0 the calls first run back to back for that long, so that what is timed runs
// in the GPU's steady state under load (on the H200 the forward reaches its 700 W power limit
// within ~100 ms and the SM clock drops from 1980 MHz to 1.05-1.98 GHz; bench/NOTES.md, Session 28).
// With a ClockSampler the SM clock is sampled while the timed calls run.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "gpu_clock.h"
#include "runtime/cuda_check.h"

namespace k3moe::cli {

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  ClockSummary clock;  // no samples without a sampler
  std::vector<double> in_order_ms;  // each timed call, in the order they ran
};

template <class Fn>
void sustain(cudaStream_t stream, double sustain_ms, Fn&& fn) {
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count() < sustain_ms;) {
    for (int j = 0; j < 8; ++j) fn(i++);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

template <class Fn>
Timing time_ms(cudaStream_t stream, int warmup, int repeats, Fn&& fn, double sustain_ms = 0.0,
               ClockSampler* clock = nullptr) {
  sustain(stream, sustain_ms, fn);
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t start, stop;
  K3MOE_CUDA_CHECK(cudaEventCreate(&start));
  K3MOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  if (clock != nullptr) clock->start();
  for (int i = 0; i < repeats; ++i) {
    K3MOE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(warmup + i);
    K3MOE_CUDA_CHECK(cudaEventRecord(stop, stream));
    K3MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    K3MOE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  const ClockSummary clock_summary = clock != nullptr ? clock->stop() : ClockSummary{};
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> in_order = ms;
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back(), clock_summary, std::move(in_order)};
}

}  // namespace k3moe::cli
