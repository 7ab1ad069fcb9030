#include "runtime/captured_graph.h"

#include "k3moe/error.h"
#include "runtime/cuda_check.h"

namespace k3moe {

void CapturedGraph::begin(cudaStream_t stream) {
  K3MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

void CapturedGraph::abandon(cudaStream_t stream) {
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
  cudaGetLastError();  // the enqueue's own error is the one reported
}

void CapturedGraph::end(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  K3MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess)
    K3MOE_FAIL("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in cudaGraphInstantiate");
}

CapturedGraph& CapturedGraph::operator=(CapturedGraph&& other) noexcept {
  if (this != &other) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CapturedGraph::~CapturedGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CapturedGraph::launch(cudaStream_t stream) const {
  K3MOE_CHECK(exec_ != nullptr, "launch of an empty CapturedGraph");
  K3MOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

}  // namespace k3moe
