#include "runtime/heuristics.h"

#include "kernels/activation.cuh"
#include "kernels/combine.cuh"

#include <algorithm>

#include "k3moe/error.h"
#include "runtime/cuda_check.h"
#include <cmath>
#include <cstdio>

namespace k3moe {
namespace {

// Memory bandwidth per SM up to which 128-row units from a wave on pay (choose_kernels): between
// an H100 SXM's 25 GB/s and an H200's 36.
constexpr double kHalfUnitsUpToBytesPerSmS = 30e9;

// Persistent CTAs take units (token tile x 256 weight rows x K range) from a counter, and the
// copy pipeline runs on across units, so the time of a GEMM is about the chunks (128 of K) of
// the most loaded CTA: ceil(units s / ctas) ceil(chunks / s) for s K ranges. The s with the fewest
// such chunks wins; ties and near-ties (within `penalty` chunks per extra range: partial rows
// written, read and summed by a later stage) go to fewer ranges. With `min_waves`, a split (when
// one is allowed) gives at least that many units per CTA: GEMM2's CTAs start behind GEMM1's tail
// (programmatic dependent launch), and the first to start would otherwise take every unit while
// the SMs that free up last idle. From two such waves on, the fewest ranges that give them win:
// with two or more units per CTA the counter evens out the partial wave the count above charges
// (CTAs end their units up to ~10 us apart: per-SM rates differ), while every extra range adds
// units and partial rows (local28 T = 1, GEMM2: 4 ranges 75.6-76.3 / 76.3-76.7 us a16 / mxfp8
// against the count's 5, 77.0-77.9 / 77.8-78.6, four rounds; 6 and 8 in between; EP32 T = 8,
// GEMM1: 9 ranges as fast as the count's 10; 7, with GEMM2's 6, 5 us slower). From four waves of
// units on, K stays whole: balance is within a quarter wave, and the partial rows grow with the
// tokens. Measured on the H200: bench/NOTES.md.
int choose_splits(double units, int chunks, double ctas, int max_splits, double penalty, double min_waves) {
  if (units >= 4.0 * ctas) return 1;
  const int most = std::max(1, std::min(chunks, max_splits));
  if (min_waves >= 2.0) {
    int s = 1;
    while (s < most && units * s < min_waves * ctas) ++s;
    return s;
  }
  int best = 0;
  double best_cost = 0.0;
  for (int s = 1; s <= most; ++s) {
    if (s < most && units * s < min_waves * ctas) continue;
    const double per_cta = std::ceil(units * s / ctas) * std::ceil(double(chunks) / s);
    const double cost = per_cta + penalty * (s - 1);
    if (best == 0 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// The tile of `tokens` on `kernel`, or an error naming what each kernel has.
kernels::TokenTile tile_of(GemmKernel kernel, int tokens) {
  using kernels::TokenTile;
  if (kernel == GemmKernel::Wgmma) {
    K3MOE_CHECK(tokens == 32 || tokens == 64 || tokens == 96 || tokens == 128,
                "the wgmma kernel takes token tiles of 32, 64, 96 or 128, got ", tokens);
    return tokens == 32   ? TokenTile::Wg32
           : tokens == 64 ? TokenTile::Wg64
           : tokens == 96 ? TokenTile::Wg96
                          : TokenTile::Wg128;
  }
  const bool wgmma_only = tokens == 64 || tokens == 96 || tokens == 128;
  K3MOE_CHECK(tokens == 8 || tokens == 16 || tokens == 24 || tokens == 32 || (kernel == GemmKernel::Auto && wgmma_only),
              "the mma.sync kernels take token tiles of 8, 16, 24 or 32 (wgmma: 32, 64, 96, 128), got ", tokens);
  if (tokens > 32) return tile_of(GemmKernel::Wgmma, tokens);
  return tokens == 8 ? TokenTile::T8 : tokens == 16 ? TokenTile::T16 : tokens == 24 ? TokenTile::T24 : TokenTile::T32;
}

}  // namespace

GpuTraits GpuTraits::of_device(int device) {
  GpuTraits g;
  int clock_khz = 0, bus_bits = 0;
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&g.sm_count, cudaDevAttrMultiProcessorCount, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  g.memory_bytes_per_s = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  return g;
}

KernelChoice choose_kernels(const MoeConfig& c, ExpertParallel ep, int tokens, const GpuTraits& gpu, GemmKernel forced_kernel,
                            int forced_tile) {
  K3MOE_CHECK(forced_kernel == GemmKernel::Auto || forced_kernel == GemmKernel::MmaSync ||
                  forced_kernel == GemmKernel::Wgmma,
              "gemm_kernel must be Auto, MmaSync or Wgmma, got ", int(forced_kernel));
  KernelChoice k;
  const double local = ep.num_local(c.num_experts);
  k.expected_rows_per_expert = double(tokens) * c.top_k / c.num_experts;
  k.expected_active_experts = local * (1.0 - std::pow(1.0 - double(c.top_k) / c.num_experts, tokens));
  const double rows = k.expected_rows_per_expert;
  const int wgmma_tokens = rows <= 32.0 ? 32 : rows <= 64.0 ? 64 : rows <= 96.0 ? 96 : 128;
  // GEMM2's units (fewer row groups than GEMM1's) against one CTA per SM.
  const double wgmma_units = k.expected_active_experts * std::max(1.0, std::ceil(rows / wgmma_tokens)) *
                             std::ceil(double(c.hidden) / kernels::kGemmRowsPerCta);
  // NOTE: up to ~20 rows per expert the mma.sync kernel's 24-token tiles (3 CTAs per SM) beat the
  // wgmma kernel's 32 (measured local28 a16 / mxfp8: T = 32, 18.3 rows, 206.5 / 216.2 us against
  // 216.0 / 232.2); at 22.9 rows (T = 40) a third of the experts need a second tile and wgmma wins
  // (218-220 / 235-236 against 250 / 258-261); at 13.7 rows 16-token tiles win (bench/NOTES.md,
  // Session 15).
  const int sm_count = gpu.sm_count;
  const bool wgmma = forced_kernel == GemmKernel::Wgmma ||
                     (forced_kernel == GemmKernel::Auto && rows > 20.0 && wgmma_units >= sm_count);
  if (forced_tile != 0) {
    k.token_tile = tile_of(forced_kernel, forced_tile);
  } else if (wgmma) {
    k.token_tile = tile_of(GemmKernel::Wgmma, wgmma_tokens);
  } else {
    k.token_tile = tile_of(GemmKernel::MmaSync, rows <= 8.0 ? 8 : rows <= 16.0 ? 16 : rows <= 24.0 ? 24 : 32);
  }
  k.weights_once = rows <= kernels::tile_tokens(k.token_tile);
  if (kernels::tile_uses_wgmma(k.token_tile)) {  // K whole
    // NOTE: 2 consumer warpgroups in both GEMMs and modes. GEMM1 rounds to MXFP8 in its epilogue
    // warpgroup (staged); 4 consumer warpgroups that rounded in their own epilogue (one m64 tile
    // each, one unit width) lost at every T once that warpgroup took 8 outputs per thread (mxfp8
    // local28 T = 1024 / 4096 / 16384: 1832 / 7364 / 29246 us on 4 against 1680 / 6920 / 27399;
    // bench/NOTES.md, Sessions 34 and 35). GEMM2 has no MXFP8 rounding.
    k.gemm1_warps = 8;
    k.gemm2_warps = 8;
    // NOTE: on 2 consumer warpgroups an expert's last, partial tile runs narrower wgmmas (the
    // kernel's unit widths), at every T since the epilogues became rolled loops (against the tile's
    // width, local28 a16: T = 2048 -3..-5 %, 4096 -1.4 %, 8192 -1.6 %, 16384 -1.1 %; bench/NOTES.md,
    // Session 22).
    return k;
  }
  if (k.token_tile == kernels::TokenTile::T32 && rows >= 64.0) k.gemm1_warps = k.gemm2_warps = 8;
  const double tile_rows = kernels::tile_tokens(k.token_tile);
  const double tiles = k.expected_active_experts * std::max(1.0, std::ceil(rows / tile_rows));
  const double target = double(sm_count) * kernels::gemm_ctas_per_sm(k.token_tile);
  const int rows_per_cta = kernels::kGemmRowsPerCta;
  // NOTE: GEMM1's ranges add the activation stage and 2I fp32 per row and range. From 2 waves of
  // units K stays whole (measured: ep16 T = 256, 3.4 waves, 276.9 us against 283.1 with two ranges);
  // from 1.5 to 2 waves two ranges halve the second wave's tail (local28 T = 8, 1.7 waves: (2, 2)
  // 136.5-137.1 / 135.7-137.2 us a16 / mxfp8 against K whole (1, 3) 138.5-138.9 / 138.7-139.5,
  // three rounds, Session 15; the cost model would pick 4 ranges there, measured worse in Session
  // 13); below, ranges shorten the tail, which late units run on SMs that other CTAs have left: the
  // cost model picks them (ep32 T = 64, 1.2 waves: 4 ranges 96.7-96.9 / 109.9-110.0 us, 2 ranges
  // 100.5-100.8 / 115.0-115.2, K whole 111 / 133; bench/NOTES.md, Sessions 10-11).
  const double units1 = tiles * std::ceil(2.0 * c.intermediate / rows_per_cta);
  const int chunks1 = c.hidden / kernels::kGemmChunkK;
  // Below half a wave, two units per CTA at least, as GEMM2 (ep32 T = 8, 90 units: 9 ranges; 10
  // ran 42.6 / 44.8 us a16 / mxfp8 against 45.8 / 48.3 with 4, and 9 as fast as 10; bench/NOTES.md,
  // Sessions 10 and 26).
  k.gemm1_splits = units1 >= 2.0 * target   ? 1
                   : units1 >= 1.5 * target ? std::min(2, chunks1)
                                            : choose_splits(units1, chunks1, target, kernels::kMaxActivationSplits, 1.5,
                                                            units1 < 0.5 * target ? 2.0 : 0.0);
  // NOTE: three 8-token CTAs (72-77 registers x 160 threads each) leave 27 K registers of an SM, room
  // for one 256-thread activation CTA (72 registers; two of the 2-split kernel's 40, see
  // activation_ctas_beside_gemm1), so GEMM2 can start in GEMM1's tail; the 16-
  // and 24-token CTAs leave less, and released early there GEMM2 waited as before while the stage
  // ran one CTA per SM (local28 T = 16 / 32 +5 / +4 %). Measured released early, a16 / mxfp8 us:
  // local28 T = 8 137.7-138.7 / 140.4-141.0 -> 135.2-135.9 / 139.3, ep32 T = 64 90.5-91.9 /
  // 102.9-103.5 -> 87.7-87.8 / 101.1-101.3, ep32 T = 8 40.9-41.3 / 42.2-42.3 -> 39.3 / 40.0-40.3
  // (bench/NOTES.md, Session 16).
  k.activation_beside_gemm1 = k.gemm1_splits > 1 && k.token_tile == kernels::TokenTile::T8;
  // GEMM2's CTAs start behind GEMM1's tail (two waves of units at least, see choose_splits), or,
  // when GEMM1 splits K, from one wave (local28 T = 8's (2, 2) above against (2, 3) 137.8-138.5 /
  // 138.7-139.0 with GEMM2 behind the activation stage; (2, 2) still best with GEMM2 released in
  // GEMM1's tail, Session 16).
  k.gemm2_splits = choose_splits(tiles * std::ceil(double(c.hidden) / rows_per_cta),
                                 c.intermediate / kernels::kGemmChunkK, target, kernels::kMaxCombineSplits, 0.25,
                                 k.gemm1_splits > 1 ? 1.0 : 2.0);
  // NOTE: 128-row units (8- and 16-token tiles; K a multiple of 256, streamed in chunks of 256) at
  // the K ranges chosen above: twice the units, each half as long. 8-token tiles: GEMM1 from a wave
  // of 256-row units on, both GEMMs below a quarter wave (a few experts). Measured on H100s, same
  // runs, 256 -> 128 rows, a16 / mxfp8 us: GEMM1 local28 T = 8 181.3 / 181.7 -> 175.1 / 175.8, ep16 T = 256 349.7 / 350.0
  // -> 336.6 / 337.2, ep32 T = 64 116.0 -> 115.4 / 115.3; local28 T = 1 (0.97 waves) 103.8 / 104.1
  // -> 103.5 / 104.3; both GEMMs ep32 T = 1 23.9 / 24.7 -> 22.5 / 22.8, ep32 T = 8 39.7 / 39.9 ->
  // 39.5 / 39.4 (GEMM1's alone there +0.8 / +0.2 us); GEMM2's beside GEMM1's from a wave: local28
  // T = 1 and 8 +1..+2 us (bench/NOTES.md, Session 53). With 16-token tiles (two stages per CTA)
  // both GEMMs from a wave: local28 T = 16 / 24 a16 194.4-196.5 / 207.7-209.7 us -> GEMM1's
  // 188.3-188.9 / 203.4-204.4, both 184.3-185.2 / 199.3-201.2 (H100s, Session 54); under sustained
  // load at the power cap they ran 3-4 % slower in a16 (the protocol times bursts; PlanOptions can
  // force 256 rows).
  // From a wave on, only where each SM gets at most an H100's share of memory bandwidth (H100 SXM:
  // 3.35 TB/s over 132 SMs, 25 GB/s each). On an H200 (4.8 TB/s, 36 GB/s each) 256-row units there
  // were faster, and 128-row ones below a quarter wave still were; same run, 3 rounds, main's rule
  // -> 256 rows from a wave, a16 / mxfp8 us: local28 T = 8 131.0-131.3 / 130.8-131.7 -> 129.3-129.8 /
  // 130.1-131.0, T = 16 167.0-168.3 / 167.4-168.3 -> 154.8-156.0 / 155.2-155.9, ep16 T = 256
  // 252.1-253.8 / 254.9-256.9 -> 245.7-246.3 / 247.0-247.5, ep32 T = 64 88.0-88.1 / 88.1-88.5 ->
  // 87.2-87.6 / 87.3-87.4; 256 rows at ep32 T = 8 too: 36.0-36.2 / 36.2-36.6 -> 36.8-36.9 / 37.5-37.7
  // (bench/NOTES.md, Session 63).
  const bool halves_pay = gpu.memory_bytes_per_s <= kHalfUnitsUpToBytesPerSmS * gpu.sm_count;
  const bool few_units = units1 < 0.25 * target;
  const bool tile8 = k.token_tile == kernels::TokenTile::T8, tile16 = k.token_tile == kernels::TokenTile::T16;
  const int half = kernels::kGemmHalfUnitRows;
  if ((tile8 && few_units) || (halves_pay && (tile8 || tile16) && units1 >= target)) {
    if (c.hidden % kernels::unit_chunk_k(half) == 0) k.gemm1_unit_rows = half;
    if ((few_units || tile16) && c.intermediate % kernels::unit_chunk_k(half) == 0) k.gemm2_unit_rows = half;
    k.gemm1_splits = std::min(k.gemm1_splits, c.hidden / kernels::unit_chunk_k(k.gemm1_unit_rows));
    k.gemm2_splits = std::min(k.gemm2_splits, c.intermediate / kernels::unit_chunk_k(k.gemm2_unit_rows));
    k.activation_beside_gemm1 = tile8 && k.gemm1_splits > 1;
  }
  return k;
}

std::string KernelChoice::describe() const {
  char buf[512];
  if (kernels::tile_uses_wgmma(token_tile)) {
    const int n = kernels::tile_tokens(token_tile);
    std::snprintf(buf, sizeof buf,
                  "expert GEMMs: wgmma bf16 m64n%dk16, persistent CTAs (1 producer + %d consumer warpgroups in GEMM1, "
                  "%d in GEMM2; GEMM1's activation stored by an epilogue warpgroup, but for A16 at 128 tokens) over units "
                  "of 256 weight rows x %d tokens (wgmma N: the tile's rows rounded up), K whole%s; GEMM2 takes units in "
                  "order, "
                  "each once GEMM1 has stored its token tile (expected %.1f active experts, %.1f rows each)",
                  n, gemm1_warps / 4, gemm2_warps / 4, n,
                  weights_once ? ", weights read once (L2 evict_first)" : "",
                  expected_active_experts, expected_rows_per_expert);
    return buf;
  }
  std::snprintf(buf, sizeof buf,
                "expert GEMMs: mma.sync bf16 m16n8k16, persistent CTAs of %d warps over units of %d (GEMM1) and %d "
                "(GEMM2) weight rows x %d tokens; K split %d (GEMM1) and %d (GEMM2)%s (expected %.1f active experts, "
                "%.1f rows each)",
                gemm1_warps, gemm1_unit_rows, gemm2_unit_rows, kernels::tile_tokens(token_tile), gemm1_splits,
                gemm2_splits,
                activation_beside_gemm1 ? ", GEMM2 released in GEMM1's tail" : "", expected_active_experts,
                expected_rows_per_expert);
  return buf;
}

KernelChoice kernel_choice(const PlanOptions& o, int64_t tokens, const GpuTraits& gpu) {
  KernelChoice k = choose_kernels(o.config, o.ep, int(tokens), gpu, o.gemm_kernel, o.token_tile);
  if (kernels::tile_uses_wgmma(k.token_tile)) return k;
  // 128-row units where the tile and K allow them.
  const auto unit_rows = [&](int forced, int chosen, int K) {
    if (forced == 0) return chosen;
    return forced == kernels::kGemmHalfUnitRows && kernels::tile_takes_half_units(k.token_tile) &&
                   K % kernels::unit_chunk_k(forced) == 0
               ? forced
               : kernels::kGemmRowsPerCta;
  };
  k.gemm1_unit_rows = unit_rows(o.gemm1_unit_rows, k.gemm1_unit_rows, o.config.hidden);
  k.gemm2_unit_rows = unit_rows(o.gemm2_unit_rows, k.gemm2_unit_rows, o.config.intermediate);
  const int chunks1 = o.config.hidden / kernels::unit_chunk_k(k.gemm1_unit_rows);
  const int chunks2 = o.config.intermediate / kernels::unit_chunk_k(k.gemm2_unit_rows);
  k.gemm1_splits = std::min(k.gemm1_splits, chunks1);
  k.gemm2_splits = std::min(k.gemm2_splits, chunks2);
  if (o.gemm1_splits > 0) k.gemm1_splits = std::min({o.gemm1_splits, chunks1, kernels::kMaxActivationSplits});
  if (o.gemm2_splits > 0) k.gemm2_splits = std::min({o.gemm2_splits, chunks2, kernels::kMaxCombineSplits});
  return k;
}

}  // namespace k3moe
