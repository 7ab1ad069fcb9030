// The Kimi-K3 checkpoint contract: compressed-tensors MXFP4 experts in safetensors shards.
//
// A checkpoint directory holds config.json, model.safetensors.index.json ("weight_map": tensor
// name -> shard file) and the shards (or a single model.safetensors). Expert tensors are named
// {prefix}layers.{L}.mlp.experts.{e}.w{1,2,3}.weight_{packed,scale}; the prefix ("model.",
// "language_model.model.", ...) differs between exports and is resolved from the index.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/experts.h"
#include "k3moe/progress.h"

namespace k3moe {

// The router of one MoE layer: mlp.gate.weight [E, model_hidden] (bf16 in the file) and
// mlp.gate.e_score_correction_bias [E] (bf16 or fp32 in the file), both widened to fp32.
struct Router {
  int num_experts = 0;
  int model_hidden = 0;
  std::vector<float> weight;  // [E, model_hidden]
  std::vector<float> bias;    // [E]
};

class Checkpoint {
 public:
  // Reads config.json and the index (or the single model.safetensors); validates the config and
  // resolves the prefix. Shards are opened lazily. Throws k3moe::Error naming the file.
  static Checkpoint open(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::filesystem::path& dir() const;
  const MoeConfig& config() const;
  const std::string& prefix() const;
  std::vector<int> moe_layers() const;  // layers with expert tensors in the index, ascending
  int num_shards() const;

  // "{prefix}layers.{layer}.mlp.experts.{expert}.{which}.{part}", which = w1|w2|w3,
  // part = weight_packed|weight_scale.
  std::string expert_tensor_name(int layer, int expert, const std::string& which,
                                 const std::string& part) const;

  // Loads the experts [r E/P, (r+1) E/P) of `layer` for rank `ep`, reading only those tensors'
  // bytes. Every tensor is checked against the config (dtype U8, shape). W13 = [W1; W3].
  RankExperts load_experts(int layer, ExpertParallel ep, const ProgressFn& progress = {}) const;
  Router load_router(int layer) const;

  // Bytes of the rank's expert tensors in the files (what load_experts reads).
  int64_t rank_bytes(int layer, ExpertParallel ep) const;

  // Checks every expert and router tensor of `layer` (all MoE layers when empty) against the
  // config, from the headers alone. Returns one line per problem; empty means valid.
  std::vector<std::string> validate(std::optional<int> layer = std::nullopt) const;

 private:
  struct Impl;
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3moe
