// The validation matrix of the GPU forward: every case runs the plan on the GPU and compares with
// the float64 reference on the same quantized inputs, checks determinism (three eager runs, CUDA
// graph capture and replays, also with new data in the same buffers), that every output element
// was written (outputs are pre-filled with NaN), and that non-finite outputs appear exactly where
// the reference has them. `k3moe validate` prints it; tests/gpu runs it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/plan.h"
#include "k3moe/reference.h"

namespace k3moe::validation {

enum class RoutingKind {
  Logits,        // router logits + bias, routed on the GPU inside forward (ids checked too)
  Skewed,        // 70 % of slots on experts 0 and 1
  OneExpert,     // every token's first slot on the same expert
  Duplicate,     // every slot of every token on the same expert (rows per expert = T K)
  EmptyExperts,  // only even experts receive tokens
  MinusOne,      // 30 % of slots are -1
  Garbage,       // the last tokens' ids are garbage (>= E, < -1), as CUDA-graph padding may hold
};

// NanWeightScale: one W13 scale byte is 255. ExtremeScales: every weight scale drawn from
// {0, 1, 2, 100, 127, 128}, the ends of the range the kernels take.
enum class Poison { None, NanX, InfX, NanWeightScale, ExtremeScales };

struct Case {
  std::string shape;  // "reduced", "ep32-896", "k3-local28"
  MoeConfig config;
  ExpertParallel ep;
  Mode mode = Mode::A16;
  Activation activation = Activation::Situ;
  int tokens = 1;
  RoutingKind routing = RoutingKind::Logits;
  Poison poison = Poison::None;
  bool ep_sum_check = false;  // also run every rank of ep.size: their outputs must sum to rank-1's
  int splits = 0;             // > 0: force this K split on both GEMMs (PlanOptions::gemm*_splits)
  int unit_rows = 0;          // > 0: force the weight rows per unit on both GEMMs (PlanOptions::gemm*_unit_rows)
  GemmKernel kernel = GemmKernel::Auto;  // Wgmma: force the wgmma kernel (its tile by the rows)
  uint64_t seed = 1;  // experts and inputs; the matrix derives it from the other fields (case_seed)
};

struct Tolerance {
  double rel_l2;        // vs the mode-emulating reference
  double ideal_rel_l2;  // vs the ideal float64 result (about 2x the mode's own rounding error)
};
// The tolerances and their derivation: docs/PRECISION.md.
Tolerance tolerance(Mode mode);

struct Result {
  Case spec;
  Comparison vs_emulate, vs_ideal;
  int experts_hit = 0;
  bool ids_exact = true;
  bool finite_mask_ok = true;
  bool repeat_bitwise = true;
  bool graph_bitwise = true;
  double ep_sum_rel_l2 = 0.0;
  bool pass = false;
  std::string failure;
  double seconds = 0.0;
};

std::vector<Case> matrix(bool quick);
// The MoePlan options a case runs with.
PlanOptions plan_options(const Case& c);
// Runs one case on GPU 0. Never throws for a failed check (the Result says why); throws
// k3moe::Error when the case cannot run at all.
Result run(const Case& c);

std::string routing_name(RoutingKind r);
std::string poison_name(Poison p);
std::string header_line();
std::string result_line(const Result& r);
// The results with the device, driver, commit and date they were read on.
std::string results_json(const std::vector<Result>& results, const std::string& commit);

}  // namespace k3moe::validation
