// Kernel choices of the forward, from the problem's shape alone (host side, no device data).
#pragma once

#include <string>

#include "k3moe/config.h"
#include "k3moe/plan.h"
#include "kernels/expert_gemm.cuh"

namespace k3moe {

// What the choices take from the GPU: its SMs and its memory's peak bandwidth.
struct GpuTraits {
  int sm_count = 0;
  double memory_bytes_per_s = 0.0;  // memory clock x bus width x 2 (0: unknown, taken as an H100's)

  static GpuTraits of_device(int device);
};

struct KernelChoice {
  kernels::TokenTile token_tile = kernels::TokenTile::T8;
  // mma.sync: warps per CTA of both GEMMs (8: 32-token tiles at prefill, 2 m-tiles per warp);
  // wgmma: consumer warps of each GEMM (8: 2 warpgroups, see choose_kernels).
  int gemm1_warps = 4;
  int gemm2_warps = 4;
  int gemm1_splits = 1;  // K ranges of GEMM1 (> 1: partial rows + the activation stage)
  int gemm2_splits = 1;  // K ranges of GEMM2 (summed by the combine)
  // Weight rows per unit of each GEMM (ExpertGemmArgs::unit_rows): 256, or 128 on 8- and 16-token tiles.
  int gemm1_unit_rows = kernels::kGemmRowsPerCta;
  int gemm2_unit_rows = kernels::kGemmRowsPerCta;
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
// m64 tiles in both modes (GEMM1's MXFP8 rounding runs in an epilogue warpgroup beside them; 4
// consumer warpgroups of 1 tile that rounded themselves lost at every T from Session 35), and each
// unit's wgmmas are only as wide as its tile's rows (an expert's last tile's remainder; every T
// since Session 22). No choice depends on the mode. The split cost model: heuristics.cpp.
// `forced_kernel` and `forced_tile` (PlanOptions) fix either; the rest is chosen for them.
KernelChoice choose_kernels(const MoeConfig& config, ExpertParallel ep, int tokens, const GpuTraits& gpu,
                            GemmKernel forced_kernel = GemmKernel::Auto, int forced_tile = 0);
// What a MoePlan of these options runs at `tokens`: the heuristic's choice with the options'
// overrides (forced kernel, tile, K splits) applied.
KernelChoice kernel_choice(const PlanOptions& o, int64_t tokens, const GpuTraits& gpu);

}  // namespace k3moe
