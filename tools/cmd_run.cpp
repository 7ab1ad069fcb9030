// k3moe run: the main job. Loads one MoE layer's experts for one EP rank (default: a synthetic
// full-size Kimi-K3 layer generated on the fly, EP32 rank 0), routes random tokens through the
// layer's router, runs the forward on the GPU when there is one (else the CPU reference is the
// forward), and prints what was hit, how long it took, and the error against the reference.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "k3moe/checkpoint.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/reference.h"
#include "k3moe/synthetic.h"
#if K3MOE_WITH_CUDA
#include "k3moe/plan.h"
#include "bench_timing.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"
#include "validation/validation.h"
#endif

namespace k3moe::cli {
namespace {

struct RunOptions {
  std::string checkpoint;
  int layer = -1;
  int ep_size = 32, ep_rank = 0;
  int tokens = 64;
  std::string mode = "a16", activation, backend = "auto";
  uint64_t seed = 7;
};

// Router logits [T, E] = x_model [T, model_hidden] . gate^T in fp32, as the model computes them.
std::vector<float> router_logits(const Router& router, const std::vector<float>& x_model, int tokens) {
  std::vector<float> logits(size_t(tokens) * router.num_experts);
  for (int t = 0; t < tokens; ++t)
    for (int e = 0; e < router.num_experts; ++e) {
      const float* w = router.weight.data() + size_t(e) * router.model_hidden;
      const float* x = x_model.data() + size_t(t) * router.model_hidden;
      float acc = 0.0f;
      for (int k = 0; k < router.model_hidden; ++k) acc += x[k] * w[k];
      logits[size_t(t) * router.num_experts + e] = acc;
    }
  return logits;
}

#if K3MOE_WITH_CUDA
// The GPU forward, timed over a few CUDA-graph replays as `k3moe bench` times them (each enqueued
// behind a held stream, bench_timing.h); returns the output and the median µs.
std::vector<double> gpu_forward(const RankExperts& experts, const MoeConfig& config, Mode mode, Activation activation,
                                const std::vector<uint16_t>& x, const std::vector<float>& logits,
                                const std::vector<float>& bias, int tokens, double* median_us, Routing* gpu_routing) {
  Stopwatch upload_time;
  DeviceExperts device = DeviceExperts::upload(experts, 0);
  std::printf("  uploaded %s of experts in the kernel layout in %.2f s\n", human_bytes(double(device.bytes())).c_str(),
              upload_time.seconds());
  MoePlan plan = MoePlan::create({config, tokens, mode, activation, config.activation_params, experts.ep, 0});
  const int64_t T = tokens, H = config.hidden, E = config.num_experts, K = config.top_k;
  DeviceTensor dx = DeviceTensor::from_host(x, {T, H}, kBf16, 0);
  DeviceTensor dlogits = DeviceTensor::from_host(logits, {T, E}, kF32, 0);
  DeviceTensor dbias = DeviceTensor::from_host(bias, {E}, kF32, 0);
  DeviceTensor ids({T, K}, kI32, 0), weights({T, K}, kF32, 0), out({T, H}, kBf16, 0);
  ForwardArgs args;
  args.x = dx.dl();
  args.router_logits = dlogits.dl();
  args.router_bias = dbias.dl();
  args.topk_ids = ids.dl();
  args.topk_weights = weights.dl();
  args.out = out.dl();
  std::printf("  plan: %s\n", plan.describe(tokens).c_str());

  const CudaStream stream;
  out.fill_bytes(0xFF);
  plan.forward(device, args, stream);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const CapturedGraph graph(stream, [&] { plan.forward(device, args, stream); });
  *median_us = 1000.0 * time_ms(stream, 1, 21, [&](int) { graph.launch(stream); }).median_ms;

  gpu_routing->tokens = tokens;
  gpu_routing->top_k = config.top_k;
  gpu_routing->ids = ids.download<int32_t>();
  gpu_routing->weights = weights.download<float>();
  std::vector<double> result;
  for (uint16_t b : out.download<uint16_t>()) result.push_back(bf16_bits_to_float(b));
  return result;
}
#endif

struct Backend {
  bool gpu = false;
  std::string why_cpu;  // why the CPU reference is the forward, when it is
};

// Decided before any weights load, so a backend that cannot run fails at once.
Backend choose_backend(const std::string& requested) {
  Backend b;
  if (requested == "cpu") return b;
#if K3MOE_WITH_CUDA
  std::string why;
  b.gpu = hopper_gpu_available(&why);
  b.why_cpu = "no Hopper GPU (" + why + ")";
#else
  b.why_cpu = "this k3moe was built without CUDA (no nvcc at build time)";
#endif
  K3MOE_CHECK(b.gpu || requested != "gpu", "--backend gpu: ", b.why_cpu);
  return b;
}

void run(const RunOptions& o) {
  // Every option is checked before the weights load (minutes for a full-size layer).
  const Mode mode = parse_mode(o.mode);
  std::optional<Activation> requested_activation;
  if (!o.activation.empty()) requested_activation = parse_activation(o.activation);
  const Backend backend = choose_backend(o.backend);
  const ProgressFn progress = stderr_progress();
  const ExpertParallel ep{o.ep_size, o.ep_rank};
  RankExperts experts;
  Router router;
  MoeConfig config;
  Stopwatch load_time;
  if (o.checkpoint.empty()) {
    SyntheticSpec spec;
    spec.seed = o.seed;
    config = spec.config;
    ep.validate(config.num_experts);
    check_host_memory_for_tokens(o.tokens, config);
    const int layer = o.layer >= 0 ? o.layer : config.first_moe_layer();
    std::printf("k3moe run: synthetic full-size Kimi-K3 layer %d (H %d, I %d, %d experts, top-%d), EP rank %d/%d\n",
                layer, config.hidden, config.intermediate, config.num_experts, config.top_k, ep.rank, ep.size);
    experts = synthesize_experts(spec, layer, ep, progress);
    router = synthesize_router(spec, layer);
  } else {
    Checkpoint ckpt = Checkpoint::open(o.checkpoint);
    config = ckpt.config();
    ep.validate(config.num_experts);
    check_host_memory_for_tokens(o.tokens, config);
    const int layer = o.layer >= 0 ? o.layer : ckpt.moe_layers().at(0);
    std::printf("k3moe run: %s layer %d (H %d, I %d, %d experts, top-%d), EP rank %d/%d\n", o.checkpoint.c_str(), layer,
                config.hidden, config.intermediate, config.num_experts, config.top_k, ep.rank, ep.size);
    experts = ckpt.load_experts(layer, ep, progress);
    router = ckpt.load_router(layer);
  }
  std::printf("  %d local experts (%d..%d), %s, ready in %.2f s\n", experts.num_local, experts.first_expert,
              experts.first_expert + experts.num_local - 1,
              human_bytes(double(experts.num_local) * double(config.expert_bytes())).c_str(), load_time.seconds());

  const Activation activation = requested_activation.value_or(config.activation);
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x_model(size_t(o.tokens) * router.model_hidden);
  for (auto& v : x_model) v = normal(rng);
  std::vector<uint16_t> x(size_t(o.tokens) * config.hidden);
  for (auto& v : x) v = float_to_bf16_bits(normal(rng));
  const std::vector<float> logits = router_logits(router, x_model, o.tokens);
  const Routing routing = route_reference(logits, router.bias, o.tokens, config);
  int local_slots = 0;
  std::vector<bool> hit(experts.num_local, false);
  for (int32_t id : routing.ids)
    if (id >= experts.first_expert && id < experts.first_expert + experts.num_local) {
      ++local_slots;
      hit[id - experts.first_expert] = true;
    }
  std::printf("  %d tokens routed (top-%d of %d): %d slots on this rank, %d of %d local experts hit\n", o.tokens,
              config.top_k, config.num_experts, local_slots, int(std::count(hit.begin(), hit.end(), true)),
              experts.num_local);

  ReferenceProblem problem{&experts, o.tokens, x, &routing, mode, activation, config.activation_params};
  Stopwatch ref_time;
  const std::vector<double> emulate = reference_forward(problem, Precision::Emulate);
  const std::vector<double> ideal = reference_forward(problem, Precision::Ideal);
  std::printf("  CPU float64 reference (mode %s, %s): %.2f s\n", std::string(to_string(mode)).c_str(),
              std::string(to_string(activation)).c_str(), ref_time.seconds());

  if (!backend.gpu && o.backend == "auto")
    std::printf("  %s: the CPU reference is the forward\n", backend.why_cpu.c_str());
  if (backend.gpu) {
#if K3MOE_WITH_CUDA
    double us = 0.0;
    Routing gpu_routing;
    const std::vector<double> out = gpu_forward(experts, config, mode, activation, x, logits, router.bias, o.tokens,
                                                &us, &gpu_routing);
    const Comparison vs_emulate = compare(out, emulate), vs_ideal = compare(out, ideal);
    std::printf("  GPU forward (routing from logits included): %.1f us per forward (median of 21 graph replays, "
                "each timed from its first kernel)\n",
                us);
    std::printf("  routing ids %s the reference's\n", gpu_routing.ids == routing.ids ? "equal" : "DIFFER FROM");
    std::printf("  error vs the %s-emulating reference: rel-L2 %.3e, cosine %.8f\n", std::string(to_string(mode)).c_str(),
                vs_emulate.rel_l2, vs_emulate.cosine);
    std::printf("  error vs the ideal float64 result:   rel-L2 %.3e, cosine %.8f\n", vs_ideal.rel_l2, vs_ideal.cosine);
    // The validation matrix's verdict on this forward (docs/PRECISION.md): the exit status says it.
    const validation::Tolerance tol = validation::tolerance(mode);
    const bool pass = gpu_routing.ids == routing.ids && vs_emulate.nonfinite_mismatch == 0 &&
                      vs_emulate.rel_l2 <= tol.rel_l2 && vs_ideal.rel_l2 <= tol.ideal_rel_l2;
    std::printf("  %s: ids exact, finite where the reference is, rel-L2 <= %.1e vs the emulation and <= %.1e vs "
                "ideal (the validation matrix's bounds)\n",
                pass ? "PASS" : "FAIL", tol.rel_l2, tol.ideal_rel_l2);
    if (!pass) throw ExitCode{1};
#endif
  } else {
    const Comparison mode_error = compare(emulate, ideal);
    std::printf("  forward = CPU reference; the %s mode's own error vs ideal float64: rel-L2 %.3e, cosine %.8f\n",
                std::string(to_string(mode)).c_str(), mode_error.rel_l2, mode_error.cosine);
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run one MoE layer's routed experts (default: synthetic full-size Kimi-K3)");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("--checkpoint", o->checkpoint, "A K3-format checkpoint directory (default: synthetic, on the fly)");
  cmd->add_option("--layer", o->layer, "MoE layer (default: the first)")->check(non_negative_integer());
  cmd->add_option("--ep-size", o->ep_size,
                  "Expert-parallel size (32: a Kimi-K3 EP32 rank; a --reduced checkpoint's 32 experts want fewer)")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--ep-rank", o->ep_rank, "Expert-parallel rank")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--tokens", o->tokens, "Tokens to route")
      ->capture_default_str()
      ->check(non_negative_integer())
      ->check(CLI::Range(0, kMaxCliTokens));
  cmd->add_option("--mode", o->mode, "a16 | mxfp8")->capture_default_str();
  cmd->add_option("--activation", o->activation, "situ | swiglu | swiglu_oai (default: the config's)");
  cmd->add_option("--backend", o->backend, "auto | gpu | cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}));
  cmd->add_option("--seed", o->seed, "Seed of the synthetic layer and the tokens")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->callback([o] { run(*o); });
}

}  // namespace k3moe::cli
