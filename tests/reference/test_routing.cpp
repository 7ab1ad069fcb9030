// The reference router (reference.h) against the contract: sigmoid in float64 rounded once, biased
// selection with ties to the lower id and NaN below every number, unbiased renormalised weights;
// non-finite logits and biases never yield out-of-range or duplicate ids or non-finite weights.
// A selection-sort model written here (a different algorithm from the library's partial sort)
// checks random rows.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "expect_error.h"
#include "k3moe/error.h"
#include "k3moe/reference.h"
#include "reference_fixtures.h"

namespace k3moe {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

MoeConfig router_config(int experts, int top_k) { return k3test::small_config(32, 32, experts, top_k); }

// The model: pick K times the best unpicked expert scanning ids upward; "better" is strictly larger
// choice, a number beats NaN; so the first of equal choices (the lower id) wins.
struct ModelRow {
  std::vector<int> ids;
  std::vector<float> weights;
};
ModelRow model_route(const float* logits, const float* bias, int E, int K, bool renormalize, float scaling) {
  std::vector<float> s(E), choice(E);
  for (int e = 0; e < E; ++e) {
    s[e] = float(1.0 / (1.0 + std::exp(-double(logits[e]))));
    choice[e] = s[e] + bias[e];
  }
  std::vector<bool> taken(E, false);
  ModelRow row;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (taken[e]) continue;
      if (best < 0) { best = e; continue; }
      const bool e_nan = std::isnan(choice[e]), b_nan = std::isnan(choice[best]);
      if ((!e_nan && b_nan) || (!e_nan && !b_nan && choice[e] > choice[best])) best = e;
    }
    taken[best] = true;
    row.ids.push_back(best);
  }
  float sum = 0.0f;
  for (int id : row.ids) {
    row.weights.push_back(std::isnan(s[id]) ? 0.0f : s[id]);
    sum += row.weights.back();
  }
  for (float& w : row.weights) w = (renormalize ? w / (sum + 1e-20f) : w) * scaling;
  return row;
}

TEST(RoutingSigmoid, SpecialValues) {
  EXPECT_EQ(routing_sigmoid(0.0f), 0.5f);
  EXPECT_EQ(routing_sigmoid(-0.0f), 0.5f);
  EXPECT_EQ(routing_sigmoid(kInf), 1.0f);
  EXPECT_EQ(routing_sigmoid(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(routing_sigmoid(kNaN)));
  EXPECT_EQ(routing_sigmoid(100.0f), 1.0f);
  EXPECT_EQ(routing_sigmoid(-200.0f), 0.0f) << "e^-200 is below fp32's smallest subnormal";
  EXPECT_GT(routing_sigmoid(-100.0f), 0.0f) << "e^-100 ~ 3.7e-44 is an fp32 subnormal";
  EXPECT_EQ(routing_sigmoid(-FLT_MAX), 0.0f);
  EXPECT_EQ(routing_sigmoid(FLT_MAX), 1.0f);
}

TEST(RoutingSigmoid, IsFp32RoundedFloat64AndMonotone) {
  // The float64 value is within a few ulps of double (2^-50 relative) of the true sigmoid, so the
  // fp32 result is within half an fp32 ulp plus 2^-50 relative of the long-double sigmoid.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> wide(-40.0f, 40.0f);
  float prev_x = -kInf, prev_s = 0.0f;
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) xs.push_back(wide(rng));
  std::sort(xs.begin(), xs.end());
  for (float x : xs) {
    const float s = routing_sigmoid(x);
    const long double truth = 1.0L / (1.0L + std::exp(-(long double)x));
    const double half_ulp = 0.5 * double(std::nextafter(s, kInf) - s);
    ASSERT_LE(std::fabs((long double)s - truth), half_ulp + 0x1p-50 * double(truth)) << "x = " << x;
    ASSERT_GE(s, prev_s) << "not monotone between " << prev_x << " and " << x;
    prev_x = x, prev_s = s;
  }
}

TEST(Routing, EqualChoicesGoToTheLowerId) {
  const MoeConfig c = router_config(16, 4);
  std::vector<float> logits(16, 0.0f), bias(16, 0.0f);
  Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : r.weights) EXPECT_EQ(w, 0.25f) << "0.5 / (2 + 1e-20) in fp32";

  bias[9] = bias[5] = bias[3] = 1.0f;  // three equal best choices, then a 13-way tie
  r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 5, 9, 0}));
  for (float w : r.weights) EXPECT_EQ(w, 0.25f) << "the bias selects, it never weighs";

  bias.assign(16, 0.0f);
  logits.assign(16, -kInf);  // s = 0 everywhere but experts 12 and 7 (s = 0.5)
  logits[12] = logits[7] = 0.0f;
  r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{7, 12, 0, 1}));
  EXPECT_EQ(r.weights, (std::vector<float>{0.5f, 0.5f, 0.0f, 0.0f}));
}

TEST(Routing, NaNChoiceRanksBelowMinusInfinity) {
  const MoeConfig c = router_config(4, 4);
  const std::vector<float> logits = {0.0f, 0.0f, 1.0f, 2.0f};
  const std::vector<float> bias = {-kInf, kNaN, 0.0f, 0.0f};
  const Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2, 0, 1}));
  // Expert 1's score is 0.5 (only its choice is NaN): it still weighs.
  const float s1 = routing_sigmoid(1.0f), s2 = routing_sigmoid(2.0f);
  const float sum = ((s2 + s1) + 0.5f) + 0.5f;
  EXPECT_EQ(r.weights[3], 0.5f / (sum + 1e-20f));
  EXPECT_EQ(r.weights[0], s2 / (sum + 1e-20f));
}

TEST(Routing, NaNScoreWeighsZero) {
  const MoeConfig c = router_config(4, 4);
  const std::vector<float> logits = {kNaN, 1.0f, kNaN, 0.0f};
  const std::vector<float> bias(4, 0.0f);
  const Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 0, 2}));
  const float s1 = routing_sigmoid(1.0f), denom = (s1 + 0.5f) + 1e-20f;
  EXPECT_EQ(r.weights, (std::vector<float>{s1 / denom, 0.5f / denom, 0.0f, 0.0f}));
}

TEST(Routing, InfiniteLogits) {
  const MoeConfig c = router_config(8, 2);
  std::vector<float> logits(8, 0.0f), bias(8, 0.0f);
  logits[6] = kInf;   // s = 1
  logits[2] = -kInf;  // s = 0
  bias[2] = kInf;     // but chosen by the bias: choice = +Inf beats 1
  const Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(r.weights, (std::vector<float>{0.0f, 1.0f / (1.0f + 1e-20f)}));

  // Every chosen score 0: the 1e-20 keeps the weights finite (0 / 1e-20 = 0).
  std::vector<float> all_minus(8, -kInf);
  const Routing z = route_reference(all_minus, std::vector<float>(8, 0.0f), 1, c);
  EXPECT_EQ(z.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(z.weights, (std::vector<float>{0.0f, 0.0f}));
}

TEST(Routing, NonFiniteInputsNeverBreakIdsOrWeights) {
  // Logits and biases drawn from a mix of normal, huge, tiny, +-Inf and NaN values.
  const int E = 16, T = 4000;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  auto draw = [&] {
    switch (kind(rng)) {
      case 0: return kNaN;
      case 1: return kInf;
      case 2: return -kInf;
      case 3: return normal(rng) * 1e30f;
      case 4: return normal(rng) * 1e-30f;
      default: return normal(rng);
    }
  };
  for (int K : {1, 4, 16}) {
    for (bool renormalize : {true, false}) {
      MoeConfig c = router_config(E, K);
      c.renormalize = renormalize;
      c.routed_scaling_factor = 2.5f;
      std::vector<float> logits(size_t(T) * E), bias(size_t(T) * E);
      for (auto& v : logits) v = draw();
      for (auto& v : bias) v = (kind(rng) < 3) ? draw() : 0.01f * normal(rng);
      for (int t = 0; t < T; ++t) {
        const std::span<const float> row_logits(logits.data() + size_t(t) * E, E);
        const std::span<const float> row_bias(bias.data() + size_t(t) * E, E);
        const Routing r = route_reference(row_logits, row_bias, 1, c);
        const ModelRow m = model_route(row_logits.data(), row_bias.data(), E, K, renormalize, 2.5f);
        std::set<int> seen;
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) {
          ASSERT_TRUE(r.ids[k] >= 0 && r.ids[k] < E) << "token " << t << " slot " << k;
          ASSERT_TRUE(seen.insert(r.ids[k]).second) << "duplicate id " << r.ids[k] << ", token " << t;
          ASSERT_TRUE(std::isfinite(r.weights[k]) && r.weights[k] >= 0.0f) << "token " << t << " slot " << k;
          sum += r.weights[k];
        }
        ASSERT_EQ(std::vector<int>(r.ids.begin(), r.ids.end()), m.ids) << "token " << t;
        ASSERT_EQ(r.weights, m.weights) << "token " << t;
        if (renormalize && sum > 0.0f) {
          // The exact sum of the weights is 2.5 S / (S + 1e-20), S = the sum of the chosen scores
          // (>= sigmoid(-40) here, so the 1e-20 is below fp32 resolution). Rounding: K - 1 in the
          // library's fp32 sum of the scores, one per division, one per scaling, K - 1 in the sum
          // above: (2K + 1) u to first order, u = 2^-24; allow (2K + 2) u.
          double S = 0.0;
          for (int k = 0; k < K; ++k) {
            const double s = double(routing_sigmoid(row_logits[r.ids[k]]));
            S += std::isnan(s) ? 0.0 : s;
          }
          const double exact = 2.5 * S / (S + 1e-20);
          ASSERT_NEAR(sum, exact, exact * (2 * K + 2) * 0x1p-24) << "token " << t;
        }
      }
    }
  }
}

TEST(Routing, MatchesTheModelOnRandomRows) {
  for (int K : {1, 3, 8}) {
    MoeConfig c = router_config(64, K);
    const int T = 300;
    std::mt19937_64 rng(100 + K);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits(size_t(T) * 64), bias(64);
    for (auto& v : logits) v = std::round(normal(rng) * 4.0f) / 4.0f;  // coarse: many ties
    for (auto& v : bias) v = std::round(normal(rng)) / 8.0f;
    const Routing r = route_reference(logits, bias, T, c);
    ASSERT_EQ(r.tokens, T);
    ASSERT_EQ(r.top_k, K);
    for (int t = 0; t < T; ++t) {
      const ModelRow m = model_route(logits.data() + size_t(t) * 64, bias.data(), 64, K, true, 1.0f);
      for (int k = 0; k < K; ++k) {
        ASSERT_EQ(r.ids[size_t(t) * K + k], m.ids[k]) << "token " << t << " slot " << k;
        ASSERT_EQ(r.weights[size_t(t) * K + k], m.weights[k]) << "token " << t << " slot " << k;
      }
    }
  }
}

TEST(Routing, RenormalizeOffAndScalingFactor) {
  MoeConfig c = router_config(8, 3);
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 0.0f, 1.5f, -0.2f, 0.7f, 0.1f};
  const std::vector<float> bias(8, 0.0f);
  c.renormalize = false;
  c.routed_scaling_factor = 2.5f;
  Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4, 6}));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(r.weights[k], routing_sigmoid(logits[r.ids[k]]) * 2.5f);

  c.renormalize = true;
  r = route_reference(logits, bias, 1, c);
  const float s2 = routing_sigmoid(2.0f), s4 = routing_sigmoid(1.5f), s6 = routing_sigmoid(0.7f);
  const float denom = ((s2 + s4) + s6) + 1e-20f;
  EXPECT_EQ(r.weights, (std::vector<float>{s2 / denom * 2.5f, s4 / denom * 2.5f, s6 / denom * 2.5f}));
}

TEST(Routing, TopKEqualsNumExperts) {
  const MoeConfig c = router_config(6, 6);
  const std::vector<float> logits = {0.5f, -3.0f, 2.0f, 0.5f, kNaN, 1.0f};
  const std::vector<float> bias = {0.0f, 10.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const Routing r = route_reference(logits, bias, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 5, 0, 3, 4}));
  EXPECT_EQ(r.weights[5], 0.0f);
  float sum = 0.0f;
  for (float w : r.weights) sum += w;
  // K - 1 roundings in the library's sum of scores, one per division, K - 1 in the sum above:
  // (2K - 1) u with u = 2^-24 (the 1e-20 is below fp32 resolution at S ~ 3.5).
  EXPECT_NEAR(sum, 1.0f, (2 * 6 - 1) * 0x1p-24);
}

TEST(Routing, ZeroTokensAndBadInputs) {
  const MoeConfig c = router_config(8, 2);
  const Routing r = route_reference({}, std::vector<float>(8), 0, c);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
  // Each call breaks one rule and must get that rule's message.
  using testing::expect_error;
  const std::vector<float> bias(8);
  expect_error([&] { route_reference(std::vector<float>(15), bias, 2, c); }, {"logits must be [2, 8]", "got 15"});
  expect_error([&] { route_reference(std::vector<float>(16), std::vector<float>(7), 2, c); },
               {"bias must be [8]", "got 7"});
  expect_error([&] { route_reference({}, bias, -1, c); }, {"tokens must be >= 0", "got -1"});
  expect_error([&] { route_reference(std::vector<float>(8), bias, 1, router_config(8, 9)); },
               {"top_k must be in [1, num_experts = 8]", "got 9"});
  expect_error([&] { route_reference(std::vector<float>(8), bias, 1, router_config(8, 0)); },
               {"top_k must be in [1, num_experts = 8]", "got 0"});
  for (const float scaling : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    MoeConfig scaled = c;
    scaled.routed_scaling_factor = scaling;
    expect_error([&] { route_reference(std::vector<float>(16), bias, 2, scaled); },
                 {"routed_scaling_factor must be finite and > 0"});
  }
}

TEST(CheckRoutingIds, AcceptsValidIdsAndEmptySlots) {
  const std::vector<int32_t> ids = {0, 7, -1, 3, -1, -1};
  EXPECT_NO_THROW(check_routing_ids(ids, 2, 3, 8));
  EXPECT_NO_THROW(check_routing_ids({}, 0, 3, 8));
}

TEST(CheckRoutingIds, RejectsOutOfRangeIdsNamingTokenAndSlot) {
  for (int32_t bad : {8, 1000, -2, std::numeric_limits<int32_t>::min()}) {
    std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5};
    ids[5] = bad;  // token 1, slot 2
    try {
      check_routing_ids(ids, 2, 3, 8);
      ADD_FAILURE() << "id " << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token 1 slot 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(check_routing_ids(std::vector<int32_t>(5), 2, 3, 8), Error);  // wrong size
}

}  // namespace
}  // namespace k3moe
