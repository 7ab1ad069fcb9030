// The host quantizers of quantize.h (MXFP4, MXFP8, NVFP4) against their documented rules, checked
// through the brute-force models of format_reference.h: each group's scale is the rule's, each code
// is the nearest representable value of the scaled element (ties to even), packing puts the even
// element in the low nibble, MXFP8 scales read as little-endian int32 hold group g at byte g mod 4,
// and non-finite groups get the NaN scale without touching their neighbours.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.h"
#include "format_reference.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"

namespace k3moe {
namespace {

using testing::expect_error;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// rows x cols (cols >= 128) normal values whose row scale spreads over ~30 binades (2^-20 .. 2^10),
// with an all-zero group, exact zeros and an outlier: every branch of the scale rule gets exercised.
std::vector<float> spread_values(int rows, int cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, (r * 7) % 31 - 20);
    for (int c = 0; c < cols; ++c) v[size_t(r) * cols + c] = normal(rng) * row_scale;
  }
  // Rows 1..3 (those that exist; cols >= 96): an all-zero group, signed zeros, an outlier.
  if (rows > 1)
    for (int c = 0; c < 32; ++c) v[size_t(1) * cols + 32 + c] = 0.0f;
  if (rows > 2) v[size_t(2) * cols + 5] = 0.0f, v[size_t(2) * cols + 6] = -0.0f;
  if (rows > 3) v[size_t(3) * cols + 70] *= 1000.0f;
  return v;
}

double group_amax(const float* v, int n) {
  double a = 0.0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(double(v[i])));
  return a;
}

// ------------------------------------------------------------------------------------ MXFP4

TEST(QuantizeMxfp4, ScalesCodesAndPackingFollowTheRule) {
  const int rows = 16, cols = 256;
  const auto v = spread_values(rows, cols, 1);
  const Mxfp4Matrix m = quantize_mxfp4(v, rows, cols);
  ASSERT_EQ(m.rows, rows);
  ASSERT_EQ(m.cols, cols);
  ASSERT_EQ(m.packed.size(), size_t(rows) * cols / 2);
  ASSERT_EQ(m.scales.size(), size_t(rows) * cols / 32);
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < cols / 32; ++g) {
      const float* x = v.data() + size_t(r) * cols + g * 32;
      const uint8_t s = m.scales[size_t(r) * (cols / 32) + g];
      ASSERT_EQ(s, k3test::ref_mx_scale(float(group_amax(x, 32)), 6.0f)) << "row " << r << " group " << g;
      const double scale = std::ldexp(1.0, int(s) - 127);
      for (int j = 0; j < 32; ++j) {
        const int c = g * 32 + j;
        const uint8_t byte = m.packed[(size_t(r) * cols + c) / 2];
        const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
        // x / 2^e is exact in fp32 here, so the brute-force encoder sees the same value.
        const float scaled = float(double(x[j]) / scale);
        ASSERT_EQ(code, k3test::ref_encode_e2m1(scaled)) << "row " << r << " col " << c << " x " << x[j];
        const double q = m.at(r, c);
        ASSERT_EQ(q, k3test::ref_decode_e2m1(code) * scale);
        // Round-trip bound: half the E2M1 step at |x| / 2^e, times the scale (no saturation:
        // |x| <= 6 * 2^e by the rule).
        ASSERT_LE(std::fabs(q - double(x[j])), k3test::e2m1_half_step(double(x[j]) / scale) * scale);
      }
    }
}

TEST(QuantizeMxfp4, KnownPackingOfOneRow) {
  // amax 6 -> scale 2^0 (byte 127); codes 0..7 then -0..-6 in element order, twice.
  std::vector<float> v(32);
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; ++i) v[i] = (i & 8) ? -mags[i & 7] : mags[i & 7];
  const Mxfp4Matrix m = quantize_mxfp4(v, 1, 32);
  EXPECT_EQ(m.scales[0], 127);
  for (int j = 0; j < 16; ++j) {
    const int even = (2 * j) & 15, odd = (2 * j + 1) & 15;
    EXPECT_EQ(m.packed[j], uint8_t(even | (odd << 4))) << "byte " << j;
  }
  EXPECT_EQ(m.packed[0], 0x10);
  EXPECT_EQ(m.packed[3], 0x76);
  EXPECT_EQ(m.packed[4], 0x98);
}

TEST(QuantizeMxfp4, NonFiniteGroupsGetTheNaNScaleAlone) {
  const int cols = 128;
  std::vector<float> v(cols);
  for (int c = 0; c < cols; ++c) v[c] = 0.1f * float(c % 13) - 0.6f;
  v[33] = kNaN;   // group 1
  v[95] = -kInf;  // group 2
  const Mxfp4Matrix m = quantize_mxfp4(v, 1, cols);
  EXPECT_EQ(m.scales[1], kE8M0NaN);
  EXPECT_EQ(m.scales[2], kE8M0NaN);
  for (int c = 32; c < 96; ++c) {
    EXPECT_EQ(e2m1_nibble(m.packed[c / 2], c), 0) << "codes of a NaN-scale group are 0, col " << c;
    EXPECT_TRUE(std::isnan(m.at(0, c))) << "col " << c;
  }
  for (int g : {0, 3}) {
    EXPECT_EQ(m.scales[g], k3test::ref_mx_scale(float(group_amax(v.data() + g * 32, 32)), 6.0f));
    for (int c = g * 32; c < g * 32 + 32; ++c) EXPECT_TRUE(std::isfinite(m.at(0, c))) << "col " << c;
  }
}

TEST(QuantizeMxfp4, AllZeroGroupGetsTheSmallestScale) {
  std::vector<float> v(64, 0.0f);
  v[40] = -0.0f;
  const Mxfp4Matrix m = quantize_mxfp4(v, 2, 32);
  EXPECT_EQ(m.scales[0], 0);
  EXPECT_EQ(m.scales[1], 0);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(m.at(0, c), 0.0);
  EXPECT_TRUE(std::signbit(m.at(1, 8))) << "-0 keeps its sign";
}

TEST(QuantizeMxfp4, RejectsBadShapes) {
  // Each call breaks one rule and must get that rule's message.
  std::vector<float> v(48);
  expect_error([&] { quantize_mxfp4(v, 1, 48); }, {"quantize_mxfp4", "multiple of 32", "got 48"});
  expect_error([&] { quantize_mxfp4(v, 2, 32); }, {"quantize_mxfp4", "expected 64 values", "got 48"});
  expect_error([&] { quantize_mxfp4({}, -1, 32); }, {"quantize_mxfp4", ">= 0", "[-1, 32]"});
  const Mxfp4Matrix empty = quantize_mxfp4({}, 0, 64);
  EXPECT_TRUE(empty.packed.empty());
}

// ------------------------------------------------------------------------------------ MXFP8

TEST(QuantizeMxfp8, ScalesAndCodesFollowTheRoundUpRule) {
  const int rows = 16, cols = 512;
  const auto v = spread_values(rows, cols, 2);
  const Mxfp8Matrix m = quantize_mxfp8(v, rows, cols);
  ASSERT_EQ(m.codes.size(), size_t(rows) * cols);
  ASSERT_EQ(m.scales.size(), size_t(rows) * cols / 32);
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < cols / 32; ++g) {
      const float* x = v.data() + size_t(r) * cols + g * 32;
      const uint8_t s = m.scales[size_t(r) * (cols / 32) + g];
      ASSERT_EQ(s, k3test::ref_mx_scale(float(group_amax(x, 32)), 448.0f)) << "row " << r << " group " << g;
      const double scale = std::ldexp(1.0, int(s) - 127);
      for (int j = 0; j < 32; ++j) {
        const int c = g * 32 + j;
        const uint8_t code = m.codes[size_t(r) * cols + c];
        const float scaled = float(double(x[j]) / scale);
        ASSERT_LE(std::fabs(double(scaled)), 448.0) << "no element saturates";
        ASSERT_EQ(code, k3test::ref_encode_e4m3(scaled)) << "row " << r << " col " << c;
        const double q = m.at(r, c), err = std::fabs(q - double(x[j]));
        // Round-trip bound: E4M3 RNE with 3 mantissa bits is within 2^-4 relative for normal
        // scaled values (|x| / 2^e >= 2^-6), within half a subnormal step 2^-10 * 2^e below.
        if (std::fabs(double(scaled)) >= 0x1p-6) {
          ASSERT_LE(err, 0x1p-4 * std::fabs(double(x[j])));
        } else {
          ASSERT_LE(err, 0x1p-10 * scale);
        }
      }
    }
}

TEST(QuantizeMxfp8, ScalesPackFourPerInt32LittleEndian) {
  const int rows = 3, cols = 1024;  // [3, 32] scale bytes == [3, 8] int32
  const auto v = spread_values(rows, cols, 3);
  const Mxfp8Matrix m = quantize_mxfp8(v, rows, cols);
  std::vector<int32_t> packed(size_t(rows) * cols / 128);
  ASSERT_EQ(packed.size() * 4, m.scales.size());
  std::memcpy(packed.data(), m.scales.data(), m.scales.size());
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < cols / 32; ++g) {
      const uint32_t word = uint32_t(packed[size_t(r) * (cols / 128) + g / 4]);
      const uint8_t want = k3test::ref_mx_scale(float(group_amax(v.data() + size_t(r) * cols + g * 32, 32)), 448.0f);
      EXPECT_EQ(uint8_t(word >> (8 * (g % 4))), want) << "row " << r << " group " << g;
    }
}

TEST(QuantizeMxfp8, KnownGroup) {
  // amax 7 -> e = ceil(log2(7 / 448)) = -6: 7 * 64 = 448 exactly; 0.1 * 64 = 6.4 -> 6.5 (RNE, step 0.5).
  std::vector<float> v(32, 0.0f);
  v[0] = 7.0f;
  v[1] = -1.5f;
  v[2] = 0.1f;
  const Mxfp8Matrix m = quantize_mxfp8(v, 1, 32);
  EXPECT_EQ(m.scales[0], 127 - 6);
  EXPECT_EQ(m.codes[0], 0x7E);
  EXPECT_EQ(m.at(0, 0), 7.0);
  EXPECT_EQ(m.at(0, 1), -1.5);
  EXPECT_EQ(m.at(0, 2), 6.5 / 64);
  EXPECT_EQ(m.codes[3], 0x00);
}

TEST(QuantizeMxfp8, NonFiniteGroupsGetTheNaNScaleAlone) {
  const int cols = 128;
  std::vector<float> v(cols);
  for (int c = 0; c < cols; ++c) v[c] = 0.37f * float(c % 11) - 2.0f;
  v[64] = kInf;
  v[100] = kNaN;
  const Mxfp8Matrix m = quantize_mxfp8(v, 1, cols);
  EXPECT_EQ(m.scales[2], kE8M0NaN);
  EXPECT_EQ(m.scales[3], kE8M0NaN);
  for (int c = 64; c < 128; ++c) {
    EXPECT_EQ(m.codes[c], kE4M3NaN) << "x / NaN is NaN: every code of the group is 0x7F, col " << c;
    EXPECT_TRUE(std::isnan(m.at(0, c)));
  }
  for (int c = 0; c < 64; ++c) EXPECT_TRUE(std::isfinite(m.at(0, c))) << "col " << c;
}

TEST(QuantizeMxfp8, GroupFunctionMatchesTheMatrix) {
  const auto v = spread_values(2, 128, 4);
  const Mxfp8Matrix m = quantize_mxfp8(v, 2, 128);
  for (int g = 0; g < 8; ++g) {
    uint8_t codes[32];
    EXPECT_EQ(quantize_mxfp8_group(v.data() + g * 32, 32, codes), m.scales[g]);
    EXPECT_EQ(std::memcmp(codes, m.codes.data() + g * 32, 32), 0) << "group " << g;
  }
}

// ------------------------------------------------------------------------------------ NVFP4

TEST(QuantizeNvfp4, GlobalBlockScalesAndCodesFollowTheRule) {
  const int rows = 8, cols = 256;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v[size_t(r) * cols + c] = normal(rng) * std::ldexp(1.0f, r - 4);
  const Nvfp4Matrix m = quantize_nvfp4(v, rows, cols);
  ASSERT_EQ(m.scales.size(), size_t(rows) * cols / 16);
  const float amax = float(group_amax(v.data(), int(v.size())));
  EXPECT_EQ(m.global_scale, amax / (448.0f * 6.0f));

  double err2 = 0.0, ref2 = 0.0;
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / 16; ++b) {
      const float* x = v.data() + size_t(r) * cols + b * 16;
      const float bamax = float(group_amax(x, 16));
      const uint8_t s = m.scales[size_t(r) * (cols / 16) + b];
      ASSERT_EQ(s, k3test::ref_encode_e4m3(bamax / (6.0f * m.global_scale))) << "row " << r << " block " << b;
      ASSERT_LE(s, 0x7E);
      const float block = float(k3test::ref_decode_e4m3(s)) * m.global_scale;
      for (int j = 0; j < 16; ++j) {
        const int c = b * 16 + j;
        const uint8_t code = e2m1_nibble(m.packed[(size_t(r) * cols + c) / 2], c);
        const uint8_t want = block > 0.0f ? k3test::ref_encode_e2m1(x[j] / block) : 0;
        ASSERT_EQ(code, want) << "row " << r << " col " << c;
        const double q = m.at(r, c);
        ASSERT_EQ(q, k3test::ref_decode_e2m1(code) * double(k3test::ref_decode_e4m3(s)) * double(m.global_scale));
        err2 += (q - x[j]) * (q - x[j]);
        ref2 += double(x[j]) * x[j];
      }
    }
  // Aggregate bound: with the block scale rounded to nearest (relative error <= 2^-4 for normal
  // E4M3 scales), E2M1 on N(0,1) blocks of 16 has an RMS relative error of about 0.1 (half-steps
  // 0.25 / 0.5 / 1 on a grid whose top sits at the block amax); allow up to 0.2.
  EXPECT_LT(std::sqrt(err2 / ref2), 0.2);
}

TEST(QuantizeNvfp4, ZerosAndNonFinite) {
  std::vector<float> zeros(32, 0.0f);
  const Nvfp4Matrix z = quantize_nvfp4(zeros, 1, 32);
  EXPECT_EQ(z.global_scale, 1.0f);
  for (uint8_t s : z.scales) EXPECT_EQ(s, 0);
  for (uint8_t p : z.packed) EXPECT_EQ(p, 0);
  std::vector<float> bad(32, 1.0f);
  bad[7] = kNaN;
  EXPECT_THROW(quantize_nvfp4(bad, 1, 32), Error);
  bad[7] = kInf;
  EXPECT_THROW(quantize_nvfp4(bad, 1, 32), Error);
  expect_error([&] { quantize_nvfp4(std::vector<float>(24), 1, 24); }, {"quantize_nvfp4", "multiple of 16", "got 24"});
  // Groups of 16: 48 columns (not a multiple of 32) are three groups.
  const Nvfp4Matrix three = quantize_nvfp4(std::vector<float>(48, 1.0f), 1, 48);
  EXPECT_EQ(three.scales.size(), 3u);
  // Values so small that amax / 2688 underflows: the global scale stays a positive float.
  const Nvfp4Matrix tiny = quantize_nvfp4(std::vector<float>(16, 1e-42f), 1, 16);
  EXPECT_GT(tiny.global_scale, 0.0f);
  EXPECT_NE(tiny.scales[0], 0);  // and the block decodes to about 1e-42, not to zeros
}

}  // namespace
}  // namespace k3moe
