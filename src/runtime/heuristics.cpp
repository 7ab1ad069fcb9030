#include "runtime/heuristics.h"

#include <cstdio>

namespace k3moe {

KernelChoice choose_kernels(const MoeConfig& config, int tokens) {
  KernelChoice choice;
  choice.expected_rows_per_expert = double(tokens) * config.top_k / config.num_experts;
  const double rows = choice.expected_rows_per_expert;
  choice.token_tile = rows <= 8.0 ? kernels::TokenTile::T8 : rows <= 16.0 ? kernels::TokenTile::T16
                                                                          : kernels::TokenTile::T32;
  return choice;
}

std::string KernelChoice::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "expert GEMMs: mma.sync bf16 m16n8k16, 256 weight rows x %d tokens per CTA "
                "(expected %.1f rows per expert)", 8 * int(token_tile), expected_rows_per_expert);
  return buf;
}

}  // namespace k3moe
