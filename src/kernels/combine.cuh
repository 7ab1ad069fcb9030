// Combine: out[t] = sum over slots k of w[t, k] * y[row(t, k)] in fp32, added in a fixed pairwise
// order, stored bf16, where y is the sum of GEMM2's K splits in split order. Slots without a local
// row add nothing; a token without any gets zeros. No atomics, so the result is bitwise
// reproducible.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/stage_times.h"

namespace k3moe::kernels {

inline constexpr int kMaxCombineSplits = 8;  // GEMM2 K splits the combine sums
// From this many tokens, one thread per 4 outputs (instead of a lane group): the same bits. At 64
// tokens the threads fill the SMs (measured on the H200: ep32 T = 64 96 -> 88 us, ep16 T = 128
// 181 -> 167, local28 T = 64 and 128 equal; local28 T = 32 is 7 us slower by threads).
inline constexpr int kCombineThreadPerOutputsFrom = 64;
// From this many tokens of a rank whose slots are mostly remote, warps per token (TokenWarps): the
// thread-per-outputs threads waited on one load each there (ep16 T = 8192: 149 -> 91 us; with every
// slot local it is 8 % slower at T = 1024; bench/NOTES.md, Session 19).
inline constexpr int kCombineTokenWarpsFrom = 1024;
enum class CombineMapping { Auto, LaneGroups, ThreadPerOutputs, TokenWarps };

struct CombineArgs {
  const float* y = nullptr;           // [splits][rows, H]
  int64_t split_stride = 0;           // elements between splits
  int splits = 1;
  const int32_t* slot_row = nullptr;  // [T, K]
  const float* weights = nullptr;     // [T, K]
  uint16_t* out = nullptr;            // [T, H] bf16
  int tokens = 0, top_k = 0, hidden = 0;
  CombineMapping mapping = CombineMapping::Auto;  // a test forces each
  bool mostly_remote = false;  // the rank holds at most an eighth of the experts (expert parallelism)
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

void launch_combine(const CombineArgs& args, cudaStream_t stream);

}  // namespace k3moe::kernels
