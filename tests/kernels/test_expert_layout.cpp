// The kernel layout of the weights (src/kernels/expert_layout.cuh) is a bijection, keeps each
// lane's 16 bytes within its block, puts gate and up of one output in one 16-row block, and its
// widening gives every code's value.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "k3moe/formats.h"
#include "kernels/expert_layout.cuh"

namespace k3moe::layout {
namespace {

TEST(ExpertLayout, CodeBitsAreABijectionOntoTheBlockBits) {
  const int K = 256;
  for (const int N : {32, 256, 384, 528}) {  // full and partial groups of 256 rows
    std::vector<int> uses(N * K / 2 * 8, 0);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const CodeBits p = code_bits(n, k, N, K);
        ASSERT_EQ(p.word_byte % 4, 0);
        // The element lives in its own 16-row x 64-k block.
        EXPECT_EQ(p.word_byte / kBlockCodeBytes, block_index(n / 16, k / 64, N, K));
        for (int j = 0; j < 4; ++j) {
          ASSERT_TRUE(p.bit[j] >= 0 && p.bit[j] < 32) << p.bit[j];
          ++uses[p.word_byte * 8 + p.bit[j]];
        }
      }
    for (int u : uses) EXPECT_EQ(u, 1) << "N " << N;
  }
}

TEST(ExpertLayout, AUnitsChunkIsOneRunInWarpOrder) {
  // Row group g, chunk c: blocks (16 g + rb, 2 c + kb) at consecutive indices rb * 2 + kb, from
  // g * 16 * (K / 64) + c * 2 * (row blocks of the group).
  const int N = 384, K = 384;  // groups of 16 and 8 row blocks
  for (int g = 0; g < 2; ++g)
    for (int c = 0; c < K / 128; ++c) {
      const int rbs = group_row_blocks(g, N);
      EXPECT_EQ(rbs, g == 0 ? 16 : 8);
      for (int rb = 0; rb < rbs; ++rb)
        for (int kb = 0; kb < 2; ++kb)
          EXPECT_EQ(block_index(16 * g + rb, 2 * c + kb, N, K), int64_t(g) * 16 * (K / 64) + c * 2 * rbs + rb * 2 + kb);
    }
}

TEST(ExpertLayout, LaneHoldsItsMmaFragment) {
  // Lane t of m16n8k16 holds rows t/4 and t/4+8 at k = 2(t%4), +1, +8, +9 of each 16-wide step.
  const int K = 128;
  for (int n = 0; n < 16; ++n)
    for (int k = 0; k < K; ++k) {
      const CodeBits p = code_bits(n, k, 16, K);
      const int lane = int(p.word_byte % kBlockCodeBytes) / 16;
      EXPECT_EQ(lane / 4, n % 8);
      EXPECT_EQ(lane % 4, (k % 8) / 2);
      EXPECT_EQ(int(p.word_byte % 16) / 4, (k % 64) / 16) << "word = 16-k step";
    }
}

TEST(ExpertLayout, WideningGivesEveryCodeTimesTwoToTheMinus126) {
  // Every code in every slot of a word: the widened bf16 must be e2m1(code) * 2^-126, and the
  // other seven slots must not leak into it.
  for (int slot = 0; slot < 8; ++slot)
    for (int code = 0; code < 16; ++code)
      for (uint32_t background : {0u, 0xFFFFFFFFu}) {
        const int pair = slot / 2, half = slot % 2;
        // Element slot -> (n, k) inside a 16 x 64 block, lane 0, word 0: pair p = (cc/8)*2 + r/8.
        const int n = (pair % 2) * 8, k = (pair / 2) * 8 + half;
        const CodeBits p = code_bits(n, k, 16, 128);
        uint32_t w = background;
        for (int j = 0; j < 4; ++j) w = (w & ~(1u << p.bit[j])) | (uint32_t(code >> j & 1) << p.bit[j]);
        uint32_t pairs[4];
        widen_codes(w, pairs);  // the kernels' own function (expert_layout.cuh)
        const uint32_t bf16x2 = pairs[pair];
        const uint16_t bits = uint16_t(bf16x2 >> (16 * half));
        const float value = bf16_bits_to_float(bits) * 0x1p126f;
        EXPECT_EQ(value, e2m1_to_float(uint8_t(code))) << "slot " << slot << " code " << code;
      }
}

TEST(ExpertLayout, ScaleWordGivesEachRowAndGroupItsMultiplier) {
  // Byte j of a lane's scale word is (row g, k-group 0), (row g + 8, 0), (row g, 1), (row g + 8, 1);
  // the multiplier of its row and group must be the bf16 2^(s - 1), whatever the other bytes hold,
  // and the NaN scale's must be +Inf.
  auto half = [](uint32_t pair, int high) { return uint16_t(pair >> (16 * high)); };
  for (int j = 0; j < 4; ++j)
    for (int s : {0, 1, 2, 100, 126, 127, 128, int(kE8M0NaN)})
      for (uint32_t background : {0x7E7E7E7Eu, 0x80808080u}) {
        const uint32_t word = (background & ~(0xFFu << (8 * j))) | uint32_t(scale_to_kernel(uint8_t(s))) << (8 * j);
        const BlockMultipliers m = scale_multipliers(word);
        const uint16_t bits = half(j % 2 == 0 ? m.row_g : m.row_g8, j / 2);
        const float want = s == kE8M0NaN ? INFINITY : std::ldexp(1.0f, s - 1);
        EXPECT_EQ(bf16_bits_to_float(bits), want) << "byte " << j << " scale " << s;
      }
}

TEST(ExpertLayout, ScalePositionsAreABijection) {
  const int N = 304, K = 256;
  std::set<int64_t> seen;
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < K / 32; ++g) EXPECT_TRUE(seen.insert(scale_position(n, g * 32, N, K)).second);
  EXPECT_EQ(int64_t(seen.size()), int64_t(N) * K / 32);
  EXPECT_EQ(*seen.rbegin(), int64_t(N) * K / 32 - 1);
}

TEST(ExpertLayout, ScaleBytesOfABlockAreInTheDocumentedOrder) {
  // Row group g = r % 8 at bytes 4g..4g+3: (row g, k-group 0), (row g + 8, 0), (row g, 1), (row g + 8, 1).
  const int N = 32, K = 128;
  EXPECT_EQ(scale_position(0, 0, N, K), 0);
  EXPECT_EQ(scale_position(8, 0, N, K), 1);
  EXPECT_EQ(scale_position(0, 32, N, K), 2);
  EXPECT_EQ(scale_position(8, 63, N, K), 3);
  EXPECT_EQ(scale_position(1, 0, N, K), 4);
  EXPECT_EQ(scale_position(15, 40, N, K), 31);
  // The next k-block of the same row block, then the next row block (block_index's order).
  EXPECT_EQ(scale_position(0, 64, N, K), kBlockScaleBytes);
  EXPECT_EQ(scale_position(16, 0, N, K), 2 * kBlockScaleBytes);
}

TEST(ExpertLayout, W13KernelRowsAreTheDocumentedCheckpointRows) {
  // Kernel row r: gate row j = 8 (r / 16) + r % 8 for r % 16 < 8, else up row I + j.
  const int I = 64;
  const int want[][2] = {{0, 0}, {7, 7}, {8, I}, {15, I + 7}, {16, 8}, {23, 15}, {24, I + 8}, {127, I + 63}};
  for (const auto& [kernel_row, checkpoint_row] : want)
    EXPECT_EQ(w13_checkpoint_row(kernel_row, I), checkpoint_row) << "kernel row " << kernel_row;
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
