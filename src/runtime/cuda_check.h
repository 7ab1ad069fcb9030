// CUDA runtime errors as k3moe::Error, naming the call that failed.
#pragma once

#include <cuda_runtime_api.h>

#include "k3moe/error.h"

#define K3MOE_CUDA_CHECK(call)                                                                    \
  do {                                                                                            \
    const cudaError_t k3moe_status_ = (call);                                                     \
    if (k3moe_status_ != cudaSuccess) {                                                           \
      cudaGetLastError(); /* not left for the caller's next CUDA call to report as its own */     \
      K3MOE_FAIL("CUDA error ", cudaGetErrorName(k3moe_status_), " (", cudaGetErrorString(k3moe_status_), \
                 ") in ", #call);                                                                 \
    }                                                                                             \
  } while (0)
