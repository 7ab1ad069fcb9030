// Kernel launches, enqueued or recorded: every kernel of the forward goes through
// enqueue_dependent (kernels/launch.cuh), which enqueues it with programmatic dependent launch, or,
// while a LaunchRecording lives on the calling thread, keeps the launch (kernel, shape, argument
// bytes) instead. ForwardGraph turns a recorded forward into one CUDA-graph launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace k3moe {

struct RecordedLaunch {
  const void* kernel = nullptr;
  dim3 grid, block;
  size_t smem = 0;
  std::vector<std::byte> values;  // the arguments' bytes, argument i at offsets[i]
  std::vector<size_t> offsets;

  bool operator==(const RecordedLaunch& other) const;
  // The launch as a graph kernel node's parameters; they point into `pointers` and `values`.
  cudaKernelNodeParams node_params(std::vector<void*>& pointers) const;
};

// While it lives, the calling thread's launches are appended to `into` (elements past count() are
// left from earlier recordings, so that their storage is reused).
class LaunchRecording {
 public:
  explicit LaunchRecording(std::vector<RecordedLaunch>& into);
  ~LaunchRecording();
  LaunchRecording(const LaunchRecording&) = delete;
  LaunchRecording& operator=(const LaunchRecording&) = delete;

  size_t count() const { return count_; }
  void record(const void* kernel, dim3 grid, dim3 block, size_t smem, void** args, const size_t* sizes, int num_args);

 private:
  std::vector<RecordedLaunch>& into_;
  size_t count_ = 0;
  LaunchRecording* outer_;
};

// Enqueues `kernel` on `stream` as a programmatic dependent of the work before it, or records it
// (see above). `args[i]` points to argument i, of sizes[i] bytes.
void enqueue_dependent(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
                       const size_t* sizes, int num_args);
// Enqueues a recorded launch as enqueue_dependent would have.
void enqueue_recorded(const RecordedLaunch& launch, cudaStream_t stream);

}  // namespace k3moe
