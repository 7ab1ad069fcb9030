// Holds a stream while a timed call is enqueued, so that its events time the GPU's work and not
// the host's submission. Without it the start event is recorded on an idle stream, the GPU passes
// it at once, and the time until the host's cudaGraphLaunch reaches the GPU counts as the call's
// (0.2-0.8 us of a decode forward on an H100: bench/NOTES.md, Session 64). A deployment replays the
// forward inside a larger graph, behind other kernels, where no host latency lies between them;
// NVIDIA's nvbench holds its stream the same way. One thread spins on a host-written ticket; if the
// host never releases it (a timed call that synchronizes its stream would do that), the kernel
// gives up after a second and check() reports it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3moe::cli {

class LaunchGate {
 public:
  LaunchGate();
  ~LaunchGate();
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;

  void hold(cudaStream_t stream);  // enqueues the spinning kernel
  void release();                  // lets it end
  void check() const;              // after the stream's work: throws if a hold gave up waiting

 private:
  volatile uint32_t* ticket_ = nullptr;  // pinned, mapped: the host writes, the kernel polls
  volatile uint32_t* timed_out_ = nullptr;  // pinned, mapped: the kernel writes
  uint32_t* device_ticket_ = nullptr;
  uint32_t* device_timed_out_ = nullptr;
  uint32_t next_ = 0;
};

LaunchGate& process_launch_gate();  // one for every timed series of the process, made on first use

}  // namespace k3moe::cli
