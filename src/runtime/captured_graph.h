// A CUDA graph captured from the work a callable enqueues on a stream, instantiated and owned:
// the one place the forward (or a baseline) is turned into a replayable graph. If the callable
// throws, the capture is ended and discarded before the exception goes on, so the stream is
// usable again.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

namespace k3moe {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  template <class Enqueue>
  CapturedGraph(cudaStream_t stream, Enqueue&& enqueue) {
    begin(stream);
    try {
      std::forward<Enqueue>(enqueue)();
    } catch (...) {
      abandon(stream);
      throw;
    }
    end(stream);
  }
  CapturedGraph(CapturedGraph&& other) noexcept
      : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
  CapturedGraph& operator=(CapturedGraph&& other) noexcept;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph();

  void launch(cudaStream_t stream) const;

  // The captured nodes in order, where they form one chain (each node the only dependent of the
  // one before, as a stream's launches do); throws otherwise.
  std::vector<cudaGraphNode_t> chain() const;
  // Replaces a kernel node's launch (all of it, the kernel included) for the launches after this.
  void set_kernel(cudaGraphNode_t node, const cudaKernelNodeParams& params);

 private:
  static void begin(cudaStream_t stream);
  static void abandon(cudaStream_t stream);
  void end(cudaStream_t stream);

  cudaGraph_t graph_ = nullptr;  // kept: its nodes name those of exec_
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace k3moe
