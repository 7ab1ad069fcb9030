// Kernel choices of the forward, from the problem's shape alone (host side, no device data).
#pragma once

#include <string>

#include "k3moe/config.h"
#include "kernels/expert_gemm.cuh"

namespace k3moe {

struct KernelChoice {
  kernels::TokenTile token_tile = kernels::TokenTile::T8;
  int gemm_warps = 4;    // 8: 32-token tiles at prefill, 2 m-tiles per warp
  int gemm1_splits = 1;  // K ranges of GEMM1 (> 1: partial rows + the activation stage)
  int gemm2_splits = 1;  // K ranges of GEMM2 (summed by the combine)
  double expected_active_experts = 0.0;
  double expected_rows_per_expert = 0.0;

  std::string describe() const;
};

// Uniform routing puts T K / E rows on each expert and hits L (1 - (1 - K/E)^T) of a rank's L
// experts. The token tile is the smallest of 8/16/32 that holds an expert's rows, so that decode
// does not stream weights against empty tile columns and prefill reuses each weight fragment over
// 32 tokens; from 64 rows per expert the 32-token CTAs run 8 warps (measured: local28 T = 128
// 636 us against 704 with 4; T = 32 263 against 250). K is split into ranges when that balances the units of work (token tile x 256 weight
// rows x K range) over the resident CTAs better (a few experts at decode): then every SM streams
// weights to the end (the cost model: heuristics.cpp).
// `forced_tile` (8, 16, 32, 128; 0: choose) fixes the token tile; the rest is chosen for it.
// From kWgmmaMinRows rows per expert on, the 128-token wgmma kernel runs both GEMMs (K whole).
KernelChoice choose_kernels(const MoeConfig& config, ExpertParallel ep, int tokens, int sm_count, int forced_tile = 0);

inline constexpr double kWgmmaMinRows = 64.0;

}  // namespace k3moe
