// compare(): relative L2 and cosine over the elements finite in both vectors, and the count of
// non-finite mismatches.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "k3moe/error.h"
#include "k3moe/reference.h"

namespace k3moe {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

TEST(Compare, IdenticalVectors) {
  const std::vector<double> a = {1.0, -2.0, 3.5, 0.0};
  const Comparison c = compare(a, a);
  EXPECT_EQ(c.rel_l2, 0.0);
  EXPECT_DOUBLE_EQ(c.cosine, 1.0);
  EXPECT_EQ(c.nonfinite_mismatch, 0);
}

TEST(Compare, KnownValues) {
  // actual = expected + (0, 0, 1) with ||expected|| = 5: rel = 1/5; cosine = 25 / (5 sqrt(26)).
  const std::vector<double> expected = {3.0, 4.0, 0.0}, actual = {3.0, 4.0, 1.0};
  const Comparison c = compare(actual, expected);
  EXPECT_DOUBLE_EQ(c.rel_l2, 0.2);
  EXPECT_DOUBLE_EQ(c.cosine, 25.0 / (5.0 * std::sqrt(26.0)));
  const Comparison o = compare(std::vector<double>{1.0, 0.0}, std::vector<double>{0.0, 2.0});
  EXPECT_DOUBLE_EQ(o.rel_l2, std::sqrt(5.0) / 2.0);
  EXPECT_EQ(o.cosine, 0.0);
  const Comparison n = compare(std::vector<double>{-1.0, -2.0}, std::vector<double>{1.0, 2.0});
  EXPECT_DOUBLE_EQ(n.rel_l2, 2.0);
  EXPECT_DOUBLE_EQ(n.cosine, -1.0);
}

TEST(Compare, NonFiniteElementsAreCountedNotMeasured) {
  const std::vector<double> expected = {1.0, kNaN, 2.0, kInf, kNaN, kInf, -kInf, 3.0, 5.0};
  const std::vector<double> actual   = {1.0, kNaN, kNaN, kInf, kInf, -kInf, 7.0, 3.0, 5.0};
  // mismatches: 2.0 vs NaN, NaN vs Inf, Inf vs -Inf, -Inf vs 7; NaN/NaN and Inf/Inf agree.
  const Comparison c = compare(actual, expected);
  EXPECT_EQ(c.nonfinite_mismatch, 4);
  EXPECT_EQ(c.rel_l2, 0.0) << "the finite pairs (1, 3, 5) agree";
  EXPECT_DOUBLE_EQ(c.cosine, 1.0);
}

TEST(Compare, ZeroNorms) {
  const std::vector<double> zero(3, 0.0), one = {0.0, 1.0, 0.0};
  EXPECT_EQ(compare(zero, zero).rel_l2, 0.0);
  EXPECT_EQ(compare(zero, zero).cosine, 1.0);
  EXPECT_TRUE(std::isinf(compare(one, zero).rel_l2));
  EXPECT_EQ(compare(one, zero).cosine, 0.0);
  EXPECT_EQ(compare(zero, one).rel_l2, 1.0);
  EXPECT_EQ(compare(zero, one).cosine, 0.0);
  const Comparison empty = compare({}, {});
  EXPECT_EQ(empty.rel_l2, 0.0);
  EXPECT_EQ(empty.cosine, 1.0);
}

TEST(Compare, SizeMismatchThrows) {
  EXPECT_THROW(compare(std::vector<double>(3), std::vector<double>(4)), Error);
}

}  // namespace
}  // namespace k3moe
