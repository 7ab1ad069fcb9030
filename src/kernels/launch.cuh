// Kernel launches with programmatic dependent launch: the kernel may start while the previous one
// in the stream finishes (it calls griddepcontrol_wait before reading that kernel's output), which
// removes the launch gap and lets it prefetch what does not depend on it. Graph capture keeps it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda_check.h"

namespace k3moe::kernels {

template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
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
  K3MOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace k3moe::kernels
