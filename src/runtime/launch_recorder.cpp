#include "runtime/launch_recorder.h"

#include <cstring>

#include "runtime/cuda_check.h"

namespace k3moe {
namespace {

thread_local LaunchRecording* active_recording = nullptr;

void enqueue(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  K3MOE_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, args));
}

bool same_dim(dim3 a, dim3 b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

}  // namespace

bool RecordedLaunch::operator==(const RecordedLaunch& other) const {
  return kernel == other.kernel && same_dim(grid, other.grid) && same_dim(block, other.block) &&
         smem == other.smem && offsets == other.offsets && values == other.values;
}

cudaKernelNodeParams RecordedLaunch::node_params(std::vector<void*>& pointers) const {
  pointers.resize(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) pointers[i] = const_cast<std::byte*>(values.data() + offsets[i]);
  cudaKernelNodeParams params{};
  params.func = const_cast<void*>(kernel);
  params.gridDim = grid;
  params.blockDim = block;
  params.sharedMemBytes = unsigned(smem);
  params.kernelParams = pointers.data();
  return params;
}

LaunchRecording::LaunchRecording(std::vector<RecordedLaunch>& into) : into_(into), outer_(active_recording) {
  active_recording = this;
}

LaunchRecording::~LaunchRecording() { active_recording = outer_; }

void LaunchRecording::record(const void* kernel, dim3 grid, dim3 block, size_t smem, void** args, const size_t* sizes,
                             int num_args) {
  if (count_ == into_.size()) into_.emplace_back();
  RecordedLaunch& launch = into_[count_++];
  launch.kernel = kernel;
  launch.grid = grid;
  launch.block = block;
  launch.smem = smem;
  launch.offsets.resize(size_t(num_args));
  size_t bytes = 0;
  for (int i = 0; i < num_args; ++i) {
    launch.offsets[size_t(i)] = bytes;
    bytes += (sizes[i] + 15) / 16 * 16;
  }
  launch.values.assign(bytes, std::byte{0});
  for (int i = 0; i < num_args; ++i) std::memcpy(launch.values.data() + launch.offsets[size_t(i)], args[i], sizes[i]);
}

void enqueue_dependent(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
                       const size_t* sizes, int num_args) {
  if (active_recording != nullptr) return active_recording->record(kernel, grid, block, smem, args, sizes, num_args);
  enqueue(kernel, grid, block, smem, stream, args);
}

void enqueue_recorded(const RecordedLaunch& launch, cudaStream_t stream) {
  std::vector<void*> pointers;
  const cudaKernelNodeParams params = launch.node_params(pointers);
  enqueue(launch.kernel, launch.grid, launch.block, launch.smem, stream, params.kernelParams);
}

}  // namespace k3moe
