// Expert-parallel mapping and permutation: global ids [T, K] -> this rank's token lists.
// Slot (t, k) is local when first_expert <= id < first_expert + num_local; every other value
// (-1, another rank's expert, garbage) is skipped without being used as an index.
// Rows of expert e are [expert_offset[e], expert_offset[e + 1]), ordered by (t, k): the order is
// fixed by the input alone (no atomics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/stage_times.h"
#include "kernels/quantize_mxfp8.cuh"

namespace k3moe::kernels {

inline constexpr int kPermuteMaxLocalExperts = 1024;

struct PermuteArgs {
  const int32_t* ids = nullptr;  // [T, K]
  int tokens = 0, top_k = 0;
  int first_expert = 0, num_local = 0;
  int32_t* expert_offset = nullptr;  // [num_local + 1]
  int32_t* row_token = nullptr;      // [T K]: token of each row (the first expert_offset[num_local])
  int32_t* slot_row = nullptr;       // [T K]: row of each slot, -1 if the slot is not local
  // The expert GEMMs' schedule (expert_gemm.cuh) for token tiles of `tile_rows` rows: every
  // token tile of every expert with rows, by expert, as {local expert, first row, rows, 0} (the
  // wgmma GEMM1 counts the tile's stored units from that 0: expert_gemm.cuh).
  int tile_rows = 8;
  int4* tile_info = nullptr;   // [max_tiles(T K, num_local, tile_rows)]
  int32_t* num_tiles = nullptr;  // [1]
  int* unit_counters = nullptr;  // [2] the GEMMs' unit counters, zeroed here
  // Independent work that rides in the same launch on blocks 1.. (the permutation is one block):
  // the forward's MXFP8 rounding of x, so that the GEMMs wait for one kernel, not two.
  Mxfp8Rounding rounding;
  // The large permutation's scratch: per (block, expert) counts, then first rows
  // [kPermuteLargeBlocks][num_local] (permute_scratch_bytes).
  int32_t* block_rows = nullptr;
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

inline constexpr int kPermuteLargeBlocks = 32;
inline int64_t permute_scratch_bytes(int num_local) { return int64_t(kPermuteLargeBlocks) * num_local * 4; }

// The most token tiles T K rows can make: each expert's last tile may be partial.
inline int64_t max_tiles(int64_t rows, int num_local, int tile_rows) { return rows / tile_rows + num_local; }

// Auto: one warp up to 128 slots, one block with ranks in registers up to 4096, else the large
// one (three launches over kPermuteLargeBlocks blocks); the others force a kernel (tests; Warp
// takes up to 512 slots, Block up to 8192).
enum class PermuteKernel { Auto, Warp, Block, Large };
void launch_permute(const PermuteArgs& args, cudaStream_t stream, PermuteKernel kernel = PermuteKernel::Auto);
// Raises the kernel's shared-memory limit on the current device; once per device, before launches.
void configure_permute_kernel();

}  // namespace k3moe::kernels
