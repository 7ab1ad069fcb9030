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
  K3MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
  const cudaError_t status = cudaGraphInstantiate(&exec_, graph_, 0);
  if (status != cudaSuccess) {
    cudaGraphDestroy(std::exchange(graph_, nullptr));
    K3MOE_FAIL("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in cudaGraphInstantiate");
  }
}

CapturedGraph& CapturedGraph::operator=(CapturedGraph&& other) noexcept {
  if (this != &other) {
    this->~CapturedGraph();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CapturedGraph::~CapturedGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void CapturedGraph::launch(cudaStream_t stream) const {
  K3MOE_CHECK(exec_ != nullptr, "launch of an empty CapturedGraph");
  K3MOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

std::vector<cudaGraphNode_t> CapturedGraph::chain() const {
  K3MOE_CHECK(graph_ != nullptr, "chain of an empty CapturedGraph");
  size_t total = 0, roots = 1;
  K3MOE_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &total));
  std::vector<cudaGraphNode_t> nodes;
  if (total == 0) return nodes;
  nodes.push_back(nullptr);
  K3MOE_CUDA_CHECK(cudaGraphGetRootNodes(graph_, nodes.data(), &roots));
  K3MOE_CHECK(roots == 1, "the captured graph has ", roots, " root nodes, not one chain");
  while (nodes.size() < total) {
    cudaGraphNode_t next[2] = {};
    cudaGraphEdgeData edges[2] = {};
    size_t dependents = 2;
    // NOTE: with the edges' data: the query without it fails on a programmatic edge.
    K3MOE_CUDA_CHECK(cudaGraphNodeGetDependentNodes(nodes.back(), next, edges, &dependents));
    K3MOE_CHECK(dependents == 1, "the captured graph's node ", nodes.size() - 1, " has ", dependents,
                " dependents, not one chain");
    nodes.push_back(next[0]);
  }
  return nodes;
}

void CapturedGraph::set_kernel(cudaGraphNode_t node, const cudaKernelNodeParams& params) {
  K3MOE_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec_, node, &params));
}

}  // namespace k3moe
