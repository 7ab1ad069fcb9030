// The kernel layout of the weights (src/kernels/expert_layout.cuh) is a bijection, keeps each
// lane's 16 bytes within its block, and puts gate and up of one output in one 16-row block.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kernels/expert_layout.cuh"

namespace k3moe::layout {
namespace {

TEST(ExpertLayout, CodePositionsAreABijectionOntoTheBlockBytes) {
  const int N = 32, K = 128;
  std::vector<int> uses(N * K / 2 * 2, 0);  // (byte, nibble)
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const CodePosition p = code_position(n, k, K);
      ASSERT_GE(p.byte, 0);
      ASSERT_LT(p.byte, N * K / 2);
      ASSERT_TRUE(p.shift == 0 || p.shift == 4);
      ++uses[p.byte * 2 + p.shift / 4];
      // The element lives in its own 16-row x 64-k block.
      EXPECT_EQ(p.byte / kBlockCodeBytes, (n / 16) * (K / 64) + k / 64);
    }
  for (int u : uses) EXPECT_EQ(u, 1);
}

TEST(ExpertLayout, LaneHoldsItsMmaFragment) {
  // Lane t of m16n8k16 holds rows t/4 and t/4+8 at k = 2(t%4), +1, +8, +9 of each 16-wide step.
  const int K = 64;
  for (int n = 0; n < 16; ++n)
    for (int k = 0; k < K; ++k) {
      const int lane = int(code_position(n, k, K).byte % kBlockCodeBytes) / 16;
      EXPECT_EQ(lane / 4, n % 8);
      EXPECT_EQ(lane % 4, (k % 8) / 2);
      EXPECT_EQ(int(code_position(n, k, K).byte % 16) / 4, (k % 64) / 16) << "word = 16-k step";
    }
}

TEST(ExpertLayout, ScalePositionsAreABijection) {
  const int N = 48, K = 192;
  std::set<int64_t> seen;
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < K / 32; ++g) EXPECT_TRUE(seen.insert(scale_position(n, g * 32, K)).second);
  EXPECT_EQ(int64_t(seen.size()), int64_t(N) * K / 32);
  EXPECT_EQ(*seen.rbegin(), int64_t(N) * K / 32 - 1);
}

TEST(ExpertLayout, W13RowOrderPairsGateAndUpInOneBlock) {
  const int I = 64;
  std::set<int> rows;
  for (int r = 0; r < 2 * I; ++r) {
    const int src = w13_checkpoint_row(r, I);
    EXPECT_TRUE(rows.insert(src).second);
    if (r % 16 < 8) {
      EXPECT_LT(src, I) << "first half of a block: gate rows (w1)";
      EXPECT_EQ(w13_checkpoint_row(r + 8, I), src + I) << "its up row (w3) sits 8 rows below";
    }
  }
  EXPECT_EQ(int(rows.size()), 2 * I);
}

TEST(ExpertLayout, ScaleBytesRoundTrip) {
  for (int s = 0; s <= kMaxScale; ++s) EXPECT_EQ(scale_from_kernel(scale_to_kernel(uint8_t(s))), s);
  EXPECT_EQ(scale_to_kernel(kE8M0NaN), kE8M0NaN);
  EXPECT_EQ(scale_to_kernel(0), 126) << "2^-1 = 2^(0 - 1)";
  EXPECT_EQ(scale_to_kernel(128), 254) << "2^127, the largest bf16 power of two";
}

}  // namespace
}  // namespace k3moe::layout
