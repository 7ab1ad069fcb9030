#include "stream_workspace.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

namespace k3moe::torch_binding {
namespace {

struct KeptWorkspace {
  std::mutex mutex;  // held by the forward enqueueing over `buffer`
  void* buffer = nullptr;  // cudaMallocAsync on its stream
  int64_t bytes = 0;
  ForwardGraph graph;  // the stream's eager forwards
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
// have one. Keyed by the stream's id, not its handle: a handle may come back for a new stream after
// its stream is destroyed with a forward still running on it, and cudaStreamPerThread is one handle
// for a different stream in every thread. NOTE: only for a stream that is not capturing
// (cudaStreamGetId fails on one, and ends the capture).
KeptWorkspace* kept_workspace(int device, cudaStream_t stream) {
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  static std::mutex mutex;
  // NOTE: never destroyed: its buffers would otherwise be freed after the CUDA context at exit.
  static auto* kept = new std::map<std::pair<int, unsigned long long>, std::unique_ptr<KeptWorkspace>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = kept->find({device, id});
  if (it == kept->end()) {
    if (kept->size() >= kMaxKeptWorkspaces) return nullptr;
    it = kept->emplace(std::pair(device, id), std::make_unique<KeptWorkspace>()).first;
  }
  return it->second.get();
}

// Makes `kept` hold at least `bytes`; false (nothing changed) where the runtime has no memory.
bool grow(KeptWorkspace& kept, int64_t bytes, c10::Device device, cudaStream_t stream) {
  if (kept.bytes >= bytes) return true;
  const c10::cuda::CUDAGuard on(device);
  // NOTE: doubling keeps a growing T from allocating on every call.
  const int64_t size = std::min(kMaxKeptWorkspaceBytes, std::max(bytes, 2 * kept.bytes));
  void* buffer = nullptr;
  if (cudaMallocAsync(&buffer, size_t(size), stream) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // NOTE: the old buffer is freed in this stream's order, the only stream that used it.
  if (kept.buffer != nullptr && cudaFreeAsync(kept.buffer, stream) != cudaSuccess) cudaGetLastError();
  kept.buffer = buffer;
  kept.bytes = size;
  return true;
}

// `bytes` from the runtime's stream-ordered allocator on `stream`; if it has no memory, once more
// after torch's caching allocator released its unused blocks.
void* allocate_stream_ordered(int64_t bytes, c10::Device device, cudaStream_t stream) {
  const c10::cuda::CUDAGuard on(device);
  void* buffer = nullptr;
  cudaError_t status = cudaMallocAsync(&buffer, size_t(bytes), stream);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    c10::cuda::CUDACachingAllocator::emptyCache();
    status = cudaMallocAsync(&buffer, size_t(bytes), stream);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    TORCH_CHECK(false, "the forward's workspace of ", bytes, " bytes on cudaStreamPerThread (", device.str(),
                "): cudaMallocAsync failed: ", cudaGetErrorString(status));
  }
  return buffer;
}

}  // namespace

StreamWorkspace::StreamWorkspace(int64_t bytes, c10::Device device, cudaStream_t stream) : device_(device) {
  const bool free_of_capture = uncaptured(stream);
  KeptWorkspace* kept =
      bytes <= kMaxKeptWorkspaceBytes && free_of_capture ? kept_workspace(device.index(), stream) : nullptr;
  if (kept != nullptr) {
    kept_lock_ = std::unique_lock<std::mutex>(kept->mutex);
    if (grow(*kept, bytes, device, stream)) {
      data_ = kept->buffer;
      forward_graph_ = &kept->graph;
      return;
    }
    kept_lock_.unlock();
  }
  if (stream == cudaStreamPerThread && free_of_capture) {
    stream_ordered_ = allocate_stream_ordered(bytes, device, stream);
    stream_ = stream;
    data_ = stream_ordered_;
    return;
  }
  allocated_ = allocate(bytes, device);
  data_ = allocated_.data_ptr();
}

StreamWorkspace::~StreamWorkspace() {
  if (stream_ordered_ == nullptr) return;
  const c10::cuda::CUDAGuard on(device_);
  if (cudaFreeAsync(stream_ordered_, stream_) != cudaSuccess) cudaGetLastError();
}

}  // namespace k3moe::torch_binding
