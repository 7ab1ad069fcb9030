#include "k3moe/forward_graph.h"

#include <map>
#include <vector>

#include "runtime/captured_graph.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_buffer.h"
#include "runtime/launch_recorder.h"
#include "runtime/tensor_checks.h"

namespace k3moe {

struct ForwardGraph::Impl {
  struct Chain {
    CapturedGraph graph;
    std::vector<cudaGraphNode_t> nodes;  // in launch order
    std::vector<RecordedLaunch> held;    // the launch each node holds now
  };
  std::map<size_t, Chain> chains;  // by kernel count
  int device = -1;                 // the device of every chain's kernels
  int built = 0;
  std::vector<RecordedLaunch> recorded;
  std::vector<void*> pointers;

  Chain build(size_t count) {
    Chain chain;
    const CudaStream capture_stream;
    chain.graph = CapturedGraph(capture_stream, [&] {
      for (size_t i = 0; i < count; ++i) enqueue_recorded(recorded[i], capture_stream);
    });
    chain.nodes = chain.graph.chain();
    K3MOE_CHECK(chain.nodes.size() == count, "the forward's graph holds ", chain.nodes.size(), " nodes for ", count,
                " launches");
    chain.held.assign(recorded.begin(), recorded.begin() + std::ptrdiff_t(count));
    ++built;
    return chain;
  }

  void update(Chain& chain, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      if (chain.held[i] == recorded[i]) continue;
      chain.graph.set_kernel(chain.nodes[i], recorded[i].node_params(pointers));
      chain.held[i] = recorded[i];
    }
  }
};

ForwardGraph::ForwardGraph() : impl_(std::make_unique<Impl>()) {}
ForwardGraph::ForwardGraph(ForwardGraph&&) noexcept = default;
ForwardGraph& ForwardGraph::operator=(ForwardGraph&&) noexcept = default;
ForwardGraph::~ForwardGraph() = default;

int ForwardGraph::graphs_built() const { return impl_->built; }

void ForwardGraph::forward(const MoePlan& plan, const DeviceExperts& experts, const ForwardArgs& args,
                           cudaStream_t stream, void* workspace) {
  if (stream_is_capturing(stream)) return plan.forward(experts, args, stream, workspace);

  Impl& p = *impl_;
  size_t count = 0;
  {
    LaunchRecording recording(p.recorded);
    plan.forward(experts, args, stream, workspace);
    count = recording.count();
  }
  if (count == 0) return;
  const int device = plan.options().device;
  if (device != p.device) {
    p.chains.clear();
    p.device = device;
  }
  DeviceGuard guard(device);
  auto chain = p.chains.find(count);
  if (chain == p.chains.end()) chain = p.chains.emplace(count, p.build(count)).first;
  else p.update(chain->second, count);
  chain->second.graph.launch(stream);
}

}  // namespace k3moe
