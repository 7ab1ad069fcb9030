// Exhaustive tests of the codecs in formats.h: every code of every format decodes to the value its
// definition gives and encodes back to itself; every midpoint between neighbouring codes goes to
// the even code (and one ulp either side to the nearer one); saturation, NaN, Inf, signed zero and
// subnormals follow the rules documented in formats.h. A sweep of ~1M fp32 bit patterns checks
// the fast encoders against the brute-force models of format_reference.h.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "format_reference.h"
#include "k3moe/formats.h"

namespace k3moe {
namespace {

using k3test::bits_of;
using k3test::float_of;
using k3test::same_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kQNaN = std::numeric_limits<float>::quiet_NaN();

// NaN bit patterns: quiet, negative quiet, and signalling-style payloads (only low bits set).
const uint32_t kNaNBits[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FA12345u, 0x7FFFFFFFu};

float up(float x) { return std::nextafter(x, kInf); }
float down(float x) { return std::nextafter(x, -kInf); }

// Every fp32 bit pattern with stride 4093 (a prime, so the low mantissa bits vary): ~1.05M values
// spread over every binade, both signs, NaNs and infinities included.
template <class Fn>
void for_strided_floats(Fn&& fn) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093) fn(float_of(uint32_t(u)));
}

// ------------------------------------------------------------------------------------ E2M1

TEST(E2M1, DecodesEveryCodeByDefinition) {
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int code = 0; code < 16; ++code) {
    const float v = e2m1_to_float(uint8_t(code));
    const float want = (code & 8) ? -expected[code & 7] : expected[code & 7];
    EXPECT_TRUE(same_bits(v, want)) << "code " << code << " decodes to " << v << ", want " << want;
    EXPECT_EQ(double(v), k3test::ref_decode_e2m1(uint8_t(code))) << "code " << code;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_float(8))) << "code 8 is -0";
}

TEST(E2M1, EveryCodeRoundTrips) {
  for (int code = 0; code < 16; ++code)
    EXPECT_EQ(float_to_e2m1(e2m1_to_float(uint8_t(code))), code) << "code " << code;
}

TEST(E2M1, EveryMidpointGoesToTheEvenCode) {
  for (int sign = 0; sign < 2; ++sign) {
    const float s = sign ? -1.0f : 1.0f;
    for (int i = 0; i < 7; ++i) {
      const float lo = float(k3test::kE2M1[i]), hi = float(k3test::kE2M1[i + 1]);
      const float mid = 0.5f * (lo + hi);  // exact: the grid has 2 significant bits
      const uint8_t even = uint8_t(((i % 2 == 0) ? i : i + 1) | (sign << 3));
      EXPECT_EQ(float_to_e2m1(s * mid), even) << "midpoint " << s * mid;
      EXPECT_EQ(float_to_e2m1(s * down(mid)), uint8_t(i | (sign << 3))) << "just below " << s * mid;
      EXPECT_EQ(float_to_e2m1(s * up(mid)), uint8_t((i + 1) | (sign << 3))) << "just above " << s * mid;
    }
  }
}

TEST(E2M1, SaturatesAtSix) {
  for (float v : {6.0f, up(6.0f), 6.5f, 7.0f, 1e6f, FLT_MAX, kInf}) {
    EXPECT_EQ(float_to_e2m1(v), 7) << v;
    EXPECT_EQ(float_to_e2m1(-v), 15) << -v;
  }
}

TEST(E2M1, NaNEncodesAsPositiveZero) {
  for (uint32_t b : kNaNBits) EXPECT_EQ(float_to_e2m1(float_of(b)), 0) << std::hex << b;
}

TEST(E2M1, SignedZeroAndTinyValues) {
  EXPECT_EQ(float_to_e2m1(0.0f), 0);
  EXPECT_EQ(float_to_e2m1(-0.0f), 8);
  for (float v : {std::numeric_limits<float>::denorm_min(), FLT_MIN, 1e-30f, 0.25f}) {
    EXPECT_EQ(float_to_e2m1(v), 0) << v;
    EXPECT_EQ(float_to_e2m1(-v), 8) << -v;  // rounds to -0, keeping the sign
  }
}

TEST(E2M1, MatchesBruteForceOnStridedFloats) {
  int64_t checked = 0, wrong = 0;
  for_strided_floats([&](float x) {
    ++checked;
    if (float_to_e2m1(x) != k3test::ref_encode_e2m1(x) && ++wrong <= 10)
      ADD_FAILURE() << "x = " << x << " (0x" << std::hex << bits_of(x) << std::dec << "): got "
                    << int(float_to_e2m1(x)) << ", want " << int(k3test::ref_encode_e2m1(x));
  });
  EXPECT_EQ(wrong, 0) << "of " << checked;
}

TEST(E2M1, PackingPutsTheEvenElementInTheLowNibble) {
  for (int even = 0; even < 16; ++even)
    for (int odd = 0; odd < 16; ++odd) {
      const uint8_t b = pack_e2m1(uint8_t(even), uint8_t(odd));
      EXPECT_EQ(b, uint8_t(even | (odd << 4)));
      EXPECT_EQ(e2m1_nibble(b, 0), even);
      EXPECT_EQ(e2m1_nibble(b, 1), odd);
      EXPECT_EQ(e2m1_nibble(b, 6), even);  // any even k
      EXPECT_EQ(e2m1_nibble(b, 7), odd);   // any odd k
    }
  EXPECT_EQ(pack_e2m1(0xF2, 0xF1), 0x12) << "only the low 4 bits of each code are packed";
}

// ------------------------------------------------------------------------------------ E4M3

TEST(E4M3, DecodesEveryCodeByDefinition) {
  for (int code = 0; code < 256; ++code) {
    const float v = e4m3_to_float(uint8_t(code));
    const double want = k3test::ref_decode_e4m3(uint8_t(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << "code " << code;
    } else {
      EXPECT_EQ(double(v), want) << "code " << code;
      EXPECT_EQ(std::signbit(v), (code & 0x80) != 0) << "code " << code;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(code))), code) << "code " << code;
  }
}

TEST(E4M3, EveryMidpointGoesToTheEvenCode) {
  const auto& mags = k3test::e4m3_magnitudes();
  for (int sign = 0; sign < 2; ++sign) {
    const float s = sign ? -1.0f : 1.0f;
    const uint8_t sb = uint8_t(sign << 7);
    for (int c = 0; c < 126; ++c) {
      const float mid = float(0.5 * (mags[c] + mags[c + 1]));  // exact: 5 significant bits at most
      ASSERT_EQ(double(mid), 0.5 * (mags[c] + mags[c + 1]));
      const uint8_t even = uint8_t((c % 2 == 0) ? c : c + 1);
      EXPECT_EQ(float_to_e4m3(s * mid), sb | even) << "midpoint " << s * mid;
      EXPECT_EQ(float_to_e4m3(s * down(mid)), sb | c) << "just below " << s * mid;
      EXPECT_EQ(float_to_e4m3(s * up(mid)), sb | (c + 1)) << "just above " << s * mid;
    }
  }
}

TEST(E4M3, SaturatesFiniteValuesAndInfinitiesAt448) {
  // 464 is the midpoint to the next binade's first value (480, not representable): satfinite maps
  // it and everything above it, infinities included, to 448.
  for (float v : {448.0f, up(448.0f), 463.0f, 464.0f, up(464.0f), 480.0f, 1e10f, FLT_MAX, kInf}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xFE) << -v;
  }
}

TEST(E4M3, NaNEncodesAs0x7F) {
  for (uint32_t b : kNaNBits) EXPECT_EQ(float_to_e4m3(float_of(b)), 0x7F) << std::hex << b;
}

TEST(E4M3, SignedZeroAndSubnormals) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00) << "half the smallest subnormal ties to 0";
  EXPECT_EQ(float_to_e4m3(up(0x1p-10f)), 0x01);
  EXPECT_EQ(float_to_e4m3(-up(0x1p-10f)), 0x81);
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02) << "1.5 x 2^-9 ties to the even code 2";
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f), 0x08) << "7.5 x 2^-9 ties up to the first normal";
  for (float v : {std::numeric_limits<float>::denorm_min(), FLT_MIN, 1e-20f}) {
    EXPECT_EQ(float_to_e4m3(v), 0x00) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0x80) << -v;
  }
}

TEST(E4M3, MatchesBruteForceOnStridedFloats) {
  int64_t checked = 0, wrong = 0;
  for_strided_floats([&](float x) {
    ++checked;
    if (float_to_e4m3(x) != k3test::ref_encode_e4m3(x) && ++wrong <= 10)
      ADD_FAILURE() << "x = " << x << " (0x" << std::hex << bits_of(x) << std::dec << "): got "
                    << int(float_to_e4m3(x)) << ", want " << int(k3test::ref_encode_e4m3(x));
  });
  EXPECT_EQ(wrong, 0) << "of " << checked;
}

TEST(E4M3, MatchesBruteForceOnEveryFloatNearEachCode) {
  // 64 consecutive fp32 values either side of every code and of every midpoint.
  const auto& mags = k3test::e4m3_magnitudes();
  int64_t wrong = 0;
  for (int c = 0; c < 127; ++c)
    for (double centre : {mags[c], c < 126 ? 0.5 * (mags[c] + mags[c + 1]) : 464.0}) {
      float x = float(centre);
      for (int i = 0; i < 64; ++i) x = down(x);
      for (int i = 0; i < 128; ++i, x = up(x))
        for (float v : {x, -x})
          if (float_to_e4m3(v) != k3test::ref_encode_e4m3(v) && ++wrong <= 10)
            ADD_FAILURE() << "x = " << v << ": got " << int(float_to_e4m3(v)) << ", want "
                          << int(k3test::ref_encode_e4m3(v));
    }
  EXPECT_EQ(wrong, 0);
}

// The fact an fp8 expert kernel would fold the weight's group scale on: E2M1 x 2^d is exact in
// E4M3 for every code exactly when d is in [-8, 6] (bench/NOTES.md, Session 4: the fp8 path).
TEST(E4M3, HoldsEveryE2M1ValueTimesTwoToTheDExactlyForDFromMinus8To6) {
  std::vector<int> exact_d;
  for (int d = -20; d <= 20; ++d) {
    bool all = true;
    for (uint8_t c = 0; c < 16; ++c) {
      const double v = std::ldexp(double(e2m1_to_float(c)), d);
      all = all && double(e4m3_to_float(float_to_e4m3(float(v)))) == v;
    }
    if (all) exact_d.push_back(d);
  }
  ASSERT_FALSE(exact_d.empty());
  EXPECT_EQ(exact_d.front(), -8);
  EXPECT_EQ(exact_d.back(), 6);
  EXPECT_EQ(int(exact_d.size()), 15) << "a contiguous range";
}

// ------------------------------------------------------------------------------------ E8M0

TEST(E8M0, DecodesEveryCodeByDefinition) {
  for (int s = 0; s < 255; ++s)
    EXPECT_EQ(double(e8m0_to_float(uint8_t(s))), std::ldexp(1.0, s - 127)) << "byte " << s;
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f) << "2^-127 is an fp32 subnormal, kept exactly";
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
}

TEST(E8M0, EveryCodeRoundTripsThroughTheScaleRule) {
  // With elem_max 1 the round-up rule is the exact E8M0 encoding of a power of two.
  for (int s = 0; s < 256; ++s)
    EXPECT_EQ(mx_scale_round_up(e8m0_to_float(uint8_t(s)), 1.0f), s) << "byte " << s;
  // With the element maxima: amax = elem_max * 2^e needs exactly 2^e (where it is finite).
  for (float m : {kE2M1Max, kE4M3Max})
    for (int s = 0; s < 255; ++s) {
      const float amax = m * e8m0_to_float(uint8_t(s));
      if (!std::isfinite(amax)) continue;
      EXPECT_EQ(mx_scale_round_up(amax, m), s) << "elem_max " << m << ", byte " << s;
    }
}

TEST(E8M0, ScaleDownIsAnExactDivision) {
  const float xs[] = {1.0f, -3.5f, 448.0f, 0x1.fffffep0f, 1e-3f, -0.0f};
  for (int s = 0; s < 255; ++s)
    for (float x : xs) {
      const double want = std::ldexp(double(x), 127 - s);
      if ((std::fabs(want) >= 0x1p-126 && std::fabs(want) < 0x1p127) || want == 0.0) {
        const float got = scale_down_by_e8m0(x, uint8_t(s));
        EXPECT_EQ(double(got), want) << x << " / 2^" << s - 127;
        EXPECT_EQ(std::signbit(got), std::signbit(x));
      }
    }
  EXPECT_TRUE(std::isnan(scale_down_by_e8m0(1.0f, 255)));
}

// ------------------------------------------------------------------------------- mx scale rule

TEST(MxScale, IsTheSmallestPowerOfTwoThatAvoidsSaturation) {
  int64_t wrong = 0;
  for (float m : {kE2M1Max, kE4M3Max}) {
    auto check = [&](float amax) {
      const uint8_t got = mx_scale_round_up(amax, m);
      const uint8_t want = k3test::ref_mx_scale(amax, m);
      if (got != want && ++wrong <= 10)
        ADD_FAILURE() << "amax " << amax << " elem_max " << m << ": got " << int(got) << ", want " << int(want);
      if (!std::isfinite(amax) || got == 255) return;
      const double scale = std::ldexp(1.0, int(got) - 127);
      // No element of the group saturates ...
      if (std::fabs(double(amax)) > double(m) * scale && ++wrong <= 10)
        ADD_FAILURE() << "amax " << amax << " saturates under 2^" << int(got) - 127;
      // ... and the exponent is minimal (unless clamped at 2^-127 or floored for a ~zero group).
      if (got > 0 && std::fabs(double(amax)) <= double(m) * scale / 2 && ++wrong <= 10)
        ADD_FAILURE() << "amax " << amax << ": 2^" << int(got) - 128 << " would have done";
    };
    for_strided_floats([&](float x) { if (!std::signbit(x)) check(x); });
    for (int e = -140; e < 128; ++e) {  // every exact boundary m * 2^e and its neighbours
      const float b = float(std::ldexp(double(m), e));
      if (!std::isfinite(b) || b == 0.0f) continue;
      check(b), check(up(b)), check(down(b));
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(MxScale, NonFiniteAndTinyAmax) {
  for (float m : {kE2M1Max, kE4M3Max}) {
    EXPECT_EQ(mx_scale_round_up(kInf, m), 255);
    EXPECT_EQ(mx_scale_round_up(-kInf, m), 255);
    for (uint32_t b : kNaNBits) EXPECT_EQ(mx_scale_round_up(float_of(b), m), 255);
    EXPECT_EQ(mx_scale_round_up(0.0f, m), 0) << "an all-zero group gets the smallest scale";
    EXPECT_EQ(mx_scale_round_up(std::numeric_limits<float>::denorm_min(), m), 0);
    EXPECT_EQ(mx_scale_round_up(FLT_MIN, m), 0);
    EXPECT_EQ(mx_scale_round_up(FLT_MAX, m), m == kE2M1Max ? 127 + 126 : 127 + 120);
  }
  EXPECT_EQ(mx_scale_round_up(448.0f, kE4M3Max), 127);
  EXPECT_EQ(mx_scale_round_up(up(448.0f), kE4M3Max), 128);
  EXPECT_EQ(mx_scale_round_up(6.0f, kE2M1Max), 127);
  EXPECT_EQ(mx_scale_round_up(up(6.0f), kE2M1Max), 128);
  EXPECT_EQ(mx_scale_round_up(3.0f, kE2M1Max), 126);
  EXPECT_EQ(mx_scale_round_up(up(3.0f), kE2M1Max), 127);
}

// ------------------------------------------------------------------------------------ UE4M3

TEST(UE4M3, DecodesEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float v = ue4m3_to_float(uint8_t(code));
    if (code >= 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << "code " << code << ": the sign bit set (or 0x7F) is NaN";
    } else {
      EXPECT_EQ(double(v), k3test::e4m3_magnitude(code)) << "code " << code;
      EXPECT_FALSE(std::signbit(v)) << "code " << code;
    }
  }
}

TEST(UE4M3, EveryCodeRoundTrips) {
  for (int code = 0; code < 0x7F; ++code)
    EXPECT_EQ(float_to_ue4m3(ue4m3_to_float(uint8_t(code))), code) << "code " << code;
  EXPECT_EQ(float_to_ue4m3(ue4m3_to_float(0x7F)), 0x7F);
  for (int code = 0x80; code < 256; ++code)
    EXPECT_EQ(float_to_ue4m3(ue4m3_to_float(uint8_t(code))), 0x7F) << "code " << code;
}

TEST(UE4M3, EncodeRules) {
  EXPECT_EQ(float_to_ue4m3(0.0f), 0);
  EXPECT_EQ(float_to_ue4m3(-0.0f), 0) << "-0 is a zero scale, not a negative one";
  for (float v : {-FLT_MIN, -1.0f, -448.0f, -kInf}) EXPECT_EQ(float_to_ue4m3(v), 0x7F) << v;
  for (uint32_t b : kNaNBits) EXPECT_EQ(float_to_ue4m3(float_of(b)), 0x7F) << std::hex << b;
  for (float v : {448.0f, 464.0f, 1e9f, kInf}) EXPECT_EQ(float_to_ue4m3(v), 0x7E) << v;
  const auto& mags = k3test::e4m3_magnitudes();
  for (int c = 0; c < 126; ++c) {
    const float mid = float(0.5 * (mags[c] + mags[c + 1]));
    EXPECT_EQ(float_to_ue4m3(mid), (c % 2 == 0) ? c : c + 1) << "midpoint " << mid;
  }
  for_strided_floats([&](float x) {
    if (std::signbit(x) || std::isnan(x)) return;
    ASSERT_EQ(float_to_ue4m3(x), k3test::ref_encode_e4m3(x)) << x;
  });
}

// ------------------------------------------------------------------------------------ bf16

TEST(Bf16, EveryBf16ValueAndItsNeighbourhoodRoundsToNearestEven) {
  // For every bf16 pattern b that is finite: b exactly, b + (just under / exactly / just over) half
  // an ulp. The tie goes to the even pattern; the largest finite value's upper tie goes to Inf.
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    if ((b & 0x7F80u) == 0x7F80u) continue;  // Inf / NaN patterns
    const uint32_t base = b << 16;
    const uint16_t next = uint16_t(b + 1), even = (b & 1u) ? next : uint16_t(b);
    ASSERT_EQ(float_to_bf16_bits(float_of(base)), b);
    ASSERT_EQ(float_to_bf16_bits(float_of(base | 0x0001u)), b);
    ASSERT_EQ(float_to_bf16_bits(float_of(base | 0x7FFFu)), b) << std::hex << b;
    ASSERT_EQ(float_to_bf16_bits(float_of(base | 0x8000u)), even) << std::hex << b;
    ASSERT_EQ(float_to_bf16_bits(float_of(base | 0x8001u)), next) << std::hex << b;
    ASSERT_EQ(float_to_bf16_bits(float_of(base | 0xFFFFu)), next) << std::hex << b;
    ASSERT_TRUE(same_bits(round_to_bf16(float_of(base)), float_of(base)));
  }
  EXPECT_EQ(float_to_bf16_bits(FLT_MAX), 0x7F80) << "above the largest bf16 by more than half an ulp";
  EXPECT_EQ(float_to_bf16_bits(-FLT_MAX), 0xFF80);
}

TEST(Bf16, InfinitiesSignedZeroAndNaN) {
  EXPECT_EQ(float_to_bf16_bits(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  for (uint32_t b : kNaNBits) {
    const uint16_t r = float_to_bf16_bits(float_of(b));
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(r))) << std::hex << b << " -> " << r;
    EXPECT_EQ(r & 0x0040u, 0x0040u) << "quiet bit set";
    EXPECT_EQ(r >> 15, b >> 31) << "sign kept";
  }
  EXPECT_EQ(float_to_bf16_bits(kQNaN), 0x7FC0);
}

TEST(Bf16, DecodeIsTheHighHalfOfFp32) {
  for (uint32_t b = 0; b < 0x10000u; ++b)
    ASSERT_EQ(bits_of(bf16_bits_to_float(uint16_t(b))), b << 16);
}

// The codecs are constexpr: the kernels use them in constant expressions too.
static_assert(float_to_e2m1(2.5f) == 4 && float_to_e2m1(-5.0f) == 14);
static_assert(float_to_e4m3(448.0f) == 0x7E && float_to_e4m3(-1.0f) == 0xB8);
static_assert(mx_scale_round_up(448.0f, kE4M3Max) == 127 && mx_scale_round_up(7.0f, kE2M1Max) == 128);
static_assert(float_to_bf16_bits(1.0f) == 0x3F80 && e8m0_to_float(128) == 2.0f);

}  // namespace
}  // namespace k3moe
