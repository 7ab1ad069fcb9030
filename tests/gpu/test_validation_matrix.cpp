// The quick validation matrix (src/validation): every case must pass. `k3moe validate` runs the
// full matrix.
#include <gtest/gtest.h>

#include <ostream>

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

}  // namespace
}  // namespace k3moe::validation
