#include "clock_probe.h"

#include <cstdint>

#include "k3moe/error.h"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::cli {
namespace {

constexpr uint64_t kWindowNs = 30000;

// Both ends sit on a tick of the global timer (its update period may be far longer than a cycle).
__global__ void count_sm_clock(float* slots, int slot) {
  const uint64_t before = ptx::globaltimer();
  uint64_t t0;
  while ((t0 = ptx::globaltimer()) == before) {
  }
  const long long c0 = clock64();
  uint64_t t1;
  while ((t1 = ptx::globaltimer()) < t0 + kWindowNs) {
  }
  const long long c1 = clock64();
  slots[slot] = float(double(c1 - c0) * 1000.0 / double(t1 - t0));
}

}  // namespace

ClockProbe::ClockProbe(int capacity) : capacity_(capacity) {
  K3MOE_CUDA_CHECK(cudaMalloc(&slots_, sizeof(float) * capacity));
  K3MOE_CUDA_CHECK(cudaMemset(slots_, 0, sizeof(float) * capacity));
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // before probes on other (non-blocking) streams
}

ClockProbe::~ClockProbe() { cudaFree(slots_); }

void ClockProbe::launch(cudaStream_t stream, int slot) {
  K3MOE_CHECK(slot >= 0 && slot < capacity_, "clock probe slot ", slot, " outside [0, ", capacity_, ")");
  count_sm_clock<<<1, 1, 0, stream>>>(slots_, slot);
  K3MOE_CUDA_CHECK(cudaGetLastError());
}

std::vector<double> ClockProbe::mhz(cudaStream_t stream, int count) const {
  K3MOE_CHECK(count >= 0 && count <= capacity_, "clock probe count ", count, " outside [0, ", capacity_, "]");
  std::vector<float> v(count);
  K3MOE_CUDA_CHECK(cudaMemcpyAsync(v.data(), slots_, sizeof(float) * count, cudaMemcpyDeviceToHost, stream));
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {v.begin(), v.end()};
}

}  // namespace k3moe::cli
