// The float64 reference forward (reference.h): hand-computable experts in both modes, both
// precisions and all three activations; a plain-loop model on random experts; expert-parallel
// mapping; -1 slots; invalid ids; NaN isolation; and the Ideal-to-Emulate distance of each mode
// against its derived size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "k3moe/activation.h"
#include "expect_error.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"
#include "k3moe/reference.h"
#include "reference/forward_internal.h"
#include "reference_fixtures.h"

namespace k3moe {
namespace {

constexpr Activation kActivations[] = {Activation::Situ, Activation::Swiglu, Activation::SwigluOai};
constexpr Mode kModes[] = {Mode::A16, Mode::Mxfp8};

// Names for messages (kept here so that these tests need nothing but the reference).
const char* name(Activation a) {
  return a == Activation::Situ ? "situ" : a == Activation::Swiglu ? "swiglu" : "swiglu_oai";
}
const char* name(Mode m) { return m == Mode::A16 ? "a16" : "mxfp8"; }

// The activations written out from the contract (not through activation.h), with the parameters
// of `p`. gpt-oss's alpha is the fp32 constant 1.702f widened to double, as ActivationParams holds it.
double model_activation(Activation kind, const ActivationParams& p, double g, double u) {
  const double beta = p.situ_beta, linear_beta = p.situ_linear_beta;
  const double alpha = p.swiglu_alpha, limit = p.swiglu_limit;
  switch (kind) {
    case Activation::Situ: {
      const double gate = beta * std::tanh(g / beta) / (1.0 + std::exp(-g));
      return gate * (linear_beta * std::tanh(u / linear_beta));
    }
    case Activation::Swiglu:
      return g / (1.0 + std::exp(-g)) * u;
    case Activation::SwigluOai:
    default: {
      g = std::min(g, limit);
      u = std::max(-limit, std::min(u, limit));
      return g / (1.0 + std::exp(-alpha * g)) * (u + 1.0);
    }
  }
}
double model_activation(Activation kind, double g, double u) { return model_activation(kind, {}, g, u); }

// Parameters other than Kimi-K3's and gpt-oss's, exact in fp32, so that a parameter the code
// ignores shows (the hand case's gates reach 8: the limit 6 clamps some).
constexpr ActivationParams kOtherParams{3.0f, 20.0f, 1.5f, 6.0f};
const char* name(const ActivationParams& p) {
  return p.situ_beta == kOtherParams.situ_beta ? "(other parameters)" : "(the models' parameters)";
}

double to_bf16(double v) { return double(round_to_bf16(float(v))); }

// ------------------------------------------------------------------ hand-computable experts
//
// H = I = 32, two experts, every weight matrix a multiple of the identity (exact in MXFP4):
//   expert 0: gate = x, up = 2x, y = a / 2        expert 1: gate = -4x, up = 4x, y = a
// Token 0 takes both (weights 0.75, 0.25); token 1 takes expert 1 (0.5) and an empty slot (-1).
// x0_j = (j - 16) / 8 and x1_j = (16 - j) / 16 are exact in bf16 and in MXFP8 (amax 2 and 1: the
// scaled values are multiples of 16 up to 256, four significant bits).
struct HandCase {
  MoeConfig config = k3test::small_config(32, 32, 2, 2);
  RankExperts experts;
  std::vector<uint16_t> x;
  Routing routing;

  HandCase() {
    experts = k3test::empty_experts(config, {1, 0});
    // v on the diagonal of the 32 x 32 block starting at row0 (matrices have 32 columns).
    auto diag = [](int row0, float v, std::vector<float>& m) {
      for (int i = 0; i < 32; ++i) m[size_t(row0 + i) * 32 + i] = v;
    };
    std::vector<float> w13(64 * 32, 0.0f), w2(32 * 32, 0.0f);
    diag(0, 1.0f, w13), diag(32, 2.0f, w13), diag(0, 0.5f, w2);
    k3test::set_expert(experts, 0, w13, w2);
    std::fill(w13.begin(), w13.end(), 0.0f), std::fill(w2.begin(), w2.end(), 0.0f);
    diag(0, -4.0f, w13), diag(32, 4.0f, w13), diag(0, 1.0f, w2);
    k3test::set_expert(experts, 1, w13, w2);
    for (int j = 0; j < 32; ++j) x.push_back(float_to_bf16_bits(float(j - 16) / 8.0f));
    for (int j = 0; j < 32; ++j) x.push_back(float_to_bf16_bits(float(16 - j) / 16.0f));
    routing.tokens = 2;
    routing.top_k = 2;
    routing.ids = {0, 1, 1, -1};
    routing.weights = {0.75f, 0.25f, 0.5f, 0.3f};
  }
  double x_at(int t, int j) const { return double(bf16_bits_to_float(x[size_t(t) * 32 + j])); }
};

void expect_hand_case_exact(const ActivationParams& params) {
  HandCase hc;
  for (Activation act : kActivations) {
    const std::string what = std::string(name(act)) + " " + name(params);
    // Ideal: out = 0.75 * (a0 / 2) + 0.25 * a1 (token 0), 0.5 * a1 (token 1). The model and the
    // library each evaluate the activation within a few double ulps (<= ~10 roundings and two
    // libm calls of <= 1 ulp): 1e-14 of the terms' magnitude covers both.
    std::vector<double> want_ideal(64);
    for (int j = 0; j < 32; ++j) {
      const double x0 = hc.x_at(0, j), x1 = hc.x_at(1, j);
      const double a00 = model_activation(act, params, x0, 2 * x0);
      const double a01 = model_activation(act, params, -4 * x0, 4 * x0);
      const double a11 = model_activation(act, params, -4 * x1, 4 * x1);
      want_ideal[j] = 0.75 * (a00 / 2) + 0.25 * a01;
      want_ideal[32 + j] = 0.5 * a11;
    }
    for (Mode mode : kModes) {
      const ReferenceProblem p{&hc.experts, 2, hc.x, &hc.routing, mode, act, params};
      const auto ideal = reference_forward(p, Precision::Ideal);
      ASSERT_EQ(ideal.size(), 64u);
      for (int i = 0; i < 64; ++i) {
        const int j = i % 32;
        const double x0 = hc.x_at(i / 32, j);
        const double scale = i < 32 ? 0.375 * std::fabs(model_activation(act, params, x0, 2 * x0)) +
                                          0.25 * std::fabs(model_activation(act, params, -4 * x0, 4 * x0))
                                    : std::fabs(want_ideal[i]);
        EXPECT_NEAR(ideal[i], want_ideal[i], 1e-14 * scale + 1e-300)
            << what << " " << name(mode) << " element " << i;
      }

      // Emulate: h is exact (identity weights, exact x); a is rounded fp32 -> bf16 (a16) or
      // MXFP8 over its 32 values (mxfp8); y = a / 2 and a are exact in fp32; the combine's
      // products and sum are exact in double; out = bf16(fp32(sum)). Bit for bit.
      auto emulate_a = [&](double g_scale, double u_scale, int t) {
        std::vector<double> a(32);
        float a32[32];
        for (int j = 0; j < 32; ++j) {
          const double xv = hc.x_at(t, j);
          a32[j] = float(model_activation(act, params, g_scale * xv, u_scale * xv));
        }
        if (mode == Mode::A16) {
          for (int j = 0; j < 32; ++j) a[j] = double(round_to_bf16(a32[j]));
        } else {
          uint8_t codes[32];
          const uint8_t s = quantize_mxfp8_group(a32, 32, codes);
          for (int j = 0; j < 32; ++j) a[j] = double(e4m3_to_float(codes[j])) * double(e8m0_to_float(s));
        }
        return a;
      };
      const auto a00 = emulate_a(1, 2, 0), a01 = emulate_a(-4, 4, 0), a11 = emulate_a(-4, 4, 1);
      const auto emu = reference_forward(p, Precision::Emulate);
      for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(emu[j], to_bf16(0.75 * (a00[j] / 2) + 0.25 * a01[j]))
            << what << " " << name(mode) << " token 0 element " << j;
        EXPECT_EQ(emu[32 + j], to_bf16(0.5 * a11[j]))
            << what << " " << name(mode) << " token 1 element " << j;
      }
    }
  }
}

TEST(ReferenceForward, HandCaseIsExactInEveryModeAndActivation) {
  expect_hand_case_exact(ActivationParams{});
  expect_hand_case_exact(kOtherParams);
}

TEST(ReferenceForward, IdealDoesNotDependOnTheMode) {
  HandCase hc;
  const ReferenceProblem a16{&hc.experts, 2, hc.x, &hc.routing, Mode::A16, Activation::Situ, {}};
  ReferenceProblem mx = a16;
  mx.mode = Mode::Mxfp8;
  EXPECT_EQ(reference_forward(a16, Precision::Ideal), reference_forward(mx, Precision::Ideal));
}

TEST(ReferenceForward, Mxfp8QuantizesTheInputPerTokenAlongH) {
  // H = 32, I = 64, one expert: a_0 = swiglu(x_0, x_0) (a-group 0) and a_33 = swiglu(x_1, x_1)
  // (a-group 1, alone in it); y_0 = a_33. Token x = [448, 1 + 2^-4, 0, ...]: the x group's
  // amax 448 gives scale 2^0, where 1 + 2^-4 is the tie between E4M3's 1 and 1.125, so mxfp8 feeds
  // GEMM1 with x_1 = 1, while a16 keeps 1.0625. The expected values use the model activation and
  // the (separately tested) MXFP8 group quantizer.
  const MoeConfig c = k3test::small_config(32, 64, 1, 1);
  RankExperts ex = k3test::empty_experts(c, {1, 0});
  std::vector<float> w13(128 * 32, 0.0f), w2(32 * 64, 0.0f);
  w13[0 * 32 + 0] = w13[64 * 32 + 0] = 1.0f;    // gate_0 = up_0 = x_0
  w13[33 * 32 + 1] = w13[97 * 32 + 1] = 1.0f;   // gate_33 = up_33 = x_1
  w2[0 * 64 + 33] = 1.0f;                       // y_0 = a_33
  k3test::set_expert(ex, 0, w13, w2);
  std::vector<uint16_t> x(32, 0);
  x[0] = float_to_bf16_bits(448.0f);
  x[1] = float_to_bf16_bits(1.0625f);
  Routing r;
  r.tokens = 1, r.top_k = 1, r.ids = {0}, r.weights = {1.0f};

  auto expected_out0 = [](double x1, Mode mode) {
    float a[32] = {float(model_activation(Activation::Swiglu, x1, x1))};  // a_33 .. a_63
    if (mode == Mode::A16) return to_bf16(double(round_to_bf16(a[0])));
    uint8_t codes[32];
    const uint8_t s = quantize_mxfp8_group(a, 32, codes);
    return to_bf16(double(e4m3_to_float(codes[0])) * double(e8m0_to_float(s)));
  };
  const double with_quantized_x = expected_out0(1.0, Mode::Mxfp8);
  ASSERT_NE(with_quantized_x, expected_out0(1.0625, Mode::Mxfp8)) << "the case must tell the two apart";
  ReferenceProblem p{&ex, 1, x, &r, Mode::Mxfp8, Activation::Swiglu, {}};
  EXPECT_EQ(reference_forward(p, Precision::Emulate)[0], with_quantized_x);
  p.mode = Mode::A16;
  EXPECT_EQ(reference_forward(p, Precision::Emulate)[0], expected_out0(1.0625, Mode::A16));
}

TEST(ReferenceForward, CombineSumsInSlotOrder) {
  // Three experts with y_0 = 2^60, -2^60 and 1 (a_0 = swiglu(64, 1) = 64 exactly: sigmoid(64)
  // is 1 in double; W2[0][0] = 2^54, -2^54, 2^-6). In slot order (2^60 - 2^60) + 1 = 1; starting
  // from the third, (1 + 2^60) - 2^60 = 0: the order is visible, and the contract fixes it.
  const MoeConfig c = k3test::small_config(32, 32, 3, 3);
  RankExperts ex = k3test::empty_experts(c, {1, 0});
  const float w2_00[3] = {0x1p54f, -0x1p54f, 0x1p-6f};
  for (int e = 0; e < 3; ++e) {
    std::vector<float> w13(64 * 32, 0.0f), w2(32 * 32, 0.0f);
    w13[0] = 1.0f;            // gate_0 = x_0
    w13[32 * 32 + 1] = 1.0f;  // up_0 = x_1
    w2[0] = w2_00[e];
    k3test::set_expert(ex, e, w13, w2);
  }
  std::vector<uint16_t> x(32, 0);
  x[0] = float_to_bf16_bits(64.0f);
  x[1] = float_to_bf16_bits(1.0f);
  Routing r;
  r.tokens = 1, r.top_k = 3, r.ids = {0, 1, 2}, r.weights = {1.0f, 1.0f, 1.0f};
  for (Mode mode : kModes)
    for (Precision prec : {Precision::Ideal, Precision::Emulate}) {
      const ReferenceProblem p{&ex, 1, x, &r, mode, Activation::Swiglu, {}};
      EXPECT_EQ(reference_forward(p, prec)[0], 1.0) << name(mode);
      Routing rotated = r;
      rotated.ids = {2, 0, 1};
      ReferenceProblem pr = p;
      pr.routing = &rotated;
      EXPECT_EQ(reference_forward(pr, prec)[0], 0.0) << name(mode);
    }
}

TEST(ReferenceForward, EmulateHoldsHAndYInFp32) {
  // Emulate rounds h and y to fp32 (the kernels' accumulators). Within range that rounding hides
  // behind the later bf16/E4M3 roundings, so show it where fp32's range ends:
  //   h: gate = x_0 w = 2^100 * 2^100 = 2^200 (fp32: Inf), up = 0. swiglu: Ideal a = 2^200 * 0 = 0;
  //      Emulate a = Inf * 0 = NaN, and the whole row turns NaN.
  //   y: gate = up = x_0 = 8, a ~ 64; W2[0][0] = 2^127: y_0 ~ 2^133 (fp32: Inf); the routing weight
  //      2^-20 brings it back to ~2^113 in Ideal; Emulate's out_0 stays Inf.
  const MoeConfig c = k3test::small_config(32, 32, 1, 1);
  RankExperts ex = k3test::empty_experts(c, {1, 0});
  std::vector<float> w13(64 * 32, 0.0f), w2(32 * 32, 0.0f);
  w13[0] = 0x1p100f;
  for (int j = 0; j < 32; ++j) w2[size_t(j) * 32 + j] = 1.0f;
  k3test::set_expert(ex, 0, w13, w2);
  std::vector<uint16_t> x(32, 0);
  x[0] = float_to_bf16_bits(0x1p100f);
  Routing r;
  r.tokens = 1, r.top_k = 1, r.ids = {0}, r.weights = {1.0f};
  for (Mode mode : kModes) {
    const ReferenceProblem p{&ex, 1, x, &r, mode, Activation::Swiglu, {}};
    for (double v : reference_forward(p, Precision::Ideal)) EXPECT_EQ(v, 0.0) << name(mode);
    for (double v : reference_forward(p, Precision::Emulate)) EXPECT_TRUE(std::isnan(v)) << name(mode);
  }

  std::fill(w13.begin(), w13.end(), 0.0f);
  std::fill(w2.begin(), w2.end(), 0.0f);
  w13[0] = 1.0f;                // gate row 0 = x_0
  w13[size_t(32) * 32] = 1.0f;  // up row 0 = x_0
  w2[0] = 0x1p127f;
  k3test::set_expert(ex, 0, w13, w2);
  x[0] = float_to_bf16_bits(8.0f);
  r.weights = {0x1p-20f};
  for (Mode mode : kModes) {
    const ReferenceProblem p{&ex, 1, x, &r, mode, Activation::Swiglu, {}};
    const auto ideal = reference_forward(p, Precision::Ideal), emu = reference_forward(p, Precision::Emulate);
    EXPECT_TRUE(std::isfinite(ideal[0]) && ideal[0] > 0x1p112) << name(mode) << " " << ideal[0];
    EXPECT_EQ(emu[0], HUGE_VAL) << name(mode);
  }
}

// ------------------------------------------------------------------ plain-loop model

// The forward written as the definition reads, token by token, through RankExperts' accessors.
std::vector<double> model_forward(const ReferenceProblem& p, Precision precision) {
  const RankExperts& ex = *p.experts;
  const int H = ex.config.hidden, I = ex.config.intermediate, K = p.routing->top_k;
  const bool emu = precision == Precision::Emulate;
  std::vector<double> out(size_t(p.tokens) * H, 0.0);
  for (int t = 0; t < p.tokens; ++t) {
    std::vector<double> x(H);
    std::vector<float> xf(H);
    for (int k = 0; k < H; ++k) xf[k] = bf16_bits_to_float(p.x_bf16[size_t(t) * H + k]);
    if (emu && p.mode == Mode::Mxfp8) {
      const Mxfp8Matrix q = quantize_mxfp8(xf, 1, H);
      for (int k = 0; k < H; ++k) x[k] = q.at(0, k);
    } else {
      for (int k = 0; k < H; ++k) x[k] = xf[k];
    }
    std::vector<double> acc(H, 0.0);
    for (int s = 0; s < K; ++s) {
      const int e = p.routing->ids[size_t(t) * K + s] - ex.first_expert;
      if (e < 0 || e >= ex.num_local) continue;
      std::vector<double> h(2 * I), a(I), y(H);
      for (int n = 0; n < 2 * I; ++n) {
        double v = 0.0;
        for (int k = 0; k < H; ++k) v += x[k] * ex.w13(e, n, k);
        h[n] = emu ? double(float(v)) : v;
      }
      std::vector<float> af(I);
      for (int i = 0; i < I; ++i) {
        a[i] = model_activation(p.activation, p.params, h[i], h[I + i]);
        af[i] = float(a[i]);
      }
      if (emu && p.mode == Mode::A16)
        for (int i = 0; i < I; ++i) a[i] = double(round_to_bf16(af[i]));
      if (emu && p.mode == Mode::Mxfp8) {
        const Mxfp8Matrix q = quantize_mxfp8(af, 1, I);
        for (int i = 0; i < I; ++i) a[i] = q.at(0, i);
      }
      for (int j = 0; j < H; ++j) {
        double v = 0.0;
        for (int i = 0; i < I; ++i) v += a[i] * ex.w2(e, j, i);
        y[j] = emu ? double(float(v)) : v;
      }
      const double w = p.routing->weights[size_t(t) * K + s];
      for (int j = 0; j < H; ++j) acc[j] += w * y[j];
    }
    for (int j = 0; j < H; ++j) out[size_t(t) * H + j] = emu ? to_bf16(acc[j]) : acc[j];
  }
  return out;
}

struct RandomCase {
  MoeConfig config;
  RankExperts experts;
  std::vector<uint16_t> x;
  Routing routing;
  RandomCase(int H, int I, int E, int K, int T, ExpertParallel ep = {1, 0}, uint64_t seed = 1)
      : config(k3test::small_config(H, I, E, K)),
        experts(k3test::random_experts(config, ep, seed)),
        x(k3test::random_tokens(T, H, seed + 1)),
        routing(k3test::random_routing(T, config, seed + 2)) {}
  ReferenceProblem problem(Mode mode, Activation act, const ActivationParams& params = {}) const {
    return {&experts, routing.tokens, x, &routing, mode, act, params};
  }
};

TEST(ReferenceForward, MatchesThePlainLoopModel) {
  // H = 64, I = 96 (not a power of two), 8 experts, K = 3, 7 tokens, one slot emptied.
  RandomCase rc(64, 96, 8, 3, 7);
  rc.routing.ids[4] = -1;
  for (const ActivationParams& params : {ActivationParams{}, kOtherParams})
    for (Activation act : kActivations)
      for (Mode mode : kModes) {
        const ReferenceProblem p = rc.problem(mode, act, params);
        // Ideal: the two compute the same dot products in different orders (four partial sums vs
        // one). Each differs by <= 2 (n - 1) u sum|terms| (u = 2^-53, n <= 96), i.e. relative
        // <= 2 (n - 1) u sqrt(n) ~ 2e-13 for random-sign terms, through two GEMMs: 1e-12.
        const Comparison ci = compare(reference_forward(p, Precision::Ideal), model_forward(p, Precision::Ideal));
        EXPECT_LT(ci.rel_l2, 1e-12) << name(act) << " " << name(mode) << " " << name(params);
        EXPECT_EQ(ci.nonfinite_mismatch, 0);
        // Emulate: every product in both GEMMs is exact in double (bf16/E4M3 x E2M1 x powers of
        // two) and the sums span well under 53 bits here, so the dot products are exact in any
        // order and the outputs agree bit for bit.
        EXPECT_EQ(reference_forward(p, Precision::Emulate), model_forward(p, Precision::Emulate))
            << name(act) << " " << name(mode) << " " << name(params);
      }
}

TEST(ReferenceForward, TokenChunksDoNotChangeTheResult) {
  // The reference processes tokens in chunks (64 MiB of per-pair buffers: ~50 tokens at full K3
  // size); chunks of 1 and 3 over 10 tokens must give the one-chunk result bit for bit.
  RandomCase rc(64, 64, 8, 3, 10);
  rc.routing.ids[7] = -1;
  for (Mode mode : kModes)
    for (Precision prec : {Precision::Ideal, Precision::Emulate}) {
      const ReferenceProblem p = rc.problem(mode, Activation::Situ);
      const auto whole = reference_forward(p, prec);
      EXPECT_EQ(detail::reference_forward_chunked(p, prec, 3), whole) << name(mode);
      EXPECT_EQ(detail::reference_forward_chunked(p, prec, 1), whole) << name(mode);
      EXPECT_EQ(detail::reference_forward_chunked(p, prec, 1000), whole) << name(mode);
    }
}

// ------------------------------------------------------------------ expert parallelism

TEST(ReferenceForward, ExpertParallelRanksSumToTheSingleRank) {
  const int H = 64, I = 64, E = 8, K = 3, T = 9;
  RandomCase full(H, I, E, K, T);
  const RankExperts r0 = k3test::random_experts(full.config, {2, 0}, 1);
  const RankExperts r1 = k3test::random_experts(full.config, {2, 1}, 1);
  ASSERT_EQ(r1.first_expert, 4);
  for (Activation act : kActivations)
    for (Mode mode : kModes) {
      const ReferenceProblem pf = full.problem(mode, act);
      ReferenceProblem p0 = pf, p1 = pf;
      p0.experts = &r0, p1.experts = &r1;
      for (Precision prec : {Precision::Ideal, Precision::Emulate}) {
        const auto of = reference_forward(pf, prec);
        const auto o0 = reference_forward(p0, prec), o1 = reference_forward(p1, prec);
        // A rank computes exactly what the single rank computes with the other rank's ids made -1.
        for (int rank = 0; rank < 2; ++rank) {
          Routing masked = full.routing;
          for (auto& id : masked.ids)
            if (id / 4 != rank) id = -1;
          ReferenceProblem pm = pf;
          pm.routing = &masked;
          EXPECT_EQ(reference_forward(pm, prec), rank == 0 ? o0 : o1) << "rank " << rank;
        }
        std::vector<double> sum(of.size());
        for (size_t i = 0; i < of.size(); ++i) sum[i] = o0[i] + o1[i];
        if (prec == Precision::Ideal) {
          // Same K terms w_k y_k, summed per rank then added instead of in slot order: each
          // element is within (2K - 1) u sum_k |w_k y_k| (u = 2^-53), and for independent terms
          // ||sum_k |w_k y_k| || ~ sqrt(K) ||out||: rel-L2 <= (2K - 1) u sqrt(K) ~ 1e-15.
          const Comparison c = compare(sum, of);
          EXPECT_LT(c.rel_l2, 1e-14) << name(act) << " " << name(mode);
          EXPECT_EQ(c.nonfinite_mismatch, 0);
        } else {
          // Each output is bf16(fp32(s)) of its double sum s: within 2^-24 + 2^-8 (1 + 2^-24)
          // of s relative, so within 2^-8 * 1.0041 |out| of s; the partial sums add up to the
          // full one (to double precision): the error is at most 2^-8 * 1.005 (|o0| + |o1| + |of|).
          for (size_t i = 0; i < of.size(); ++i)
            EXPECT_NEAR(sum[i], of[i], 0x1p-8 * 1.005 * (std::fabs(o0[i]) + std::fabs(o1[i]) + std::fabs(of[i])) + 1e-300)
                << name(act) << " " << name(mode) << " element " << i;
        }
      }
    }
}

TEST(ReferenceForward, EmptySlotsContributeNothing) {
  RandomCase rc(64, 64, 8, 4, 5);
  Routing with_empty = rc.routing, zero_weight = rc.routing;
  for (size_t i = 1; i < with_empty.ids.size(); i += 3) {
    with_empty.ids[i] = -1;
    zero_weight.weights[i] = 0.0f;  // the same slot, kept but weighed 0: adds +-0 to every sum
  }
  for (Precision prec : {Precision::Ideal, Precision::Emulate}) {
    ReferenceProblem pe = rc.problem(Mode::A16, Activation::Situ), pz = pe;
    pe.routing = &with_empty, pz.routing = &zero_weight;
    EXPECT_EQ(reference_forward(pe, prec), reference_forward(pz, prec));
  }
  Routing all_empty = rc.routing;
  std::fill(all_empty.ids.begin(), all_empty.ids.end(), -1);
  ReferenceProblem p = rc.problem(Mode::Mxfp8, Activation::Situ);
  p.routing = &all_empty;
  for (double v : reference_forward(p, Precision::Emulate)) ASSERT_EQ(v, 0.0);
}

TEST(ReferenceForward, RejectsInvalidIdsNamingTokenAndSlot) {
  RandomCase rc(32, 32, 8, 2, 5, {2, 1});
  for (int32_t bad : {8, -2, 12345}) {
    Routing r = rc.routing;
    r.ids[3 * 2 + 1] = bad;  // token 3, slot 1
    ReferenceProblem p = rc.problem(Mode::A16, Activation::Situ);
    p.routing = &r;
    try {
      reference_forward(p, Precision::Ideal);
      ADD_FAILURE() << "id " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 3 slot 1"), std::string::npos) << e.what();
    }
  }
}

TEST(ReferenceForward, RejectsInconsistentInputs) {
  RandomCase rc(32, 32, 8, 2, 5);
  // Each problem breaks one rule and must get that rule's message.
  using testing::expect_error;
  ReferenceProblem p = rc.problem(Mode::A16, Activation::Situ);
  Routing four = rc.routing;
  four.tokens = 4;  // x holds 5
  p.routing = &four;
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"routing holds 4 tokens, x holds 5"});
  p = rc.problem(Mode::A16, Activation::Situ);
  p.x_bf16 = p.x_bf16.subspan(1);
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"x must be [5, 32]", "got 159 values"});
  p = rc.problem(Mode::A16, Activation::Situ);
  p.experts = nullptr;
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"problem.experts is null"});
  // The activation's parameters and the enums, as MoePlan::create checks them: a beta of 0 made
  // the output silently zero, an unknown enum ran another variant.
  p = rc.problem(Mode::A16, Activation::Situ);
  p.params.situ_beta = 0.0f;
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"situ_beta must be finite and > 0, got 0"});
  p.params.situ_beta = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"situ_beta must be finite"});
  p = rc.problem(Mode::A16, Activation(7));
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"activation must be Situ, Swiglu or SwigluOai, got 7"});
  p = rc.problem(Mode(5), Activation::Situ);
  expect_error([&] { reference_forward(p, Precision::Ideal); }, {"mode must be A16 or Mxfp8, got 5"});
  p = rc.problem(Mode::A16, Activation::Situ);
  expect_error([&] { reference_forward(p, Precision(9)); }, {"precision must be Ideal or Emulate, got 9"});
  RankExperts broken = rc.experts;
  broken.w2_scale.pop_back();
  p = rc.problem(Mode::A16, Activation::Situ);
  p.experts = &broken;
  try {
    reference_forward(p, Precision::Ideal);
    ADD_FAILURE() << "short w2_scale accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w2_scale"), std::string::npos) << e.what();
  }
}

TEST(ReferenceForward, ZeroTokens) {
  RandomCase rc(32, 32, 8, 2, 0);
  for (Precision prec : {Precision::Ideal, Precision::Emulate})
    EXPECT_TRUE(reference_forward(rc.problem(Mode::Mxfp8, Activation::Situ), prec).empty());
}

TEST(ReferenceForward, NaNInOneTokenPoisonsOnlyItsRow) {
  const int H = 64;
  RandomCase clean(H, 64, 8, 3, 6);
  std::vector<uint16_t> dirty = clean.x;
  dirty[size_t(2) * H + 5] = 0x7FC0;   // NaN in token 2: its whole row becomes NaN
  dirty[size_t(4) * H + 40] = 0x7F80;  // +Inf in token 4 (SiTU is bounded: the row may stay finite)
  for (Mode mode : kModes)
    for (Activation act : kActivations)
      for (Precision prec : {Precision::Ideal, Precision::Emulate}) {
        ReferenceProblem pc = clean.problem(mode, act), pd = pc;
        pd.x_bf16 = dirty;
        const auto oc = reference_forward(pc, prec), od = reference_forward(pd, prec);
        for (int t = 0; t < 6; ++t)
          for (int j = 0; j < H; ++j) {
            const size_t i = size_t(t) * H + j;
            if (t == 2) {
              EXPECT_TRUE(std::isnan(od[i])) << name(act) << " " << name(mode) << " element " << j;
            } else if (t != 4) {
              EXPECT_EQ(od[i], oc[i]) << name(act) << " " << name(mode) << " token " << t << " element " << j;
            }
          }
      }
}

// ------------------------------------------------------------------ Ideal vs Emulate distance
//
// Predicted rel-L2(Emulate, Ideal), from the roundings each mode applies (u = unit roundoff):
//   One RNE rounding to p significant bits has relative error uniform within +-2^-p of the
//   binade's base; for values spread log-uniformly over a binade the RMS relative error is
//   2^-p sqrt(E[1/m^2] / 3) with E[1/m^2] = 3 / (8 ln 2) = 0.541 (m in [1, 2)): 0.425 * 2^-p.
//   bf16 (p = 8): 1.66e-3.   E4M3 (p = 4, MX scaling keeps gaussian groups in the normal range):
//   2.66e-2.
//   Independent relative errors on the inputs of a random-weight GEMM reach its outputs with the
//   same RMS relative size, and the combine keeps it (the K expert outputs are independent).
//   a16:   a -> bf16, out -> bf16:                      sqrt(2) * 1.66e-3 = 2.35e-3
//   mxfp8: x -> E4M3 (through GEMM1 and the activation, whose gate and up halves each pass
//          their input's relative error at gain ~1: sqrt(2) * 2.66e-2), a -> E4M3 (2.66e-2),
//          out -> bf16: sqrt(2 + 1) * 2.66e-2 = 4.6e-2
// fp32 roundings of h and y add ~1e-8. The six cases land within -10..+2 % of the prediction (a
// fixed seed); the test allows 20 % either way. A wrong rounding leaves that window: in a16 one
// bf16 rounding missing gives 1/sqrt(2) of the prediction, one extra sqrt(3/2); in mxfp8 a missing
// E4M3 rounding of a gives sqrt(2/3), a bf16 in place of an E4M3 one ~sqrt(2/3).
TEST(ReferenceForward, EmulateDistanceToIdealMatchesThePrecisionOfEachMode) {
  RandomCase rc(256, 256, 16, 4, 48);
  for (Activation act : kActivations)
    for (Mode mode : kModes) {
      const ReferenceProblem p = rc.problem(mode, act);
      const Comparison c = compare(reference_forward(p, Precision::Emulate), reference_forward(p, Precision::Ideal));
      const double predicted = mode == Mode::A16 ? 2.35e-3 : 4.6e-2;
      EXPECT_GT(c.rel_l2, predicted * 0.8) << name(act) << " " << name(mode);
      EXPECT_LT(c.rel_l2, predicted * 1.2) << name(act) << " " << name(mode);
      EXPECT_GT(c.cosine, 1.0 - 0.5 * (1.2 * predicted) * (1.2 * predicted)) << name(act) << " " << name(mode);
      EXPECT_EQ(c.nonfinite_mismatch, 0);
      std::printf("  %-10s %-5s rel_l2 %.3e (predicted %.2e)  cosine %.7f\n", name(act),
                  name(mode), c.rel_l2, predicted, c.cosine);
    }
}

}  // namespace
}  // namespace k3moe
