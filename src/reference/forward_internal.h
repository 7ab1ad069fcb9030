// Internal to the reference: the forward with an explicit token-chunk size, so that tests can cross
// chunk boundaries without the token counts the default 64 MiB chunk budget would need.
#pragma once

#include <vector>

#include "k3moe/reference.h"

namespace k3moe::detail {

// Emulations other than the contract's, for the tests of the validation matrix's bounds
// (tests/gpu/test_tolerance.cpp): another fp32 summation order the kernels could have, and the
// roundings a defect would make instead of the contract's.
struct EmulationVariant {
  bool fp32_block_sums = false;      // GEMM sums in fp32 over blocks of 16 products (each block exact)
  bool truncate_activation = false;  // a16: the activation truncated to bf16, not rounded to nearest
  bool truncate_output = false;      // the output truncated to bf16, not rounded to nearest
};

// reference_forward() processing `chunk_tokens` (>= 1) tokens at a time; `variant` applies to
// Precision::Emulate only.
std::vector<double> reference_forward_chunked(const ReferenceProblem& problem, Precision precision,
                                              int chunk_tokens, const EmulationVariant& variant = {});

}  // namespace k3moe::detail
