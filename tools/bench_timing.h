// Event timing for the benchmarks: warm up, then time each call with CUDA events; the median.
// With sustain_ms > 0 the calls first run back to back for that long, so that what is timed runs
// in the GPU's steady state under load (on the H200 the forward reaches its 700 W power limit
// within ~100 ms and the SM clock drops from 1980 MHz to 1.05-1.98 GHz; bench/NOTES.md, Session 28).
// With a ClockWatch the SM clock is sampled (NVML: also the memory clock) while the timed
// calls run, and counted after each call (the probe). With an L2Flush, L2 is emptied before each
// timed call and the GPU is idle again before its start event (l2_flush.h). Each timed call is
// enqueued behind a held stream (launch_gate.h), so its events time the GPU's work from its first
// kernel, not the host's submission; `k3moe bench --idle-launch` times from an idle stream instead,
// as runs up to Session 63's did.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "clock_probe.h"
#include "gpu_clock.h"
#include "l2_flush.h"
#include "launch_gate.h"
#include "k3moe/error.h"
#include "runtime/cuda_check.h"

namespace k3moe::cli {

// What a timed series watches the SM clock with: NVML's readings (and its cap reasons) on a thread
// beside the calls, and the probe counting the clock after each call. Either may be null.
struct ClockWatch {
  ClockSampler* nvml = nullptr;
  ClockProbe* probe = nullptr;
};

// How every timed call of this process starts; `k3moe bench` sets it once from --idle-launch.
enum class Launch { Held, Idle };
inline Launch timed_launch = Launch::Held;

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  ClockSummary clock;  // no samples without a sampler
  std::vector<double> in_order_ms;  // each timed call, in the order they ran
  // With NVML: when each timed call ended on the samples' time axis, and the samples.
  std::vector<double> in_order_end_ms;
  std::vector<ClockSample> clock_samples;
  std::vector<double> counted_mhz;  // with the probe: the clock counted after each call, in order
};

template <class Fn>
void sustain(cudaStream_t stream, double sustain_ms, Fn&& fn) {
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count() < sustain_ms;) {
    for (int j = 0; j < 8; ++j) fn(i++);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

// A call whose enqueueing can wait for the GPU cannot be timed behind a held stream: a 4 GiB
// cudaMemcpyAsync is queued in pieces, and the host stalled on it until the gate gave up (Session 64).
// Such a call passes Launch::Idle; its time (a millisecond) does not notice the launch's < 1 us.
template <class Fn>
Timing time_ms(cudaStream_t stream, int warmup, int repeats, Fn&& fn, double sustain_ms = 0.0,
               ClockWatch watch = {}, const L2Flush* flush = nullptr, Launch launch = Launch::Held) {
  sustain(stream, sustain_ms, fn);
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t start, stop;
  K3MOE_CUDA_CHECK(cudaEventCreate(&start));
  K3MOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms, end_ms;
  ClockSampler* const clock = watch.nvml;
  ClockProbe* const probe = watch.probe;
  K3MOE_CHECK(probe == nullptr || probe->capacity() >= repeats, "the clock probe holds ",
              probe ? probe->capacity() : 0, " calls, the series times ", repeats);
  const bool held = timed_launch == Launch::Held && launch == Launch::Held;
  LaunchGate* const gate = held ? &process_launch_gate() : nullptr;
  if (clock != nullptr) clock->start();
  for (int i = 0; i < repeats; ++i) {
    if (flush != nullptr) {
      flush->run(stream);
      K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    if (held) gate->hold(stream);
    K3MOE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(warmup + i);
    K3MOE_CUDA_CHECK(cudaEventRecord(stop, stream));
    if (probe != nullptr) probe->launch(stream, i);
    if (held) gate->release();
    K3MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    if (held) gate->check();
    if (clock != nullptr) end_ms.push_back(clock->elapsed_ms());
    float t = 0.0f;
    K3MOE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  ClockSummary clock_summary = clock != nullptr ? clock->stop() : ClockSummary{};
  std::vector<ClockSample> samples = clock != nullptr ? clock->samples() : std::vector<ClockSample>{};
  std::vector<double> counted = probe != nullptr ? probe->mhz(stream, repeats) : std::vector<double>{};
  if (!counted.empty()) {
    std::vector<double> sorted = counted;
    std::sort(sorted.begin(), sorted.end());
    clock_summary.counted_min_mhz = sorted.front();
    clock_summary.counted_median_mhz = sorted[sorted.size() / 2];
    clock_summary.counted_max_mhz = sorted.back();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> in_order = ms;
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back(), clock_summary, std::move(in_order), std::move(end_ms),
          std::move(samples), std::move(counted)};
}

}  // namespace k3moe::cli
