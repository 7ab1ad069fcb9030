// The forward's workspace. Outside CUDA graph capture a small workspace (at most
// kMaxKeptWorkspaceBytes) is kept per (device, stream) and reused by every forward on that stream:
// stream order serialises its uses, and it saves an allocation and a free per call (~1.5 us of an
// eager forward's ~30 us on the H200 machine's host; bench/NOTES.md, Session 44). Kept workspaces
// come from the CUDA runtime's stream-ordered allocator, not from torch's: while torch.compile's
// CUDA graphs warm up (mode="reduce-overhead"), torch hands every allocation of the thread to the
// graphs' private pool, which must not hold memory that outlives a run. Larger workspaces, and
// every workspace under capture (the graph's private pool), come from torch's caching allocator
// per call, except on cudaStreamPerThread: that one handle names a different stream in every host
// thread, and torch's allocator, which keys its blocks by handle, would hand a block freed in one
// thread to another while the first thread's kernels still use it (bench/NOTES.md, Session 47).
// There a per-call workspace comes from the runtime's stream-ordered allocator, which resolves the
// handle to the calling thread's stream. A stream that keeps a workspace also keeps a ForwardGraph
// (k3moe/forward_graph.h): its eager forwards are then one graph launch each.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "k3moe/forward_graph.h"

namespace k3moe::torch_binding {

inline constexpr int64_t kMaxKeptWorkspaceBytes = int64_t(16) << 20;
// Streams that keep a workspace, per process (each at most kMaxKeptWorkspaceBytes, held until the
// process ends); forwards on further streams allocate per call.
inline constexpr size_t kMaxKeptWorkspaces = 64;

class StreamWorkspace {
 public:
  // At least `bytes` of device memory for one forward enqueued on `stream` (the current stream of
  // `device`). Hold the object until the forward is enqueued: a kept workspace stays locked, so
  // that two host threads enqueueing on one stream do not interleave their kernels over it.
  StreamWorkspace(int64_t bytes, c10::Device device, cudaStream_t stream);
  ~StreamWorkspace();  // a stream-ordered workspace is freed after the work enqueued so far
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  void* data() const { return data_; }
  // The stream's ForwardGraph where its workspace is kept (guarded by the same lock), else null.
  ForwardGraph* forward_graph() const { return forward_graph_; }

 private:
  at::Tensor allocated_;  // a per-call workspace from torch
  void* stream_ordered_ = nullptr;  // a per-call workspace on cudaStreamPerThread
  cudaStream_t stream_ = nullptr;
  c10::Device device_;
  std::unique_lock<std::mutex> kept_lock_;
  void* data_ = nullptr;
  ForwardGraph* forward_graph_ = nullptr;
};

}  // namespace k3moe::torch_binding
