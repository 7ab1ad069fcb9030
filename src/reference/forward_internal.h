// Internal to the reference: the forward with an explicit token-chunk size, so that tests can cross
// chunk boundaries without the token counts the default 64 MiB chunk budget would need.
#pragma once

#include <vector>

#include "k3moe/reference.h"

namespace k3moe::detail {

// reference_forward() processing `chunk_tokens` (>= 1) tokens at a time.
std::vector<double> reference_forward_chunked(const ReferenceProblem& problem, Precision precision,
                                              int chunk_tokens);

}  // namespace k3moe::detail
