// Empties L2 before a timed call, so that nothing an earlier call read or wrote serves it from L2
// (PERF.md: what is timed must not come from L2). It reads a buffer of four times the L2's size
// with loads that fill L2 under the normal policy: the lines it leaves are clean, so the timed call
// pays no write-back for them. The benchmark waits for it before the call's start event, so every
// timed call still starts from an idle GPU, as without it.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/device_buffer.h"

namespace k3moe::cli {

class L2Flush {
 public:
  explicit L2Flush(int device);
  void run(cudaStream_t stream) const;  // enqueues the reads; does not wait for them

 private:
  DeviceBuffer buffer_, sink_;
  int blocks_ = 0;
};

}  // namespace k3moe::cli
