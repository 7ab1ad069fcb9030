// k3moe make-checkpoint DIR: a synthetic Kimi-K3-format checkpoint (config.json, index, shards).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "k3moe/synthetic.h"

namespace k3moe::cli {
namespace {

struct Options {
  std::string dir;
  uint64_t seed = 0;
  std::vector<int> layers;
  int shards = 4;
  std::string prefix = "model.";
  bool reduced = false;
  std::optional<int> hidden, intermediate, experts, top_k, model_hidden;
  int threads = 0;
};

MoeConfig config_for(const Options& o) {
  MoeConfig c = MoeConfig::kimi_k3();
  if (o.reduced) {
    c.hidden = 256;
    c.intermediate = 128;
    c.num_experts = 32;
    c.top_k = 4;
    c.model_hidden = 512;
  }
  if (o.hidden) c.hidden = *o.hidden;
  if (o.intermediate) c.intermediate = *o.intermediate;
  if (o.experts) c.num_experts = *o.experts;
  if (o.top_k) c.top_k = *o.top_k;
  if (o.model_hidden) c.model_hidden = *o.model_hidden;
  c.validate();
  return c;
}

void run(const Options& o) {
  SyntheticSpec spec;
  spec.config = config_for(o);
  spec.seed = o.seed;
  spec.layers = o.layers;
  spec.num_shards = o.shards;
  spec.prefix = o.prefix;
  spec.threads = o.threads;
  const MoeConfig& c = spec.config;
  // The generator writes each listed layer once.
  const std::set<int> layers = o.layers.empty() ? std::set<int>{c.first_moe_layer()}
                                                 : std::set<int>(o.layers.begin(), o.layers.end());

  std::printf("make-checkpoint %s\n", o.dir.c_str());
  std::printf("  H %d  I %d  E %d  top-k %d  model hidden %d  seed %llu  prefix '%s'\n", c.hidden,
              c.intermediate, c.num_experts, c.top_k, c.model_hidden, static_cast<unsigned long long>(o.seed),
              o.prefix.c_str());
  std::printf("  layers");
  for (int l : layers) std::printf(" %d", l);
  std::printf("  (%zu x %d experts, %s per expert)  shards %d\n", layers.size(), c.num_experts,
              human_bytes(double(c.expert_bytes())).c_str(), o.shards);
  std::fflush(stdout);

  const Stopwatch clock;
  write_synthetic_checkpoint(o.dir, spec, stderr_progress());
  const double seconds = clock.seconds();

  namespace fs = std::filesystem;
  std::vector<fs::path> files{fs::path(o.dir) / "config.json", fs::path(o.dir) / "model.safetensors.index.json"};
  for (int s = 1; s <= o.shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, o.shards);
    files.push_back(fs::path(o.dir) / name);
  }
  uint64_t total = 0;
  for (const fs::path& f : files) {
    const uint64_t size = fs::file_size(f);
    total += size;
    std::printf("  %-40s %12s\n", f.filename().string().c_str(), human_bytes(double(size)).c_str());
  }
  std::printf("wrote %zu files, %s in %.1f s (%s/s)\n", files.size(), human_bytes(double(total)).c_str(), seconds,
              human_bytes(double(total) / std::max(seconds, 1e-9)).c_str());
}

}  // namespace

void register_make_checkpoint(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("make-checkpoint",
                                     "Write a synthetic Kimi-K3-format MXFP4 checkpoint (full size unless --reduced)");
  cmd->add_option("dir", o->dir, "Output directory (created)")->required();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--layers", o->layers, "MoE layers to write, e.g. 1,2 (default: the first MoE layer)")
      ->delimiter(',')
      ->check(non_negative_integer());
  cmd->add_option("--shards", o->shards, "Number of shards; each holds a contiguous range of experts")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--prefix", o->prefix, "Tensor-name prefix, e.g. language_model.model.")->capture_default_str();
  cmd->add_flag("--reduced", o->reduced, "Small dimensions: H 256, I 128, E 32, top-k 4, model hidden 512");
  cmd->add_option("--hidden", o->hidden, "H, the routed experts' width")->check(non_negative_integer());
  cmd->add_option("--intermediate", o->intermediate, "I, the experts' intermediate width")->check(non_negative_integer());
  cmd->add_option("--experts", o->experts, "E, the number of routed experts")->check(non_negative_integer());
  cmd->add_option("--top-k", o->top_k, "K, experts per token")->check(non_negative_integer());
  cmd->add_option("--model-hidden", o->model_hidden, "The router's input width (hidden_size)")->check(non_negative_integer());
  cmd->add_option("--threads", o->threads, "Generator threads (0: all cores)")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->callback([o] { run(*o); });
}

}  // namespace k3moe::cli
