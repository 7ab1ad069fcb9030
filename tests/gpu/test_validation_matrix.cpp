// The quick validation matrix (src/validation): every case must pass. `k3moe validate` runs the
// full matrix.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <vector>

#include "gpu_test.h"
#include "validation/validation.h"

namespace k3moe::validation {

// gtest prints the case as its matrix row instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  Result r;
  r.spec = c;
  *os << result_line(r).substr(0, 60);
}

namespace {

class QuickMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(QuickMatrix, PassesAgainstReference) {
  K3MOE_REQUIRE_GPU();
  const Result r = run(GetParam());
  EXPECT_TRUE(r.pass) << header_line() << "\n" << result_line(r);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = c.shape + "_" + std::string(to_string(c.mode)) + "_" + std::string(to_string(c.activation)) +
                     "_T" + std::to_string(c.tokens) + "_" + routing_name(c.routing) + "_ep" +
                     std::to_string(c.ep.rank) + "of" + std::to_string(c.ep.size) + "_" + poison_name(c.poison) + "_" +
                     std::to_string(info.index);
  for (char& ch : name)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Gpu, QuickMatrix, ::testing::ValuesIn(matrix(true)), case_name);

// A case draws the same experts and inputs in either matrix, wherever it sits: its seed comes
// from its fields, so adding a case does not change the others' (host-only).
TEST(Matrix, ACaseSeedDependsOnTheCaseNotItsPlace) {
  const std::vector<Case> quick = matrix(true), full = matrix(false);
  const auto same_case = [](const Case& a, const Case& b) {
    return a.shape == b.shape && a.ep.size == b.ep.size && a.ep.rank == b.ep.rank && a.mode == b.mode &&
           a.activation == b.activation && a.tokens == b.tokens && a.routing == b.routing && a.poison == b.poison &&
           a.ep_sum_check == b.ep_sum_check && a.splits == b.splits && a.unit_rows == b.unit_rows &&
           a.kernel == b.kernel;
  };
  int shared = 0;
  for (const Case& q : quick)
    for (const Case& f : full)
      if (same_case(q, f) && q.seed == f.seed) ++shared;
  for (const Case& q : quick) {
    const bool in_full = std::any_of(full.begin(), full.end(), [&](const Case& f) { return same_case(q, f); });
    const bool same_seed =
        std::any_of(full.begin(), full.end(), [&](const Case& f) { return same_case(q, f) && q.seed == f.seed; });
    EXPECT_TRUE(!in_full || same_seed) << "quick case " << ::testing::PrintToString(q)
                                       << " has another seed in the full matrix";
  }
  EXPECT_GT(shared, int(quick.size()) / 2) << "most quick cases are full-matrix cases too";
}

}  // namespace
}  // namespace k3moe::validation
