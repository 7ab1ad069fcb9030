// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "k3moe/plan.h"

#define K3MOE_REQUIRE_GPU()                                             \
  do {                                                                  \
    std::string why_;                                                   \
    if (!k3moe::hopper_gpu_available(&why_)) GTEST_SKIP() << "needs a Hopper GPU: " << why_; \
  } while (0)
