// Kernel choices of the forward, from the problem's shape alone (host side, no device data).
#pragma once

#include <string>

#include "k3moe/config.h"
#include "k3moe/plan.h"
#include "kernels/expert_gemm.cuh"

namespace k3moe {

struct KernelChoice {
  kernels::TokenTile token_tile = kernels::TokenTile::T8;
  // mma.sync: warps per CTA of both GEMMs (8: 32-token tiles at prefill, 2 m-tiles per warp);
  // wgmma: consumer warps of each GEMM (8 or 16, see choose_kernels).
  int gemm1_warps = 4;
  int gemm2_warps = 4;
  int gemm1_splits = 1;  // K ranges of GEMM1 (> 1: partial rows + the activation stage)
  int gemm2_splits = 1;  // K ranges of GEMM2 (summed by the combine)
  double expected_active_experts = 0.0;
  double expected_rows_per_expert = 0.0;
  bool weights_once = false;  // expected rows per expert fit one token tile (ExpertGemmArgs)
  // GEMM1 splits K and its CTAs leave room on every SM for one CTA of the activation stage, which
  // then lets GEMM2 start in GEMM1's tail (ActivationArgs::release_early).
  bool activation_beside_gemm1 = false;

  std::string describe() const;
};

// Uniform routing puts T K / E rows on each expert and hits L (1 - (1 - K/E)^T) of a rank's L
// experts. The token tile is the smallest that holds an expert's rows, so that weights are not
// streamed against empty tile columns: up to 20 rows the mma.sync kernels (8, 16 or 24 tokens),
// which split K so that a few experts still keep every SM streaming; above, the wgmma kernel with
// 32, 64, 96 or 128 tokens (K whole), as long as its units (token tile x 256 weight rows) fill the
// SMs once, else mma.sync's 24- or 32-token tiles with K split (8 warps from 64 rows: measured
// local28 T = 128 636 us against 704 with 4). The wgmma kernel runs 2 consumer warpgroups of 2
// m64 tiles, except GEMM1 in `Mxfp8` mode: 4 of 1, for its epilogue (group amax, E4M3 rounding)
// needs the registers and hides its latency (measured local28 T = 4096 mxfp8 11.78 -> 9.90 ms; 2 of
// 2 against 4 of 1: 9.0 against 7.5 ms in Session 20, 7.8 against 7.4 with Session 21's rolled
// epilogue, which only ep16 T = 8192 ran faster on 2 of 2, by 2 %; a16 equal at 4096 and up to 6 %
// slower at T = 32..128 with 4); on 2 consumer warpgroups each unit's wgmmas are only as wide as
// its tile's rows (an expert's last tile's remainder; every T since Session 22). The split cost
// model: heuristics.cpp.
// `forced_kernel` and `forced_tile` (PlanOptions) fix either; the rest is chosen for them.
KernelChoice choose_kernels(const MoeConfig& config, ExpertParallel ep, int tokens, int sm_count,
                            GemmKernel forced_kernel = GemmKernel::Auto, int forced_tile = 0, Mode mode = Mode::A16);

}  // namespace k3moe
