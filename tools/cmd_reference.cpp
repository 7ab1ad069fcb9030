// k3moe reference: the float64 reference forward of one MoE layer on random tokens, written to a
// safetensors file for cross-checks (tests/python/test_reference_numpy.py) and for comparing other
// implementations offline.
//
// Inputs, reproducible from --seed (a splitmix64 stream and Box-Muller in double, not the standard
// library's distributions, so that every platform draws the same numbers up to libm's last bit,
// which the roundings to bf16/fp32 absorb):
//   x        [T, H]  N(0, 1) rounded to bf16                       (the experts' input)
//   x_model  [T, model_hidden] N(0, 1) in fp32 (not written); logits = x_model . gate_weight^T,
//            accumulated in float64 and rounded once to fp32       (the router's input)
//   bias     the layer's e_score_correction_bias, widened to fp32
// Routing: route_reference. Outputs: reference_forward, Ideal and Emulate, for the rank's experts
// (ids outside the rank contribute nothing, so the EP ranks' Ideal outputs sum to the EP1 one).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/bounded_json.h"
#include "cli_common.h"
#include "commands.h"
#include "k3moe/checkpoint.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/reference.h"
#include "k3moe/safetensors.h"

namespace k3moe::cli {
namespace {

struct ReferenceOptions {
  std::string checkpoint, out, mode = "a16", activation;
  int layer = -1, tokens = 8, ep_size = 1, ep_rank = 0;
  uint64_t seed = 0;
};

// N(0, 1) from splitmix64 and Box-Muller, in double.
class Normal {
 public:
  explicit Normal(uint64_t seed) : state_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (double(bits() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = double(bits() >> 11) * 0x1p-53;          // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t bits() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

template <class T>
std::span<const uint8_t> as_bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

void run(const ReferenceOptions& o) {
  // Where the result goes is checked before minutes of loading and computing.
  K3MOE_CHECK(!o.out.empty(), "--out must name the file to write, got an empty path");
  const std::filesystem::path out(o.out);
  const std::filesystem::path out_dir = out.has_parent_path() ? out.parent_path() : ".";
  K3MOE_CHECK(std::filesystem::is_directory(out_dir), "--out ", o.out, ": the directory ", out_dir.string(),
              " does not exist");
  K3MOE_CHECK(!std::filesystem::is_directory(out), "--out ", o.out, " is a directory, not a file to write");
  K3MOE_CHECK(detail::is_utf8(o.checkpoint), "--checkpoint ", o.checkpoint, ": the path is not UTF-8, and the "
              "output's metadata records it (use a link with a UTF-8 name)");
  const Checkpoint ckpt = Checkpoint::open(o.checkpoint);
  const MoeConfig& config = ckpt.config();
  const std::vector<int> layers = ckpt.moe_layers();
  K3MOE_CHECK(!layers.empty(), o.checkpoint, ": no MoE layer with expert tensors");
  const int layer = o.layer >= 0 ? o.layer : layers.front();
  const ExpertParallel ep{o.ep_size, o.ep_rank};
  ep.validate(config.num_experts);
  check_host_memory_for_tokens(o.tokens, config);
  const Mode mode = parse_mode(o.mode);
  const Activation activation = o.activation.empty() ? config.activation : parse_activation(o.activation);
  const int T = o.tokens, H = config.hidden, E = config.num_experts, K = config.top_k, D = config.model_hidden;

  std::printf("reference %s layer %d  EP %d/%d (experts %d..%d)  mode %s  activation %s  tokens %d  seed %llu\n",
              o.checkpoint.c_str(), layer, ep.rank, ep.size, ep.first_expert(E),
              ep.first_expert(E) + ep.num_local(E) - 1, std::string(to_string(mode)).c_str(),
              std::string(to_string(activation)).c_str(), T, static_cast<unsigned long long>(o.seed));
  std::fflush(stdout);

  Stopwatch load_clock;
  const RankExperts experts = ckpt.load_experts(layer, ep, stderr_progress());
  const Router router = ckpt.load_router(layer);
  std::printf("  loaded %d experts (%s) and the router in %.2f s\n", experts.num_local,
              human_bytes(double(experts.bytes_read)).c_str(), load_clock.seconds());

  // ---- inputs
  Normal normal(o.seed);
  std::vector<uint16_t> x(size_t(T) * H);
  for (auto& v : x) v = float_to_bf16_bits(float(normal.next()));
  std::vector<float> x_model(size_t(T) * D), logits(size_t(T) * E);
  for (auto& v : x_model) v = float(normal.next());
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      const float* w = router.weight.data() + size_t(e) * D;
      const float* xm = x_model.data() + size_t(t) * D;
      double acc = 0.0;
      for (int k = 0; k < D; ++k) acc += double(xm[k]) * double(w[k]);
      logits[size_t(t) * E + e] = float(acc);
    }
  const Routing routing = route_reference(logits, router.bias, T, config);

  // ---- forward
  const ReferenceProblem problem{&experts, T, x, &routing, mode, activation, config.activation_params};
  Stopwatch clock;
  const std::vector<double> ideal = reference_forward(problem, Precision::Ideal);
  const double ideal_s = clock.seconds();
  clock = Stopwatch();
  const std::vector<double> emulate = reference_forward(problem, Precision::Emulate);
  const double emulate_s = clock.seconds();

  std::set<int> hit;
  int64_t local_slots = 0;
  for (int32_t id : routing.ids)
    if (id >= experts.first_expert && id < experts.first_expert + experts.num_local) hit.insert(id), ++local_slots;
  const Comparison c = compare(emulate, ideal);
  std::printf("  %lld of %lld slots on this rank, %zu distinct experts hit\n", static_cast<long long>(local_slots),
              static_cast<long long>(routing.ids.size()), hit.size());
  std::printf("  ideal %.2f s, emulate %.2f s;  emulate vs ideal: rel-L2 %.3e  cosine %.7f  non-finite mismatches %lld\n",
              ideal_s, emulate_s, c.rel_l2, c.cosine, static_cast<long long>(c.nonfinite_mismatch));

  // ---- output
  const std::map<std::string, std::string> metadata = {
      {"format", "k3moe-reference-1"},
      {"checkpoint", o.checkpoint},
      {"layer", std::to_string(layer)},
      {"mode", std::string(to_string(mode))},
      {"activation", std::string(to_string(activation))},
      {"ep_size", std::to_string(ep.size)},
      {"ep_rank", std::to_string(ep.rank)},
      {"first_expert", std::to_string(experts.first_expert)},
      {"num_local", std::to_string(experts.num_local)},
      {"seed", std::to_string(o.seed)},
      {"tokens", std::to_string(T)},
      {"x", "N(0,1) from splitmix64/Box-Muller(seed), rounded to bf16"},
      {"logits", "x_model N(0,1) [T, model_hidden] (drawn after x) . gate_weight^T, float64 sum rounded to fp32"},
  };
  const int64_t t64 = T;
  SafetensorsWriter writer(o.out,
                           {{"x", Dtype::BF16, {t64, H}},
                            {"logits", Dtype::F32, {t64, E}},
                            {"bias", Dtype::F32, {E}},
                            {"ids", Dtype::I32, {t64, K}},
                            {"weights", Dtype::F32, {t64, K}},
                            {"out_ideal", Dtype::F64, {t64, H}},
                            {"out_emulate", Dtype::F64, {t64, H}}},
                           metadata);
  writer.write("x", as_bytes_of(x));
  writer.write("logits", as_bytes_of(logits));
  writer.write("bias", as_bytes_of(router.bias));
  writer.write("ids", as_bytes_of(routing.ids));
  writer.write("weights", as_bytes_of(routing.weights));
  writer.write("out_ideal", as_bytes_of(ideal));
  writer.write("out_emulate", as_bytes_of(emulate));
  writer.finish();
  std::printf("wrote %s\n", o.out.c_str());
}

}  // namespace

void register_reference(CLI::App& app) {
  auto o = std::make_shared<ReferenceOptions>();
  CLI::App* cmd = app.add_subcommand(
      "reference", "Run the float64 reference (Ideal and Emulate) on random tokens; write a safetensors file");
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint directory")->required();
  cmd->add_option("--layer", o->layer, "MoE layer (default: the first one in the checkpoint)")
      ->check(non_negative_integer());
  cmd->add_option("--tokens", o->tokens, "Number of tokens")
      ->capture_default_str()
      ->check(non_negative_integer())
      ->check(CLI::Range(0, kMaxCliTokens));
  cmd->add_option("--mode", o->mode, "Precision mode of Emulate: a16 | mxfp8")->capture_default_str();
  cmd->add_option("--activation", o->activation, "situ | swiglu | swiglu_oai (default: the checkpoint's)");
  cmd->add_option("--ep-size", o->ep_size, "Expert-parallel size")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--ep-rank", o->ep_rank, "Expert-parallel rank")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--seed", o->seed, "Random seed of x and the router input")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--out", o->out, "Output .safetensors file")->required();
  cmd->callback([o] { run(*o); });
}

}  // namespace k3moe::cli
