// k3moe inspect DIR | FILE.safetensors: what a checkpoint holds and whether it is valid.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "k3moe/checkpoint.h"
#include "k3moe/error.h"
#include "k3moe/safetensors.h"

namespace k3moe::cli {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string path;
  int ep_size = 1;
  std::optional<int> layer;
  bool json = false;
};

// FNV-1a over the tensor's bytes, read in pieces of at most 16 MiB (an embedding is gigabytes).
uint64_t fnv1a64(const SafetensorsFile& file, const TensorInfo& tensor) {
  std::vector<uint8_t> piece(size_t(std::min<uint64_t>(tensor.nbytes(), 16 << 20)));
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t offset = 0; offset < tensor.nbytes(); offset += piece.size()) {
    const std::span<uint8_t> part(piece.data(), size_t(std::min<uint64_t>(piece.size(), tensor.nbytes() - offset)));
    file.read(tensor, offset, part);
    for (uint8_t b : part) h = (h ^ b) * 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void inspect_file(const Options& o) {
  const SafetensorsFile file = SafetensorsFile::open(o.path);
  if (o.json) {
    nlohmann::json out = {{"file", o.path}, {"metadata", file.metadata()}, {"tensors", nlohmann::json::array()}};
    for (const TensorInfo& t : file.tensors())
      out["tensors"].push_back({{"name", t.name},
                                {"dtype", std::string(to_string(t.dtype))},
                                {"shape", t.shape},
                                {"data_offsets", {t.begin, t.end}},
                                {"fnv1a64", hex64(fnv1a64(file, t))}});
    // NOTE: a file name that is not UTF-8 is printed with U+FFFD in its place.
    std::printf("%s\n", out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("%s: %zu tensors, %s\n", printable(o.path).c_str(), file.tensors().size(),
              human_bytes(double(file.file_size())).c_str());
  for (const auto& [key, value] : file.metadata())
    std::printf("  metadata %s = %s\n", printable(key).c_str(), printable(value).c_str());
  for (const TensorInfo& t : file.tensors())
    std::printf("  %-60s %-7s %-16s [%llu, %llu)  fnv1a64 %s\n", printable(t.name).c_str(),
                std::string(to_string(t.dtype)).c_str(), t.shape_string().c_str(),
                static_cast<unsigned long long>(t.begin), static_cast<unsigned long long>(t.end),
                hex64(fnv1a64(file, t)).c_str());
}

std::set<std::string> shard_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) return {"model.safetensors"};
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  std::set<std::string> files;
  if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object())
    for (const auto& [name, file] : j["weight_map"].items())
      if (file.is_string()) files.insert(file.get<std::string>());
  return files;
}

std::string layer_list(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]) + (j > i ? ".." + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

void inspect_dir(const Options& o) {
  const Checkpoint ckpt = Checkpoint::open(o.path);
  const MoeConfig& c = ckpt.config();
  const ActivationParams& a = c.activation_params;
  std::printf("checkpoint %s\n", printable(o.path).c_str());
  std::printf("  config      H %d  I %d  E %d  top-k %d  model hidden %d\n", c.hidden, c.intermediate,
              c.num_experts, c.top_k, c.model_hidden);
  std::printf("              activation %s (beta %g, beta_lin %g)  renormalize %s  routed scaling %g\n",
              std::string(to_string(c.activation)).c_str(), a.situ_beta, a.situ_linear_beta,
              c.renormalize ? "yes" : "no", c.routed_scaling_factor);
  std::printf("              %s, %d bits, group %d\n", c.quant_format.c_str(), c.num_bits, c.group_size);
  std::printf("              %d layers, first %d dense, MoE every %d (first MoE layer %d)\n", c.num_layers,
              c.first_k_dense_replace, c.moe_layer_freq, c.first_moe_layer());
  std::printf("  prefix      '%s'\n", printable(ckpt.prefix()).c_str());
  std::printf("  shards      %d\n", ckpt.num_shards());
  for (const std::string& f : shard_files(o.path)) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(o.path) / f, ec);
    std::printf("              %-40s %s\n", printable(f).c_str(), ec ? "(missing)" : human_bytes(double(size)).c_str());
  }
  const std::vector<int> layers = ckpt.moe_layers();
  std::printf("  MoE layers  %s (with expert tensors)\n", layer_list(layers).c_str());
  std::printf("  experts     %d per layer; per expert: W13 %s + W2 %s = %s\n", c.num_experts,
              human_bytes(double(c.w13_bytes())).c_str(), human_bytes(double(c.w2_bytes())).c_str(),
              human_bytes(double(c.expert_bytes())).c_str());

  const ExpertParallel ep{o.ep_size, 0};
  ep.validate(c.num_experts);
  const int layer = o.layer ? *o.layer : (layers.empty() ? c.first_moe_layer() : layers.front());
  std::printf("  EP %-4d     %d ranks x %d experts, %s per rank per layer (%llu bytes)\n", ep.size, ep.size,
              ep.num_local(c.num_experts), human_bytes(double(c.expert_bytes()) * ep.num_local(c.num_experts)).c_str(),
              static_cast<unsigned long long>(c.expert_bytes() * ep.num_local(c.num_experts)));
  try {
    std::printf("              layer %d rank 0 in the files: %llu bytes\n", layer,
                static_cast<unsigned long long>(ckpt.rank_bytes(layer, ep)));
  } catch (const Error& e) {
    std::printf("              layer %d rank 0 in the files: unreadable (%s)\n", layer, printable(e.message()).c_str());
  }

  const std::vector<std::string> problems = ckpt.validate(o.layer);
  const std::string scope = o.layer ? "layer " + std::to_string(*o.layer) : "all layers";
  if (problems.empty()) {
    std::printf("  validation  %s: valid\n", scope.c_str());
    return;
  }
  std::printf("  validation  %s: INVALID, %zu problem line(s)\n", scope.c_str(), problems.size());
  for (const std::string& p : problems) std::printf("    %s\n", printable(p).c_str());
  throw ExitCode{2};
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Describe and validate a checkpoint directory, or list the tensors of one .safetensors file");
  cmd->add_option("path", o->path, "Checkpoint directory or .safetensors file")->required();
  const CLI::Option* ep_size =
      cmd->add_option("--ep-size", o->ep_size, "For a directory: expert-parallel size for the per-rank byte counts")
          ->capture_default_str()
          ->check(non_negative_integer());
  const CLI::Option* layer =
      cmd->add_option("--layer", o->layer,
                      "For a directory: validate only this layer (default: every layer with experts)")
          ->check(non_negative_integer());
  const CLI::Option* json = cmd->add_flag("--json", o->json, "For a .safetensors file: print the tensor list as JSON");
  // An option that does not apply to the path's kind is an error, not ignored: a script asking
  // for JSON must not be handed text.
  cmd->callback([o, ep_size, layer, json] {
    const bool dir = fs::is_directory(o->path);
    for (const CLI::Option* option : {ep_size, layer, json})
      if (option->count() > 0 && (option == json) == dir)
        throw CLI::ValidationError(option->get_name(), std::string("applies only to ") +
                                                           (dir ? "a .safetensors file" : "a checkpoint directory") +
                                                           ", and " + o->path + " is " +
                                                           (dir ? "a directory" : "not a directory"));
    if (dir) {
      inspect_dir(*o);
    } else {
      inspect_file(*o);
    }
  });
}

}  // namespace k3moe::cli
