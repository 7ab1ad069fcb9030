// The bench's per-input-set aggregation (bench_sets.h).
#include "bench_sets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "expect_error.h"

namespace k3moe::cli {
namespace {

TEST(BenchSets, EachSetsMedianFromTheCallsThatRanIt) {
  // Three sets, the first timed call runs set 2 (after warm-up calls): calls 0, 3, 6 ran set 2,
  // calls 1, 4, 7 set 0, calls 2, 5, 8 set 1.
  const std::vector<double> in_order = {30, 10, 20, 31, 12, 22, 90, 11, 21};
  EXPECT_EQ(median_per_set(in_order, 2, 3), (std::vector<double>{11, 21, 31}));
}

TEST(BenchSets, EvenCountsTakeTheMeanOfTheMiddleTwo) {
  const std::vector<double> in_order = {1, 100, 3, 300, 2, 200, 10, 1000};  // set 0: 1 3 2 10; set 1: 100 300 200 1000
  EXPECT_EQ(median_per_set(in_order, 0, 2), (std::vector<double>{2.5, 250}));
}

TEST(BenchSets, TheMixedSeriesMedianIsNotTheMeanOfTheSets) {
  // Why the bench reports per set: one fast set and three slow ones put the median of the mixed
  // series at the slow sets' time, while the floor from the mean routing counts the fast set too.
  std::vector<double> in_order;
  for (int i = 0; i < 40; ++i) in_order.push_back(i % 4 == 0 ? 20.0 : 40.0);
  EXPECT_DOUBLE_EQ(mean_of(median_per_set(in_order, 0, 4)), 35.0);
  std::vector<double> sorted = in_order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted[sorted.size() / 2], 40.0);
}

TEST(BenchSets, RejectsASeriesThatLeavesASetUntimed) {
  const std::vector<double> three = {1, 2, 3}, one = {1}, none;
  testing::expect_error([&] { median_per_set(three, 0, 4); }, {"3 timed calls leave one of 4 input sets untimed"});
  testing::expect_error([&] { median_per_set(one, 0, 0); }, {"sets must be > 0"});
  testing::expect_error([&] { mean_of(none); }, {"no values"});
}

}  // namespace
}  // namespace k3moe::cli
