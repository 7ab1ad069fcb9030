// The kernel-choice heuristic (src/runtime/heuristics.cpp): a host function of the shape alone,
// so these tests run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "expect_error.h"
#include "k3moe/error.h"
#include "kernels/activation.cuh"
#include "kernels/combine.cuh"
#include "runtime/heuristics.h"
#include "validation/validation.h"

namespace k3moe {
namespace {

// Memory clock x bus width x 2, as GpuTraits::of_device counts it.
constexpr GpuTraits kH100{132, 2.0 * 2619e6 * 5120 / 8};  // H100 SXM: 3.35 TB/s
constexpr GpuTraits kH200{132, 4.8143e12};                  // H200, as `bench --explain` printed it

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
        const KernelChoice k = choose_kernels(c, ep, t, kH100);
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
  const KernelChoice one = choose_kernels(c, ExpertParallel{1, 0}, 1, kH100);
  EXPECT_EQ(one.token_tile, kernels::TokenTile::T8);
  EXPECT_EQ(one.gemm1_warps, 4);
  EXPECT_EQ(one.gemm2_warps, 4);
  EXPECT_EQ(one.gemm1_splits, 1);
  EXPECT_GE(one.gemm2_splits * 16 * 14, 2 * 396);
  // The fewest ranges that give two waves of units (measured against the chunk count's 5; the
  // comment of choose_splits).
  EXPECT_EQ(one.gemm2_splits, 4);
  // GEMM1's K: whole from 2 waves of units (EP16 T = 256: 55 experts, 3.4 waves), two ranges from
  // 1.5 (T = 8: 27.5 expected experts x 24 units, 1.7 waves; GEMM2 then from one wave: 2 ranges),
  // the cost model's ranges below (EP32 T = 64: 19 experts, 1.2 waves: 4 ranges of 7 chunks, 5 per
  // CTA at most, against 2 x 28 whole or 3 x 14 in two).
  const KernelChoice eight = choose_kernels(c, ExpertParallel{1, 0}, 8, kH100);
  EXPECT_EQ(eight.gemm1_splits, 2);
  EXPECT_EQ(eight.gemm2_splits, 2);
  // GEMM2 is released in GEMM1's tail where the activation stage fits beside the 8-token GEMM1
  // (stage test ActivationStage.ItsCtasFitBesideThreeEightTokenGemm1Ctas); K whole has no stage.
  EXPECT_TRUE(eight.activation_beside_gemm1);
  EXPECT_FALSE(one.activation_beside_gemm1);
  EXPECT_TRUE(choose_kernels(MoeConfig::kimi_k3(), ExpertParallel{32, 0}, 64, kH100).activation_beside_gemm1);
  EXPECT_FALSE(choose_kernels(c, ExpertParallel{1, 0}, 16, kH100).activation_beside_gemm1);  // 16-token tiles
  EXPECT_FALSE(choose_kernels(c, ExpertParallel{1, 0}, 32, kH100).activation_beside_gemm1);  // 24-token tiles
  EXPECT_EQ(choose_kernels(MoeConfig::kimi_k3(), ExpertParallel{16, 0}, 256, kH100).gemm1_splits, 1);
  EXPECT_EQ(choose_kernels(MoeConfig::kimi_k3(), ExpertParallel{32, 0}, 64, kH100).gemm1_splits, 4);
  // Below half a wave (EP32 T = 8: 3.8 experts x 24 = 90.5 units), the fewest ranges that give
  // two units per CTA.
  const KernelChoice few = choose_kernels(MoeConfig::kimi_k3(), ExpertParallel{32, 0}, 8, kH100);
  EXPECT_GE(90 * few.gemm1_splits, 2 * 396);
  EXPECT_EQ(few.gemm1_splits, 9);
  // Prefill: the wgmma kernel, K whole, with the smallest tile that holds an expert's rows.
  const KernelChoice big = choose_kernels(c, ExpertParallel{1, 0}, 4096, kH100);
  EXPECT_EQ(big.token_tile, kernels::TokenTile::Wg128);
  EXPECT_EQ(big.gemm1_splits, 1);
  EXPECT_EQ(big.gemm2_splits, 1);
  EXPECT_EQ(big.gemm1_warps, 8);  // 2 consumer warpgroups of 2 m64 tiles
  EXPECT_EQ(big.gemm2_warps, 8);
  // 2 consumer warpgroups at every T (MXFP8's rounding runs in GEMM1's epilogue warpgroup).
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 16384, kH100).gemm1_warps, 8);
  const KernelChoice mid = choose_kernels(c, ExpertParallel{1, 0}, 128, kH100);
  EXPECT_EQ(mid.token_tile, kernels::TokenTile::Wg96);
  EXPECT_EQ(mid.gemm1_warps, 8);
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 128, kH100).token_tile, kernels::TokenTile::Wg96);  // 73 rows
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100).token_tile, kernels::TokenTile::Wg64);   // 37 rows
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 40, kH100).token_tile, kernels::TokenTile::Wg32);   // 23 rows
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 32, kH100).token_tile, kernels::TokenTile::T24);    // 18 rows
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 16, kH100).token_tile, kernels::TokenTile::T16);    // 9 rows
  // The weights stream with evict_first where an expert's rows fit one tile; at T = 4096 every
  // expert's weights feed ~18 tiles, which share them through L2.
  EXPECT_TRUE(choose_kernels(c, ExpertParallel{1, 0}, 32, kH100).weights_once);
  EXPECT_TRUE(choose_kernels(c, ExpertParallel{1, 0}, 128, kH100).weights_once);
  EXPECT_FALSE(choose_kernels(c, ExpertParallel{1, 0}, 512, kH100).weights_once);
  EXPECT_FALSE(big.weights_once);
  // Forced: a tile alone picks the kernel that has it; the rest follows.
  const KernelChoice forced = choose_kernels(c, ExpertParallel{1, 0}, 4096, kH100, GemmKernel::Auto, 32);
  EXPECT_EQ(forced.token_tile, kernels::TokenTile::T32);
  EXPECT_EQ(forced.gemm1_warps, 8);
  EXPECT_EQ(forced.gemm2_warps, 8);
  EXPECT_EQ(forced.gemm1_splits, 1);
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 4096, kH100, GemmKernel::Wgmma, 32).token_tile,
            kernels::TokenTile::Wg32);
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 4096, kH100, GemmKernel::MmaSync).token_tile,
            kernels::TokenTile::T32);
}

TEST(Heuristics, FewExpertsStayOnTheSplittingKernel) {
  // EP32 rank, T = 1280: 23 rows on each of 28 experts fill the SMs with wgmma units; the same
  // rows on 2 experts (a reduced rank) would not, and go to mma.sync with K split.
  MoeConfig c = MoeConfig::kimi_k3();
  EXPECT_TRUE(kernels::tile_uses_wgmma(choose_kernels(c, ExpertParallel{32, 0}, 1280, kH100).token_tile));
  MoeConfig few = c;
  few.num_experts = 64;
  const KernelChoice k = choose_kernels(few, ExpertParallel{32, 0}, 90, kH100);  // 2 local experts, 22.5 rows each
  EXPECT_EQ(k.token_tile, kernels::TokenTile::T24);
  EXPECT_EQ(choose_kernels(few, ExpertParallel{32, 0}, 120, kH100).token_tile, kernels::TokenTile::T32);  // 30 rows
  EXPECT_GT(k.gemm1_splits * k.gemm2_splits, 1);
}

TEST(Heuristics, ForcedTileMustBeOneTheKernelsHave) {
  MoeConfig c = MoeConfig::kimi_k3();
  EXPECT_THROW(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::Auto, 48), Error);
  EXPECT_THROW(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::MmaSync, 64), Error);
  EXPECT_THROW(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::Wgmma, 16), Error);
  // 24 tokens: an mma.sync tile only.
  EXPECT_THROW(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::Wgmma, 24), Error);
  // A kernel value outside the enum is an error, not the mma.sync kernel.
  for (int tile : {0, 24})
    testing::expect_error([&] { choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel(5), tile); },
                          {"gemm_kernel must be Auto, MmaSync or Wgmma, got 5"});
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::MmaSync, 24).token_tile,
            kernels::TokenTile::T24);
  EXPECT_EQ(choose_kernels(c, ExpertParallel{1, 0}, 64, kH100, GemmKernel::Auto, 24).token_tile, kernels::TokenTile::T24);
}

// 128-row units where measured faster (heuristics.cpp), with K a multiple of 256: at 8-token tiles
// GEMM1's from a wave of 256-row units on, both GEMMs' below a quarter wave; at 16-token tiles both
// GEMMs' from a wave.
TEST(Heuristics, HalfUnitsWhereTheyWereMeasuredFaster) {
  const MoeConfig k3 = MoeConfig::kimi_k3();
  MoeConfig local28 = k3;  // the bench's local28: top-16 among 28 experts
  local28.num_experts = 28;
  const auto rows = [&](const MoeConfig& c, ExpertParallel ep, int T) {
    const KernelChoice k = choose_kernels(c, ep, T, kH100);
    return std::pair{k.gemm1_unit_rows, k.gemm2_unit_rows};
  };
  EXPECT_EQ(rows(k3, {32, 0}, 1), std::pair(128, 128)) << "ep32 T = 1: under a quarter wave";
  EXPECT_EQ(rows(local28, {1, 0}, 1), std::pair(256, 256)) << "384 GEMM1 units on 396 CTAs";
  EXPECT_EQ(rows(local28, {1, 0}, 8), std::pair(128, 256));
  EXPECT_EQ(rows(k3, {32, 0}, 8), std::pair(128, 128));
  EXPECT_EQ(rows(k3, {32, 0}, 16), std::pair(256, 256)) << "between a quarter wave and a wave";
  EXPECT_EQ(rows(k3, {32, 0}, 64), std::pair(128, 256));
  EXPECT_EQ(rows(k3, {16, 0}, 256), std::pair(128, 256));
  EXPECT_EQ(rows(local28, {1, 0}, 16), std::pair(128, 128)) << "16-token tiles";
  EXPECT_EQ(rows(local28, {1, 0}, 24), std::pair(128, 128)) << "16-token tiles, 13.7 rows";
  EXPECT_EQ(rows(k3, {32, 0}, 512), std::pair(128, 128)) << "16-token tiles";
  EXPECT_EQ(rows(k3, {64, 0}, 700), std::pair(256, 256)) << "16-token tiles below a wave";
  EXPECT_EQ(rows(local28, {1, 0}, 32), std::pair(256, 256)) << "24-token tiles";
  MoeConfig narrow = k3;
  narrow.hidden = 3584 + 128;
  EXPECT_EQ(choose_kernels(narrow, {32, 0}, 64, kH100).gemm1_unit_rows, 256) << "H % 256 != 0";
  narrow = k3;
  narrow.intermediate = 3072 + 128;
  EXPECT_EQ(rows(narrow, {32, 0}, 8), std::pair(128, 256)) << "I % 256 != 0";
}

// On a GPU with more memory bandwidth per SM than an H100 SXM's (an H200), 256-row units from a
// wave on, 128-row ones below a quarter wave as on an H100; forced ones still apply.
TEST(Heuristics, WholeUnitsFromAWaveWhereEachSmGetsMoreBandwidth) {
  MoeConfig local28 = MoeConfig::kimi_k3();
  local28.num_experts = 28;
  for (const auto& [c, ep, T] : {std::tuple{local28, ExpertParallel{1, 0}, 8}, std::tuple{local28, ExpertParallel{1, 0}, 16},
                                 std::tuple{MoeConfig::kimi_k3(), ExpertParallel{16, 0}, 256},
                                 std::tuple{MoeConfig::kimi_k3(), ExpertParallel{32, 0}, 64}}) {
    SCOPED_TRACE(::testing::Message() << "experts " << c.num_experts << ", EP " << ep.size << ", T = " << T);
    const KernelChoice h100 = choose_kernels(c, ep, T, kH100), h200 = choose_kernels(c, ep, T, kH200);
    EXPECT_EQ(h100.gemm1_unit_rows, 128);
    EXPECT_EQ(h200.gemm1_unit_rows, 256);
    EXPECT_EQ(h200.gemm2_unit_rows, 256);
    EXPECT_EQ(h200.token_tile, h100.token_tile);
  }
  for (const int T : {1, 8}) {  // EP32: a few experts, under a quarter wave
    const KernelChoice h100 = choose_kernels(MoeConfig::kimi_k3(), {32, 0}, T, kH100);
    const KernelChoice h200 = choose_kernels(MoeConfig::kimi_k3(), {32, 0}, T, kH200);
    EXPECT_EQ(std::pair(h200.gemm1_unit_rows, h200.gemm2_unit_rows), std::pair(128, 128)) << "ep32 T = " << T;
    EXPECT_EQ(h200.gemm1_splits, h100.gemm1_splits) << "ep32 T = " << T;
    EXPECT_EQ(h200.gemm2_splits, h100.gemm2_splits) << "ep32 T = " << T;
  }
  PlanOptions o{local28, 64, Mode::A16, Activation::Situ, local28.activation_params, {1, 0}, 0};
  o.gemm1_unit_rows = o.gemm2_unit_rows = kernels::kGemmHalfUnitRows;
  EXPECT_EQ(kernel_choice(o, 8, kH200).gemm1_unit_rows, 128);
  EXPECT_EQ(kernel_choice(o, 8, kH200).gemm2_unit_rows, 128);
  EXPECT_EQ(kernel_choice(o, 8, GpuTraits{132}).gemm1_unit_rows, 128) << "an unknown bandwidth counts as an H100's";
}

// The activation stage drops its partial sums from L2 once read, except beside GEMM1
// (activation.cu). A drop before some lane's read would give that lane indeterminate values, so
// the quick validation matrix (test_validation_matrix.cpp, on a GPU of 132 SMs) must run both
// kernels that drop: the 2-split one and the one for more splits.
TEST(Heuristics, TheQuickMatrixRunsTheActivationKernelsThatDropTheirInput) {
  int two = 0, more = 0;
  for (const validation::Case& c : validation::matrix(true)) {
    if (c.tokens == 0) continue;
    const KernelChoice k = kernel_choice(validation::plan_options(c), c.tokens, kH100);
    if (kernels::tile_uses_wgmma(k.token_tile) || k.activation_beside_gemm1) continue;
    if (k.gemm1_splits == 2) ++two;
    if (k.gemm1_splits > 2) ++more;
  }
  EXPECT_GT(two, 0);
  EXPECT_GT(more, 0);
}

}  // namespace
}  // namespace k3moe
