// cuBLASLt status codes as k3moe::Error, naming the call (the benchmark's ceilings and baseline).
#pragma once

#include <cublasLt.h>

#include "k3moe/error.h"

#define K3MOE_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                 \
    const cublasStatus_t status_ = (call);                                                             \
    if (status_ != CUBLAS_STATUS_SUCCESS) K3MOE_FAIL("cuBLASLt error ", int(status_), " in ", #call); \
  } while (0)
