// The fp8 code layout (src/kernels/expert_layout_fp8.cuh): a bijection onto the same blocks as the
// bf16 layout, each lane holding its E4M3 A fragment of mma.m16n8k32 per 32-k step, and the
// widening (table select + sign) giving exactly E4M3(E2M1 x 2^d) for every code and every d the
// fold allows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "k3moe/formats.h"
#include "kernels/expert_layout_fp8.cuh"

namespace k3moe::layout_fp8 {
namespace {

TEST(ExpertLayoutFp8, CodeBitsAreABijectionOntoTheBlockBits) {
  const int K = 256;
  for (const int N : {32, 256, 384, 528}) {
    std::vector<int> uses(N * K / 2 * 8, 0);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const layout::CodeBits p = code_bits(n, k, N, K);
        ASSERT_EQ(p.word_byte % 4, 0);
        EXPECT_EQ(p.word_byte / layout::kBlockCodeBytes, layout::block_index(n / 16, k / 64, N, K));
        for (int j = 0; j < 4; ++j) {
          ASSERT_TRUE(p.bit[j] >= 0 && p.bit[j] < 32) << p.bit[j];
          ++uses[p.word_byte * 8 + p.bit[j]];
        }
      }
    for (int u : uses) EXPECT_EQ(u, 1) << "N " << N;
  }
}

TEST(ExpertLayoutFp8, LaneHoldsItsE4m3Fragment) {
  // Lane t of m16n8k32 (8-bit A) holds rows t/4 and t/4 + 8 at k = 4(t%4) .. +3 and 16 + 4(t%4) .. +3.
  for (int n = 0; n < 16; ++n)
    for (int k = 0; k < 128; ++k) {
      const layout::CodeBits p = code_bits(n, k, 16, 128);
      const int lane = int(p.word_byte % layout::kBlockCodeBytes) / 16;
      const int word = int(p.word_byte % 16) / 4;
      EXPECT_EQ(lane / 4, n % 8);
      EXPECT_EQ(lane % 4, (k % 16) / 4);
      EXPECT_EQ(word, 2 * ((k % 64) / 32) + (k % 32) / 16);
    }
}

TEST(ExpertLayoutFp8, MagnitudeTablesAreExactOverTheFoldRange) {
  for (int d = kFoldMin; d <= kFoldMax; ++d) {
    const uint64_t table = magnitude_table(d);
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(double(e4m3_to_float(uint8_t(table >> (8 * i)))), std::ldexp(double(e2m1_to_float(uint8_t(i))), d))
          << "d " << d << " magnitude " << i;
  }
}

TEST(ExpertLayoutFp8, WideningGivesTheE4m3OfEveryCodeTimesItsRowsScale) {
  const int N = 48, K = 128;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(N * K), bytes(N * K / 2, 0);
  std::vector<int> d(N);
  for (auto& c : codes) c = uint8_t(rng() % 16);
  for (auto& v : d) v = kFoldMin + int(rng() % (kFoldMax - kFoldMin + 1));
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const layout::CodeBits p = code_bits(n, k, N, K);
      for (int j = 0; j < 4; ++j)
        if (codes[n * K + k] >> j & 1) bytes[p.word_byte + p.bit[j] / 8] |= uint8_t(1u << (p.bit[j] % 8));
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const layout::CodeBits p = code_bits(n, k, N, K);
      const uint32_t word = uint32_t(bytes[p.word_byte]) | uint32_t(bytes[p.word_byte + 1]) << 8 |
                            uint32_t(bytes[p.word_byte + 2]) << 16 | uint32_t(bytes[p.word_byte + 3]) << 24;
      const uint64_t table = magnitude_table(d[n]);
      const uint32_t reg = n % 16 < 8 ? widen_low(word, table) : widen_high(word, table);
      const uint8_t got = uint8_t(reg >> (8 * (k % 4)));
      const float want = std::ldexp(e2m1_to_float(codes[n * K + k]), d[n]);
      ASSERT_EQ(got, float_to_e4m3(want)) << "n " << n << " k " << k << " code " << int(codes[n * K + k]);
      ASSERT_EQ(e4m3_to_float(got), want);
    }
}


// Every weight of a packed matrix, as the kernel would widen it, times 2^base.
double unpacked(const Fp8Matrix& m, int n, int k, int N, int K) {
  const layout::CodeBits p = code_bits(n, k, N, K);
  const uint8_t* b = m.codes.data() + p.word_byte;
  const uint32_t word = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  const uint64_t table = table_of_index(m.tables[layout::scale_position(n, k, N, K)]);
  const uint32_t reg = n % 16 < 8 ? widen_low(word, table) : widen_high(word, table);
  return std::ldexp(double(e4m3_to_float(uint8_t(reg >> (8 * (k % 4))))), m.base);
}

TEST(ExpertLayoutFp8, PackedMatrixHoldsEveryWeightExactly) {
  const int N = 64, K = 256;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(N * K), scales(N * K / 32);
  for (auto& c : codes) c = uint8_t(rng() % 16);
  for (auto& s : scales) s = uint8_t(120 + rng() % 15);  // 15 exponents, 14 apart: the widest fold
  scales[5] = kE8M0NaN;
  for (int k = 0; k < 32; ++k) codes[7 * K + k] = (k % 2) * 8;  // row 7, group 0: +-0 only...
  scales[7 * (K / 32)] = 1;                                     // ...under a tiny scale: ignored
  const Fp8Matrix m = pack_matrix(N, K, [&](int n, int k) { return codes[n * K + k]; },
                                  [&](int n, int g) { return scales[n * (K / 32) + g]; });
  EXPECT_TRUE(m.foldable);
  EXPECT_EQ(m.base, 134 - 127 - kFoldMax);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const uint8_t s = scales[n * (K / 32) + k / 32];
      const double want = std::ldexp(double(e2m1_to_float(codes[n * K + k])), int(s) - 127);
      const double got = unpacked(m, n, k, N, K);
      if (s == kE8M0NaN) ASSERT_TRUE(std::isnan(got)) << n << " " << k;
      else ASSERT_EQ(got, want) << "n " << n << " k " << k;
    }
}

TEST(ExpertLayoutFp8, SixteenBinadesOfScalesDoNotFold) {
  const int N = 16, K = 64;
  std::vector<uint8_t> scales(N * K / 32, 127);
  scales[0] = 127 + 15;
  const Fp8Matrix m = pack_matrix(N, K, [](int, int) { return uint8_t(2); },
                                  [&](int n, int g) { return scales[n * (K / 32) + g]; });
  EXPECT_FALSE(m.foldable);
  scales[0] = 127 + 14;
  EXPECT_TRUE(pack_matrix(N, K, [](int, int) { return uint8_t(2); },
                          [&](int n, int g) { return scales[n * (K / 32) + g]; })
                  .foldable);
}

}  // namespace
}  // namespace k3moe::layout_fp8
