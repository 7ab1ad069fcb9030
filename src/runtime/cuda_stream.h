// An owning non-blocking CUDA stream (cudaStreamCreateWithFlags / cudaStreamDestroy).
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"

namespace k3moe {

class CudaStream {
 public:
  CudaStream() { K3MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() { cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace k3moe
