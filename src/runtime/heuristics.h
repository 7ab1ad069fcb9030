// Kernel choices of the forward, from the problem's shape alone (host side, no device data).
#pragma once

#include <string>

#include "k3moe/config.h"
#include "kernels/expert_gemm.cuh"

namespace k3moe {

struct KernelChoice {
  kernels::TokenTile token_tile = kernels::TokenTile::T8;
  double expected_rows_per_expert = 0.0;  // T K / E, what the choice is based on

  std::string describe() const;
};

// Uniform routing puts T K / E rows on each expert; the token tile is the smallest of 8/16/32
// that holds that many, so that decode does not stream weights against empty tile columns and
// prefill reuses each weight fragment over 32 tokens.
KernelChoice choose_kernels(const MoeConfig& config, int tokens);

}  // namespace k3moe
