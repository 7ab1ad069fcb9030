// `k3moe bench --stages`: when each stage of the forward ran inside the replayed graph
// (ForwardArgs::stage_times), as medians over replays, relative to each replay's first mark.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "k3moe/stage_times.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace k3moe::cli {

struct StageSpan {
  bool ran = false;
  double start_us = 0, wait_us = -1, end_us = 0;  // wait_us < 0: the stage has no wait mark
};
using StageSpans = std::vector<StageSpan>;  // by ForwardStage

// `replay(i)` enqueues the i-th replay of a graph captured with stage_times = records.get().
template <class Replay>
StageSpans measure_stage_spans(cudaStream_t stream, const DeviceBuffer& records, int repeats, Replay&& replay) {
  K3MOE_CUDA_CHECK(cudaMemsetAsync(records.get(), 0, kForwardStages * sizeof(StageTimes), stream));
  std::vector<std::vector<double>> start(kForwardStages), wait(kForwardStages), end(kForwardStages);
  std::vector<StageTimes> t(kForwardStages);
  for (int i = 0; i < repeats; ++i) {
    replay(i);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    K3MOE_CUDA_CHECK(cudaMemcpy(t.data(), records.get(), t.size() * sizeof(StageTimes), cudaMemcpyDeviceToHost));
    uint64_t first = UINT64_MAX;
    for (const StageTimes& s : t)
      if (s.last_start) first = std::min(first, s.last_start);
    for (int s = 0; s < kForwardStages; ++s) {
      if (!t[s].last_start) continue;
      start[s].push_back((t[s].last_start - first) * 1e-3);
      end[s].push_back((t[s].last_end - first) * 1e-3);
      if (t[s].last_wait) wait[s].push_back((t[s].last_wait - first) * 1e-3);
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  StageSpans spans(kForwardStages);
  for (int s = 0; s < kForwardStages; ++s) {
    // A stage marked in some replays only is a defect of the marks: report what was seen.
    if (start[s].empty()) continue;
    spans[s] = {true, median(start[s]), wait[s].empty() ? -1.0 : median(wait[s]), median(end[s])};
  }
  return spans;
}

inline std::string describe(const StageSpans& spans) {
  std::string text;
  char buf[96];
  for (int s = 0; s < kForwardStages; ++s) {
    if (!spans[s].ran) continue;
    const StageSpan& p = spans[s];
    if (p.wait_us >= 0)
      std::snprintf(buf, sizeof buf, "%s%s %.1f / %.1f / %.1f", text.empty() ? "" : " | ",
                    std::string(to_string(ForwardStage(s))).c_str(), p.start_us, p.wait_us, p.end_us);
    else
      std::snprintf(buf, sizeof buf, "%s%s %.1f / - / %.1f", text.empty() ? "" : " | ",
                    std::string(to_string(ForwardStage(s))).c_str(), p.start_us, p.end_us);
    text += buf;
  }
  return text;
}

}  // namespace k3moe::cli
