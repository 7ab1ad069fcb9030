// Event timing for the benchmarks: warm up, then time each call with CUDA events; the median.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "runtime/cuda_check.h"

namespace k3moe::cli {

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
};

template <class Fn>
Timing time_ms(cudaStream_t stream, int warmup, int repeats, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t start, stop;
  K3MOE_CUDA_CHECK(cudaEventCreate(&start));
  K3MOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    K3MOE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(warmup + i);
    K3MOE_CUDA_CHECK(cudaEventRecord(stop, stream));
    K3MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    K3MOE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace k3moe::cli
