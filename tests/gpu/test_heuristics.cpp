// The kernel-choice heuristic (src/runtime/heuristics.cpp): a host function of the shape alone,
// so these tests run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "k3moe/error.h"
#include "kernels/activation.cuh"
#include "kernels/combine.cuh"
#include "runtime/heuristics.h"

namespace k3moe {
namespace {

TEST(Heuristics, SplitsStayWithinWhatTheStagesSumAndTheChunks) {
  // Kimi-K3, and narrow layers where a K of one or two chunks bounds the split (every unit must
  // stream at least one chunk).
  MoeConfig narrow = MoeConfig::kimi_k3();
  narrow.hidden = 128;
  narrow.intermediate = 2048;
  narrow.num_experts = 64;
  narrow.top_k = 8;
  MoeConfig narrow_i = narrow;
  narrow_i.hidden = 2048;
  narrow_i.intermediate = 256;
  for (const MoeConfig& c : {MoeConfig::kimi_k3(), narrow, narrow_i})
    for (const ExpertParallel ep : {ExpertParallel{1, 0}, ExpertParallel{16, 3}, ExpertParallel{32, 7}})
      for (int t = 1; t <= 16384; t = t < 64 ? t + 1 : t * 2) {
        const KernelChoice k = choose_kernels(c, ep, t, 132);
        EXPECT_GE(k.gemm1_splits, 1);
        EXPECT_LE(k.gemm1_splits, std::min(kernels::kMaxActivationSplits, c.hidden / 128)) << "H " << c.hidden << " T " << t;
        EXPECT_GE(k.gemm2_splits, 1);
        EXPECT_LE(k.gemm2_splits, std::min(kernels::kMaxCombineSplits, c.intermediate / 128))
            << "I " << c.intermediate << " T " << t;
      }
}

TEST(Heuristics, DecodeSplitsGemm2SoEverySmStreams) {
  // Top-16 of 28 local experts at T = 1: 16 x 24 GEMM1 units fill the 396 resident CTAs once
  // (no split); GEMM2's 16 x 14 units would leave 172 CTAs idle, so its K is split.
  MoeConfig c = MoeConfig::kimi_k3();
  c.num_experts = 28;
  const KernelChoice one = choose_kernels(c, ExpertParallel{1, 0}, 1, 132);
  EXPECT_EQ(one.token_tile, kernels::TokenTile::T8);
  EXPECT_EQ(one.gemm_warps, 4);
  EXPECT_EQ(one.gemm1_splits, 1);
  EXPECT_GE(one.gemm2_splits * 16 * 14, 2 * 396);
  // Prefill: the wgmma kernel, K whole.
  const KernelChoice big = choose_kernels(c, ExpertParallel{1, 0}, 4096, 132);
  EXPECT_EQ(big.token_tile, kernels::TokenTile::T128);
  EXPECT_EQ(big.gemm1_splits, 1);
  EXPECT_EQ(big.gemm2_splits, 1);
  // Between: 32-token mma.sync tiles, 8 warps from 64 rows per expert when forced there.
  const KernelChoice mid = choose_kernels(c, ExpertParallel{1, 0}, 64, 132);
  EXPECT_EQ(mid.token_tile, kernels::TokenTile::T32);
  const KernelChoice forced = choose_kernels(c, ExpertParallel{1, 0}, 4096, 132, 32);
  EXPECT_EQ(forced.token_tile, kernels::TokenTile::T32);
  EXPECT_EQ(forced.gemm_warps, 8);
  EXPECT_EQ(forced.gemm1_splits, 1);
}

TEST(Heuristics, ForcedTileMustBeOneTheKernelsHave) {
  MoeConfig c = MoeConfig::kimi_k3();
  EXPECT_THROW(choose_kernels(c, ExpertParallel{1, 0}, 64, 132, 64), Error);
}

}  // namespace
}  // namespace k3moe
