// Grouped expert GEMMs on MXFP4 weights (kernel layout: expert_layout.cuh), bf16 activations,
// fp32 accumulation. GEMM1 gathers token rows and, with one K split, applies the gated activation
// in its epilogue; GEMM2 reads the intermediate rows in place. Both can split K into ranges that
// write fp32 partial rows (summed, in split order, by the activation and combine stages).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/config.h"
#include "k3moe/stage_times.h"

namespace k3moe::kernels {

// Token tiles a launch can use: 8, 16, 24 or 32 tokens per CTA on the mma.sync kernels (1 to 4
// n-tiles of 8), or 32, 64, 96 or 128 on the wgmma kernel (expert_gemm_wgmma.cu; K whole).
enum class TokenTile { T8, T16, T24, T32, Wg32, Wg64, Wg96, Wg128 };

constexpr int tile_tokens(TokenTile t) {
  constexpr int kTokens[] = {8, 16, 24, 32, 32, 64, 96, 128};
  return kTokens[int(t)];
}
constexpr bool tile_uses_wgmma(TokenTile t) { return t >= TokenTile::Wg32; }
// The wgmma kernels' units per token tile of a GEMM with N output rows (one unit per 256 rows).
constexpr int wgmma_units_per_tile(int N) { return (N + 255) / 256; }

struct ExpertGemmArgs {
  const uint8_t* codes = nullptr;   // [E_local, N/16, K/64, 512]
  const uint8_t* scales = nullptr;  // [E_local, N/16, K/64, 32]
  const uint16_t* act = nullptr;    // bf16 rows of K: GEMM1 x [T, K]; GEMM2 intermediate [rows, K]
  const int32_t* row_token = nullptr;      // GEMM1: row -> token of x; GEMM2: nullptr (row itself)
  // The schedule, written by the permutation for this token tile (permute.cuh): {local expert,
  // first row, rows, 0} per token tile; the wgmma GEMM1 counts its stores of the tile in the fourth
  // field (gemm1_stores_per_tile). The units are (token tile, block of unit_rows weight rows, K
  // split), token tile fastest on mma.sync; on wgmma (K whole) a tile's 256-row blocks are consecutive units.
  int4* tile_info = nullptr;
  const int32_t* num_tiles = nullptr;  // [1]
  int* unit_counter = nullptr;         // zero before the launch; CTAs take units from it
  int num_local = 0;
  int N = 0;  // output rows of W (GEMM1: 2I, GEMM2: H)
  int K = 0;
  int splits = 1;  // K ranges; 1 <= splits <= K / unit_chunk_k(unit_rows)
  int sm_count = 0;
  int64_t act_rows = 0;  // the rows act holds (T; the intermediate's capacity)
  // Weight rows per unit: 256, or 128 with 8- and 16-token tiles (streamed in chunks of 256 of K, so
  // K must be a multiple of 256).
  int unit_rows = 256;
  // Each weight feeds one unit only (every expert's rows fit one token tile): the wgmma kernel then
  // streams the weights with an L2 evict_first policy, as the mma.sync kernels always do.
  bool weights_once = false;
  // The wgmma kernels: GEMM1's consumer warpgroups each add 1 to tile_info[t].w once they stored
  // their rows of a unit of token tile t; GEMM2's CTAs take units in order from unit_counter and
  // start one once its tile's count reaches this (GEMM1's units per tile x consumer warpgroups),
  // without waiting for GEMM1's grid: GEMM1's last, partial wave then overlaps GEMM2. 0: GEMM2
  // waits for GEMM1's grid.
  int gemm1_stores_per_tile = 0;
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

struct GemmOutput {
  // GEMM1 with one split: the activation output [rows, N/2] bf16.
  uint16_t* inter = nullptr;
  Mode mode = Mode::A16;  // A16: bf16(act); Mxfp8: MXFP8(act) per 32 outputs, stored widened
  Activation activation = Activation::Situ;
  ActivationParams params;
  // Otherwise: fp32 rows [splits][rows, N] (GEMM1: [gate | up] in checkpoint order), split s at
  // rows + s * split_stride.
  float* rows = nullptr;
  int64_t split_stride = 0;
};

// Raises the kernels' shared-memory limit on the current device; once per device, before launches.
void configure_expert_gemm_kernels();
// warps: mma.sync: 4, or 8 with TokenTile::T32 (the same CTA rows in 2 m-tiles per warp); wgmma:
// the consumer warps, 8 (2 warpgroups x 2 m64 tiles).
void launch_expert_gemm1(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream);
void launch_expert_gemm2(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream);
// The wgmma kernels (TokenTile::Wg*, `tokens` per tile), called by the two above.
void configure_expert_gemm_wgmma_kernels();
void launch_expert_gemm_wgmma(const ExpertGemmArgs& args, const GemmOutput& out, int tokens, int consumer_warps,
                              bool gemm1, cudaStream_t stream);
// Resident CTAs per SM of a launch (the persistent grid is sm_count times this).
int gemm_ctas_per_sm(TokenTile tile);
// The resources of the mma.sync GEMM1 kernel with K split (partial rows) for `tile` (T8 .. T32,
// 4 warps; units of `unit_rows`), and its dynamic shared memory per CTA.
cudaFuncAttributes expert_gemm1_split_attributes(TokenTile tile, int unit_rows, size_t* dynamic_smem);

// The row-count granularity the kernels need: N a multiple of 16, K of 128.
inline constexpr int kGemmKMultiple = 128;
inline constexpr int kGemmNMultiple = 16;
inline constexpr int kGemmChunkK = 128;
inline constexpr int kGemmRowsPerCta = 256;
inline constexpr int kGemmHalfUnitRows = 128;
// The token tiles whose mma.sync kernels also run 128-row units.
constexpr bool tile_takes_half_units(TokenTile t) {
  return t == TokenTile::T8 || t == TokenTile::T16;
}
// The K a pipeline stage holds for units of `unit_rows` weight rows (the same bytes either way).
constexpr int unit_chunk_k(int unit_rows) { return unit_rows == kGemmHalfUnitRows ? 2 * kGemmChunkK : kGemmChunkK; }
// The wgmma kernels address activation rows by 32-bit offsets in 16-byte pieces (one value marks
// an absent row): a forward's rows (T top_k at GEMM2) times K / 8 must stay below 2^32 - 1.
inline int64_t max_gemm_tokens(int top_k, int hidden, int intermediate) {
  return (int64_t(0xFFFFFFFFu) - 1) / (int64_t(top_k) * (hidden > intermediate ? hidden : intermediate) / 8);
}

}  // namespace k3moe::kernels
