// MoePlan::forward for callers whose eager forward is bound by the host (a framework op at small
// T): the forward's kernels enqueued as one CUDA-graph launch instead of one launch each (four to
// seven). The first forward of a given kernel count captures and instantiates a graph of that
// many kernels; every later one records its launches (MoePlan::forward's host work, then no
// enqueue), replaces the launch of each graph node whose kernel, grid or arguments changed (new
// tensors, another T, another plan) and launches the graph. Outputs are bitwise MoePlan::forward's.
//
// One ForwardGraph per stream, used by one thread at a time: the launches of one graph run one
// after the other, so a ForwardGraph shared by streams would order their forwards. On a stream that
// is being captured (or whose capture state cannot be read) it calls MoePlan::forward, so that the
// kernels become part of the caller's graph.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "k3moe/plan.h"

namespace k3moe {

class ForwardGraph {
 public:
  ForwardGraph();
  ForwardGraph(ForwardGraph&&) noexcept;
  ForwardGraph& operator=(ForwardGraph&&) noexcept;
  ~ForwardGraph();

  // As plan.forward(experts, args, stream, workspace), errors included (thrown before anything is
  // enqueued).
  void forward(const MoePlan& plan, const DeviceExperts& experts, const ForwardArgs& args, cudaStream_t stream,
               void* workspace = nullptr);

  // Graphs instantiated so far (one per kernel count; for tests and diagnostics).
  int graphs_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3moe
