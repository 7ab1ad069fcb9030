// Synthetic Kimi-K3-format checkpoints with realistic data, reproducible from a seed.
//
// Weights are random normal with a per-row standard deviation drawn log-uniformly from
// [0.5, 2] x 1/sqrt(fan_in), then MXFP4-quantized (round-up scale rule), so per-group scales
// spread over several binades as in a trained model. Every (layer, expert, tensor) has its own
// random stream, so one expert can be generated without the others, and generation runs in
// parallel: synthesize_experts() returns exactly the bytes write_synthetic_checkpoint() writes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "k3moe/checkpoint.h"
#include "k3moe/config.h"
#include "k3moe/experts.h"
#include "k3moe/progress.h"

namespace k3moe {

struct SyntheticSpec {
  MoeConfig config;             // num_layers etc. are written to config.json as given
  uint64_t seed = 0;
  std::vector<int> layers;      // MoE layers to write (empty: the first MoE layer)
  int num_shards = 4;           // experts are spread over this many shards (>= 1)
  std::string prefix = "model.";  // tensor-name prefix, e.g. "language_model.model."
  int threads = 0;              // 0: all hardware threads
};

// Writes config.json, model.safetensors.index.json and the shards into `dir` (created; existing
// files of the same names are replaced). Each MoE layer also gets its router (gate weight, bias).
// The files are written into a staging directory inside `dir` and moved in once all are complete,
// config.json last: a failure while writing them (memory, a full disk) leaves `dir` as it was, and
// one while moving them in (a rename) leaves no config.json or index of the new checkpoint.
void write_synthetic_checkpoint(const std::filesystem::path& dir, const SyntheticSpec& spec,
                                const ProgressFn& progress = {});

// The same experts write_synthetic_checkpoint() writes for (spec.seed, layer), generated in memory.
RankExperts synthesize_experts(const SyntheticSpec& spec, int layer, ExpertParallel ep,
                               const ProgressFn& progress = {});
Router synthesize_router(const SyntheticSpec& spec, int layer);

}  // namespace k3moe
