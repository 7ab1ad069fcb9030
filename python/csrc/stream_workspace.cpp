#include "stream_workspace.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

namespace k3moe::torch_binding {
namespace {

struct KeptWorkspace {
  std::mutex mutex;  // held by the forward enqueueing over `buffer`
  at::Tensor buffer;
};

at::Tensor allocate(int64_t bytes, c10::Device device) {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
}

// Whether `stream` is free of graph capture (under capture the workspace must come from the graph's
// pool).
bool uncaptured(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // NOTE: e.g. the legacy stream while another thread captures; allocate
    return false;
  }
  return capture == cudaStreamCaptureStatusNone;
}

// The workspace kept for (device, stream), made on first use; null once kMaxKeptWorkspaces streams
// have one. NOTE: keyed by the stream's handle, as torch keys its cuBLAS workspaces (cudaStreamGetId
// would tell a new stream from a destroyed one whose handle it got, but fails on a capturing stream
// and ends the capture): a stream must not be destroyed while a forward runs on it and its handle
// reused for a stream that runs a forward before that one ends.
KeptWorkspace* kept_workspace(int device, cudaStream_t stream) {
  static std::mutex mutex;
  // NOTE: never destroyed: its tensors would otherwise be freed after torch's CUDA state at exit.
  static auto* kept = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<KeptWorkspace>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = kept->find({device, stream});
  if (it == kept->end()) {
    if (kept->size() >= kMaxKeptWorkspaces) return nullptr;
    it = kept->emplace(std::pair(device, stream), std::make_unique<KeptWorkspace>()).first;
  }
  return it->second.get();
}

}  // namespace

StreamWorkspace::StreamWorkspace(int64_t bytes, c10::Device device, cudaStream_t stream) {
  KeptWorkspace* kept =
      bytes <= kMaxKeptWorkspaceBytes && uncaptured(stream) ? kept_workspace(device.index(), stream) : nullptr;
  if (!kept) {
    allocated_ = allocate(bytes, device);
    data_ = allocated_.data_ptr();
    return;
  }
  kept_lock_ = std::unique_lock<std::mutex>(kept->mutex);
  const int64_t have = kept->buffer.defined() ? kept->buffer.numel() : 0;
  if (have < bytes) {
    // NOTE: the old buffer goes back to the allocator in this stream's order, the only stream
    // that used it. Doubling keeps a growing T from allocating on every call.
    kept->buffer = at::Tensor();
    kept->buffer = allocate(std::min(kMaxKeptWorkspaceBytes, std::max(bytes, 2 * have)), device);
  }
  data_ = kept->buffer.data_ptr();
}

}  // namespace k3moe::torch_binding
