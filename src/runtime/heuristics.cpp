#include "runtime/heuristics.h"

#include "kernels/activation.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace k3moe {
namespace {

// No split while the units fill the resident CTAs: a unit restarts the cp.async pipeline, so more,
// shorter units cost more than they balance. Below that, the smallest divisor d of `chunks`
// (leaving >= 3 chunks per split, so the pipeline fills) with units * d >= target, or the largest
// such divisor when none reaches it. Measured on the H200 (bench/NOTES.md), splits 1 / 2 / 4:
// local28 T=1 114 / 107 / 124 us; T=8 167 / 171 / 188 us; ep32 T=8 108 / 55 / 39 us.
int choose_splits(double units, int chunks, double target) {
  if (units >= target) return 1;
  int best = 1;
  for (int d = 1; d <= std::min(chunks / 3, kernels::kMaxActivationSplits); ++d) {
    if (chunks % d) continue;
    best = d;
    if (units * d >= target) break;
  }
  return best;
}

}  // namespace

KernelChoice choose_kernels(const MoeConfig& c, ExpertParallel ep, int tokens, int sm_count) {
  KernelChoice k;
  const double local = ep.num_local(c.num_experts);
  k.expected_rows_per_expert = double(tokens) * c.top_k / c.num_experts;
  k.expected_active_experts = local * (1.0 - std::pow(1.0 - double(c.top_k) / c.num_experts, tokens));
  const double rows = k.expected_rows_per_expert;
  k.token_tile = rows <= 8.0 ? kernels::TokenTile::T8 : rows <= 16.0 ? kernels::TokenTile::T16
                                                                     : kernels::TokenTile::T32;
  const double tile_rows = 8.0 * int(k.token_tile);
  const double tiles = k.expected_active_experts * std::max(1.0, std::ceil(rows / tile_rows));
  const double target = double(sm_count) * kernels::gemm_ctas_per_sm(k.token_tile);
  const int rows_per_cta = kernels::kGemmRowsPerCta;
  k.gemm1_splits = choose_splits(tiles * std::ceil(2.0 * c.intermediate / rows_per_cta),
                                 c.hidden / kernels::kGemmChunkK, target);
  k.gemm2_splits = choose_splits(tiles * std::ceil(double(c.hidden) / rows_per_cta),
                                 c.intermediate / kernels::kGemmChunkK, target);
  return k;
}

std::string KernelChoice::describe() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "expert GEMMs: mma.sync bf16 m16n8k16, persistent CTAs over units of 256 weight rows x %d tokens; "
                "K split %d (GEMM1) and %d (GEMM2) (expected %.1f active experts, %.1f rows each)",
                8 * int(token_tile), gemm1_splits, gemm2_splits, expected_active_experts, expected_rows_per_expert);
  return buf;
}

}  // namespace k3moe
