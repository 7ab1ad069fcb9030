#include "validation/validation.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/plan.h"
#include "k3moe/synthetic.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe::validation {
namespace {

constexpr double kBf16Unit = 1.0 / 512.0;  // bf16 unit roundoff, 2^-9

MoeConfig reduced_config() {
  MoeConfig c;
  c.hidden = 384;  // not a multiple of 256: the GEMM2 grid has a partial CTA of weight rows
  c.intermediate = 256;
  c.num_experts = 16;
  c.top_k = 4;
  c.model_hidden = 512;
  return c;
}

MoeConfig ep32_896_config() {
  MoeConfig c;
  c.hidden = 512;
  c.intermediate = 256;
  c.model_hidden = 512;
  return c;  // 896 experts, top-16: Kimi-K3's routing at reduced widths
}

MoeConfig k3_local28_config() {
  MoeConfig c;  // full-size H = 3584, I = 3072, top-16 ...
  c.num_experts = 28;  // ... among the 28 experts of one EP32 rank
  return c;
}

struct Experts {
  RankExperts host;
  DeviceExperts device;
};

std::shared_ptr<Experts> experts_for(const Case& c, ExpertParallel ep) {
  static std::map<std::tuple<std::string, int, int, int, uint64_t>, std::shared_ptr<Experts>> cache;
  const int poisoned = c.poison == Poison::NanWeightScale ? 1 : c.poison == Poison::ExtremeScales ? 2 : 0;
  const auto key = std::make_tuple(c.shape, ep.size, ep.rank, poisoned, c.seed);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() > 8) cache.clear();  // full-size experts are 0.5 GB each set: keep few
  SyntheticSpec spec;
  spec.config = c.config;
  spec.seed = c.seed;
  RankExperts host = synthesize_experts(spec, c.config.first_moe_layer(), ep);
  K3MOE_CHECK(c.poison != Poison::NanWeightScale || host.num_local >= 2,
              "validation: the NaN weight scale goes to the rank's second expert; the case's rank holds ",
              host.num_local);
  if (c.poison == Poison::NanWeightScale)
    host.w13_scale[int64_t(2 * c.config.intermediate + 3) * (c.config.hidden / 32)] = kE8M0NaN;
  if (c.poison == Poison::ExtremeScales) {
    const uint8_t ends[] = {0, 1, 2, 100, 127, 128};
    std::mt19937_64 rng(c.seed);
    for (auto* scales : {&host.w13_scale, &host.w2_scale})
      for (auto& s : *scales) s = ends[rng() % 6];
  }
  auto experts = std::make_shared<Experts>(Experts{host, DeviceExperts::upload(host, 0)});
  cache[key] = experts;
  return experts;
}

struct Inputs {
  std::vector<uint16_t> x;             // [T, H] bf16
  std::vector<float> logits, bias;     // RoutingKind::Logits only
  Routing routing_for_gpu;             // ids as the GPU sees them (garbage included)
  Routing routing_for_reference;       // garbage ids replaced by -1
};

// Distinct random experts for one token, avoiding `taken`.
int32_t draw_expert(std::mt19937_64& rng, int num_experts, const std::vector<int32_t>& taken) {
  std::uniform_int_distribution<int32_t> pick(0, num_experts - 1);
  for (;;) {
    const int32_t e = pick(rng);
    if (std::find(taken.begin(), taken.end(), e) == taken.end()) return e;
  }
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  const MoeConfig& cfg = c.config;
  const int T = c.tokens, H = cfg.hidden, E = cfg.num_experts, K = cfg.top_k;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  Inputs in;
  in.x.resize(size_t(T) * H);
  for (auto& v : in.x) v = float_to_bf16_bits(normal(rng));
  if (c.poison == Poison::NanX && T > 0) {
    in.x[size_t(T / 2) * H + 5] = float_to_bf16_bits(NAN);
    if (T > 2) in.x[size_t(T - 1) * H] = float_to_bf16_bits(NAN);
  }
  if (c.poison == Poison::InfX && T > 0) in.x[7] = float_to_bf16_bits(INFINITY);

  // What each routing kind draws from (the built-in matrix meets it; another case is an error,
  // not a hang or a remote id taken for a local one).
  K3MOE_CHECK(c.routing != RoutingKind::EmptyExperts || K <= (E + 1) / 2, "validation: empty-expert routing "
              "takes K = ", K, " distinct even ids, E = ", E, " has ", (E + 1) / 2);
  K3MOE_CHECK((c.routing != RoutingKind::Skewed && c.routing != RoutingKind::Duplicate) || c.ep.num_local(E) >= 2,
              "validation: skewed and duplicate routing use the rank's first two experts; the case's rank holds ",
              c.ep.num_local(E));
  Routing r;
  r.tokens = T;
  r.top_k = K;
  if (c.routing == RoutingKind::Logits) {
    in.logits.resize(size_t(T) * E);
    in.bias.resize(E);
    for (auto& v : in.logits) v = normal(rng);
    for (auto& v : in.bias) v = 0.1f * normal(rng);
    r = route_reference(in.logits, in.bias, T, cfg);
    in.routing_for_gpu = in.routing_for_reference = r;
    return in;
  }
  r.ids.assign(size_t(T) * K, -1);
  r.weights.assign(size_t(T) * K, 0.0f);
  const int base = c.ep.first_expert(E);  // local experts of the case's rank
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> taken;
    for (int k = 0; k < K; ++k) {
      int32_t id = -1;
      switch (c.routing) {
        case RoutingKind::Skewed: {
          const int32_t hot = base + (uniform(rng) < 0.5f ? 0 : 1);
          const bool free = std::find(taken.begin(), taken.end(), hot) == taken.end();
          id = uniform(rng) < 0.7f && free ? hot : draw_expert(rng, E, taken);
          break;
        }
        case RoutingKind::OneExpert: id = k == 0 ? base : draw_expert(rng, E, taken); break;
        case RoutingKind::Duplicate: id = base + 1; break;
        case RoutingKind::EmptyExperts: do id = draw_expert(rng, E, taken); while (id % 2); break;
        default: id = draw_expert(rng, E, taken); break;
      }
      taken.push_back(id);
      r.ids[size_t(t) * K + k] = id;
      r.weights[size_t(t) * K + k] = uniform(rng);
    }
  }
  if (c.routing == RoutingKind::MinusOne)
    for (auto& id : r.ids)
      if (uniform(rng) < 0.3f) id = -1;
  in.routing_for_reference = r;
  if (c.routing == RoutingKind::Garbage) {
    const int32_t garbage[] = {E, E + 1000, -2, INT32_MIN, INT32_MAX, -100};
    const int first_bad = T - std::max(1, T / 4);
    for (int t = std::max(0, first_bad); t < T; ++t)
      for (int k = 0; k < K; ++k) {
        r.ids[size_t(t) * K + k] = garbage[(t + k) % 6];
        in.routing_for_reference.ids[size_t(t) * K + k] = -1;
      }
  }
  in.routing_for_gpu = r;
  return in;
}

// Device buffers of one forward, reused for eager runs and graph replays.
struct DeviceInputs {
  DeviceTensor x, ids, weights, logits, bias, out;

  DeviceInputs(const Case& c, const Inputs& in) {
    const int64_t T = c.tokens, H = c.config.hidden, K = c.config.top_k, E = c.config.num_experts;
    x = DeviceTensor::from_host(in.x, {T, H}, kBf16, 0);
    if (c.routing == RoutingKind::Logits) {
      logits = DeviceTensor::from_host(in.logits, {T, E}, kF32, 0);
      bias = DeviceTensor::from_host(in.bias, {E}, kF32, 0);
      ids = DeviceTensor({T, K}, kI32, 0);
      weights = DeviceTensor({T, K}, kF32, 0);
    } else {
      ids = DeviceTensor::from_host(in.routing_for_gpu.ids, {T, K}, kI32, 0);
      weights = DeviceTensor::from_host(in.routing_for_gpu.weights, {T, K}, kF32, 0);
    }
    out = DeviceTensor({T, H}, kBf16, 0);
  }
  ForwardArgs args(bool from_logits) {
    ForwardArgs a;
    a.x = x.dl();
    a.topk_ids = ids.dl();
    a.topk_weights = weights.dl();
    if (from_logits) {
      a.router_logits = logits.dl();
      a.router_bias = bias.dl();
    }
    a.out = out.dl();
    return a;
  }
};

std::vector<uint16_t> run_eager(const MoePlan& plan, const DeviceExperts& experts, DeviceInputs& d, bool from_logits,
                                cudaStream_t stream) {
  d.out.fill_bytes(0xFF);  // bf16 0xFFFF is NaN: an element the forward does not write stays NaN
  plan.forward(experts, d.args(from_logits), stream);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d.out.download<uint16_t>();
}

std::vector<double> widen(const std::vector<uint16_t>& bf16) {
  std::vector<double> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = bf16_bits_to_float(bf16[i]);
  return out;
}

// compare() plus the case where the reference is exactly zero (no local slot anywhere).
Comparison compare_outputs(const std::vector<double>& actual, const std::vector<double>& expected) {
  double ref_norm = 0.0, act_norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i)
    if (std::isfinite(expected[i]) && std::isfinite(actual[i])) {
      ref_norm += expected[i] * expected[i];
      act_norm += actual[i] * actual[i];
    }
  Comparison cmp = compare(actual, expected);
  if (ref_norm == 0.0) {
    cmp.rel_l2 = act_norm == 0.0 ? 0.0 : INFINITY;
    cmp.cosine = act_norm == 0.0 ? 1.0 : 0.0;
  }
  return cmp;
}

// Outputs of every rank of c.ep.size, summed, against the single-rank output.
double ep_sum_distance(const Case& c, const Inputs& in, const std::vector<uint16_t>& single_rank_out) {
  std::vector<double> sum(single_rank_out.size(), 0.0);
  CudaStream stream;
  for (int rank = 0; rank < c.ep.size; ++rank) {
    Case rc = c;
    rc.ep = ExpertParallel{c.ep.size, rank};
    auto experts = experts_for(rc, rc.ep);
    PlanOptions o{c.config, std::max(1, c.tokens), c.mode, c.activation, c.config.activation_params, rc.ep, 0};
    MoePlan plan = MoePlan::create(o);
    DeviceInputs d(rc, in);
    const auto out = widen(run_eager(plan, experts->device, d, c.routing == RoutingKind::Logits, stream));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
  }
  return compare_outputs(sum, widen(single_rank_out)).rel_l2;
}

}  // namespace

Tolerance tolerance(Mode mode) {
  // docs/PRECISION.md derives these: about twice the largest measured, so that an output rounded
  // the wrong way fails. a16: 8.46e-4 vs emulation (k3-local28 T = 1, an input set that flips
  // ~10 % of the outputs' bf16 rounding; another fp32 summation order over 120 sets, host-side:
  // at most 6.3e-4; truncated activations or outputs 3.9e-3 and more,
  // tests/gpu/test_tolerance.cpp), 2.62e-3 vs ideal; mxfp8: 1.13e-3 (a T = 90 case whose group
  // amaxes cross powers of two; the others below 2e-4) and 6.95e-2 (extreme scales). A cosine
  // bound would add nothing: rel-L2 r implies cosine >= sqrt(1 - r^2).
  return mode == Mode::A16 ? Tolerance{1.5e-3, 5e-3} : Tolerance{2.5e-3, 1.5e-1};
}

PlanOptions plan_options(const Case& c) {
  PlanOptions options{c.config, std::max(1, c.tokens), c.mode, c.activation, c.config.activation_params, c.ep, 0};
  options.gemm1_splits = options.gemm2_splits = c.splits;
  options.gemm1_unit_rows = options.gemm2_unit_rows = c.unit_rows;
  options.gemm_kernel = c.kernel;
  return options;
}

// A case's seed from what it is, not from where it sits in the matrix, so that a case added to
// the matrix leaves every other case's experts and inputs as they were (FNV-1a over its fields).
uint64_t case_seed(const Case& c) {
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ uint64_t((v >> (8 * i)) & 0xFF)) * 1099511628211ull;
  };
  for (char ch : c.shape) mix(ch);
  for (int64_t v : {int64_t(c.ep.size), int64_t(c.ep.rank), int64_t(c.mode), int64_t(c.activation), int64_t(c.tokens),
                    int64_t(c.routing), int64_t(c.poison), int64_t(c.ep_sum_check), int64_t(c.splits),
                    int64_t(c.unit_rows), int64_t(c.kernel)})
    mix(v);
  return h;
}

std::vector<Case> matrix(bool quick) {
  std::vector<Case> cases;
  const Mode modes[] = {Mode::A16, Mode::Mxfp8};
  const Activation activations[] = {Activation::Situ, Activation::Swiglu, Activation::SwigluOai};
  auto add = [&](const std::string& shape, const MoeConfig& cfg, ExpertParallel ep, Mode mode, Activation act, int T,
                 RoutingKind routing, Poison poison = Poison::None, bool ep_sum = false) {
    Case c;
    c.shape = shape;
    c.config = cfg;
    c.config.activation = act;
    c.ep = ep;
    c.mode = mode;
    c.activation = act;
    c.tokens = T;
    c.routing = routing;
    c.poison = poison;
    c.ep_sum_check = ep_sum;
    c.seed = 0;  // from the case's fields once they are all set (case_seed)
    cases.push_back(c);
  };
  const MoeConfig reduced = reduced_config();
  const std::vector<int> all_tokens = quick ? std::vector<int>{0, 1, 17, 90, 129}
                                            : std::vector<int>{0, 1, 2, 3, 8, 17, 32, 90, 127, 128, 129, 1024, 4097};
  for (Mode mode : modes)
    for (Activation act : activations)
      for (int T : all_tokens) add("reduced", reduced, {1, 0}, mode, act, T, RoutingKind::Logits);
  // The wgmma kernels, forced: the reduced shape's 16 experts do not fill the SMs with their units,
  // so the heuristic keeps it on mma.sync. T / 4 rows per expert: tiles of 32, 64 and 128 tokens,
  // partial and several per expert (T = 768: last tiles of 50-80 rows, wgmmas of N = 64 and 96 in the
  // 128-token kernel); H = 384 gives GEMM2 a partial row group.
  for (Mode mode : modes)
    for (Activation act : activations)
      for (int T : quick ? std::vector<int>{257} : std::vector<int>{33, 129, 257, 768, 1024, 4097}) {
        add("reduced", reduced, {1, 0}, mode, act, T, RoutingKind::Logits);
        cases.back().kernel = GemmKernel::Wgmma;
      }

  const RoutingKind kinds[] = {RoutingKind::Skewed, RoutingKind::OneExpert, RoutingKind::Duplicate, RoutingKind::EmptyExperts,
                           RoutingKind::MinusOne, RoutingKind::Garbage};
  const std::vector<int> kind_tokens = quick ? std::vector<int>{129} : std::vector<int>{17, 129, 1024};
  for (Mode mode : modes)
    for (RoutingKind kind : kinds) {
      for (int T : kind_tokens) add("reduced", reduced, {1, 0}, mode, Activation::Situ, T, kind);
      if (!quick) {
        add("reduced", reduced, {1, 0}, mode, Activation::Situ, 1024, kind);
        cases.back().kernel = GemmKernel::Wgmma;
      }
    }

  for (Mode mode : modes) {
    for (int T : quick ? std::vector<int>{129} : std::vector<int>{1, 129})
      add("reduced", reduced, {2, 0}, mode, Activation::Situ, T, RoutingKind::Logits, Poison::None, true);
    add("reduced", reduced, {2, 0}, mode, Activation::Situ, 257, RoutingKind::Logits, Poison::None, true);
    cases.back().kernel = GemmKernel::Wgmma;
  }
  // K split into 3 (GEMM1) and 2 (GEMM2) ranges: partial rows, the activation stage, split sums.
  for (Mode mode : modes)
    for (Activation act : activations)
      for (int T : quick ? std::vector<int>{17} : std::vector<int>{1, 17, 129}) {
        add("reduced", reduced, {1, 0}, mode, act, T, RoutingKind::Logits);
        cases.back().splits = 3;
      }
  for (Mode mode : modes) {
    add("reduced", reduced, {1, 0}, mode, Activation::Situ, 33, RoutingKind::Skewed, Poison::NanWeightScale);
    cases.back().splits = 3;
  }
  // K split into 2 ranges with tiles of more than 8 tokens: the activation stage's 2-split kernel
  // that is not beside GEMM1, which drops its input from L2 once read (Kimi-K3 local28 T = 32 runs
  // it as the heuristic chooses).
  for (Mode mode : modes) {
    add("reduced", reduced, {1, 0}, mode, Activation::Situ, 33, RoutingKind::Logits);
    cases.back().splits = 2;
  }
  for (Mode mode : modes)
    for (int T : quick ? std::vector<int>{64} : std::vector<int>{1, 64, 1024})
      add("ep32-896", ep32_896_config(), {32, 7}, mode, Activation::Situ, T, RoutingKind::Logits);
  // 128-row units on 8-token tiles: in the reduced shape GEMM2's (its last row group is half
  // one; GEMM1's K = 384 keeps 256-row units), in ep32-896 both GEMMs', K whole and GEMM1 split in
  // two; in Kimi-K3's both, as at local28 T = 8. On 16-token tiles: ep32-896 T = 700 (12.5 rows
  // per expert, some past 16) and Kimi-K3's local28 T = 16.
  for (Mode mode : modes) {
    for (int T : quick ? std::vector<int>{17} : std::vector<int>{1, 17}) {
      add("reduced", reduced, {1, 0}, mode, Activation::Situ, T, RoutingKind::Logits);
      cases.back().unit_rows = 128;
    }
    for (int splits : {1, 2}) {
      add("ep32-896", ep32_896_config(), {32, 7}, mode, Activation::Situ, 300, RoutingKind::Logits);
      cases.back().unit_rows = 128;
      cases.back().splits = splits;
    }
    for (int splits : quick ? std::vector<int>{2} : std::vector<int>{1, 2}) {
      add("ep32-896", ep32_896_config(), {32, 7}, mode, Activation::Situ, 700, RoutingKind::Logits);
      cases.back().unit_rows = 128;
      cases.back().splits = splits;
    }
    if (!quick)
      for (int T : {8, 16}) {
        add("k3-local28", k3_local28_config(), {1, 0}, mode, Activation::Situ, T, RoutingKind::Logits);
        cases.back().unit_rows = 128;
      }
  }

  for (Mode mode : modes)
    for (Poison poison : {Poison::NanX, Poison::InfX, Poison::NanWeightScale, Poison::ExtremeScales})
      for (int T : quick ? std::vector<int>{33} : std::vector<int>{33, 300}) {
        add("reduced", reduced, {1, 0}, mode, Activation::Situ, T, RoutingKind::Skewed, poison);
        if (T == 300) cases.back().kernel = GemmKernel::Wgmma;
      }

  for (Mode mode : modes)
    for (int T : quick ? std::vector<int>{1} : std::vector<int>{1, 32, 128})
      add("k3-local28", k3_local28_config(), {1, 0}, mode, Activation::Situ, T, RoutingKind::Logits);
  // The input sets that measured the largest distances to the emulation (docs/PRECISION.md),
  // drawn as they were then (their seeds came from their index): a16's long tail of rounding
  // flips (8.46e-4), and mxfp8 group amaxes crossing powers of two (1.13e-3).
  add("k3-local28", k3_local28_config(), {1, 0}, Mode::A16, Activation::Situ, 1, RoutingKind::Logits);
  cases.back().seed = 1080;
  add("reduced", reduced, {1, 0}, Mode::Mxfp8, Activation::Situ, 90, RoutingKind::Logits);
  cases.back().seed = 1046;
  for (Case& c : cases)
    if (c.seed == 0) c.seed = case_seed(c);
  return cases;
}

Result run(const Case& c) {
  const auto start = std::chrono::steady_clock::now();
  Result res;
  res.spec = c;
  const Tolerance tol = tolerance(c.mode);
  auto fail = [&](const std::string& why) {
    if (res.failure.empty()) res.failure = why;
  };

  auto experts = experts_for(c, c.ep);
  const Inputs in = make_inputs(c, c.seed);
  const int num_local = c.ep.num_local(c.config.num_experts), first = c.ep.first_expert(c.config.num_experts);
  std::vector<bool> hit(num_local, false);
  for (int32_t id : in.routing_for_reference.ids)
    if (id >= first && id < first + num_local) hit[id - first] = true;
  res.experts_hit = int(std::count(hit.begin(), hit.end(), true));

  ReferenceProblem problem{&experts->host, c.tokens, in.x, &in.routing_for_reference, c.mode, c.activation,
                           c.config.activation_params};
  const std::vector<double> ref_emulate = reference_forward(problem, Precision::Emulate);
  const std::vector<double> ref_ideal = reference_forward(problem, Precision::Ideal);

  MoePlan plan = MoePlan::create(plan_options(c));
  CudaStream stream;
  DeviceInputs d(c, in);
  const bool from_logits = c.routing == RoutingKind::Logits;

  const std::vector<uint16_t> out = run_eager(plan, experts->device, d, from_logits, stream);
  if (from_logits) {
    res.ids_exact = d.ids.download<int32_t>() == in.routing_for_reference.ids &&
                    d.weights.download<float>() == in.routing_for_reference.weights;
    if (!res.ids_exact) fail("GPU routing differs from the reference");
  }
  for (int run = 0; run < 2; ++run)
    if (run_eager(plan, experts->device, d, from_logits, stream) != out) res.repeat_bitwise = false;
  if (!res.repeat_bitwise) fail("eager re-runs are not bitwise equal");

  const std::vector<double> gpu = widen(out);
  for (size_t i = 0; i < gpu.size(); ++i)
    if (std::isfinite(gpu[i]) != std::isfinite(ref_emulate[i])) {
      res.finite_mask_ok = false;
      fail("element " + std::to_string(i) + " (token " + std::to_string(i / c.config.hidden) + ") is " +
           (std::isfinite(gpu[i]) ? "finite" : "non-finite") + ", the reference's is not");
      break;
    }
  res.vs_emulate = compare_outputs(gpu, ref_emulate);
  res.vs_ideal = compare_outputs(gpu, ref_ideal);
  if (!(res.vs_emulate.rel_l2 <= tol.rel_l2)) fail("rel-L2 vs emulation above " + std::to_string(tol.rel_l2));
  if (!(res.vs_ideal.rel_l2 <= tol.ideal_rel_l2)) fail("rel-L2 vs ideal above " + std::to_string(tol.ideal_rel_l2));

  if (c.tokens > 0) {
    // Capture once, replay on the same data, then on new data written into the same buffers.
    const CapturedGraph g(stream, [&] { plan.forward(experts->device, d.args(from_logits), stream); });
    auto replay = [&] {
      d.out.fill_bytes(0xFF);
      g.launch(stream);
      K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      return d.out.download<uint16_t>();
    };
    if (replay() != out) res.graph_bitwise = false;
    const Inputs next = make_inputs(c, c.seed + 7777);
    d.x.upload(next.x.data());
    if (from_logits) d.logits.upload(next.logits.data());
    const std::vector<uint16_t> eager_next = run_eager(plan, experts->device, d, from_logits, stream);
    // New inputs must change a non-zero output (else the replay might not have read them).
    const bool output_nonzero = std::any_of(out.begin(), out.end(), [](uint16_t b) { return (b & 0x7FFF) != 0; });
    if (replay() != eager_next || (output_nonzero && eager_next == out)) res.graph_bitwise = false;
    if (!res.graph_bitwise) fail("graph replay differs from eager");
  }

  if (c.ep_sum_check) {
    Case single = c;
    single.ep = ExpertParallel{1, 0};
    auto single_experts = experts_for(single, single.ep);
    MoePlan single_plan = MoePlan::create({c.config, std::max(1, c.tokens), c.mode, c.activation,
                                           c.config.activation_params, single.ep, 0});
    DeviceInputs sd(single, in);
    const auto single_out = run_eager(single_plan, single_experts->device, sd, from_logits, stream);
    res.ep_sum_rel_l2 = ep_sum_distance(c, in, single_out);
    // Each of the P + 1 outputs carries one bf16 rounding (2^-9 relative at most).
    if (!(res.ep_sum_rel_l2 <= (c.ep.size + 1) * kBf16Unit)) fail("EP ranks do not sum to the single-rank output");
  }

  res.pass = res.failure.empty();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

std::string routing_name(RoutingKind r) {
  switch (r) {
    case RoutingKind::Logits: return "logits";
    case RoutingKind::Skewed: return "skewed";
    case RoutingKind::OneExpert: return "one-expert";
    case RoutingKind::Duplicate: return "duplicate";
    case RoutingKind::EmptyExperts: return "empty-experts";
    case RoutingKind::MinusOne: return "minus-one";
    case RoutingKind::Garbage: return "garbage-ids";
  }
  return "?";
}

std::string poison_name(Poison p) {
  switch (p) {
    case Poison::None: return "-";
    case Poison::NanX: return "nan-x";
    case Poison::InfX: return "inf-x";
    case Poison::NanWeightScale: return "nan-scale";
    case Poison::ExtremeScales: return "extreme-sc";
  }
  return "?";
}

std::string header_line() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-11s %-6s %-10s %5s %-13s %-8s %-10s %4s %10s %10s %10s %10s %5s %5s  %s", "shape",
                "mode", "act", "T", "routing", "EP", "poison", "hit", "relL2-emu", "cos-emu", "relL2-ideal",
                "cos-ideal", "det", "graph", "result");
  return buf;
}

std::string result_line(const Result& r) {
  const Case& c = r.spec;
  char ep[24], buf[512];
  std::snprintf(ep, sizeof ep, "%d/%d%s", c.ep.rank, c.ep.size,
                c.unit_rows ? " u128" : c.splits ? " ks" : c.kernel == GemmKernel::Wgmma ? " wg" : "");
  std::snprintf(buf, sizeof buf, "%-11s %-6s %-10s %5d %-13s %-8s %-10s %4d %10.2e %10.7f %10.2e %10.7f %5s %5s  %s%s",
                c.shape.c_str(), std::string(to_string(c.mode)).c_str(), std::string(to_string(c.activation)).c_str(),
                c.tokens, routing_name(c.routing).c_str(), ep, poison_name(c.poison).c_str(), r.experts_hit,
                r.vs_emulate.rel_l2, r.vs_emulate.cosine, r.vs_ideal.rel_l2, r.vs_ideal.cosine,
                r.repeat_bitwise ? "ok" : "FAIL", c.tokens == 0 ? "-" : r.graph_bitwise ? "ok" : "FAIL",
                r.pass ? "pass" : "FAIL: ", r.failure.c_str());
  return buf;
}

std::string results_json(const std::vector<Result>& results, const std::string& commit) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Result& r : results) {
    const Case& c = r.spec;
    const Tolerance tol = tolerance(c.mode);
    rows.push_back({{"shape", c.shape},
                    {"H", c.config.hidden},
                    {"I", c.config.intermediate},
                    {"E", c.config.num_experts},
                    {"K", c.config.top_k},
                    {"mode", to_string(c.mode)},
                    {"activation", to_string(c.activation)},
                    {"tokens", c.tokens},
                    {"routing", routing_name(c.routing)},
                    {"ep_size", c.ep.size},
                    {"ep_rank", c.ep.rank},
                    {"poison", poison_name(c.poison)},
                    {"forced_splits", c.splits},
                    {"forced_unit_rows", c.unit_rows},
                    {"forced_kernel", c.kernel == GemmKernel::Wgmma ? "wgmma" : "auto"},
                    {"seed", c.seed},
                    {"experts_hit", r.experts_hit},
                    {"rel_l2_vs_emulate", r.vs_emulate.rel_l2},
                    {"cosine_vs_emulate", r.vs_emulate.cosine},
                    {"rel_l2_vs_ideal", r.vs_ideal.rel_l2},
                    {"cosine_vs_ideal", r.vs_ideal.cosine},
                    {"tolerance_rel_l2", tol.rel_l2},
                    {"tolerance_ideal_rel_l2", tol.ideal_rel_l2},
                    {"ids_exact", r.ids_exact},
                    {"finite_mask_ok", r.finite_mask_ok},
                    {"repeat_bitwise", r.repeat_bitwise},
                    {"graph_bitwise", r.graph_bitwise},
                    {"ep_sum_rel_l2", r.ep_sum_rel_l2},
                    {"pass", r.pass},
                    {"failure", r.failure},
                    {"seconds", r.seconds}});
  }
  cudaDeviceProp prop{};
  int driver = 0;
  cudaGetDeviceProperties(&prop, 0);
  cudaDriverGetVersion(&driver);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  int failed = 0;
  for (const Result& r : results) failed += r.pass ? 0 : 1;
  nlohmann::json doc{{"machine", prop.name}, {"driver", driver}, {"commit", commit}, {"date", date},
                     {"cases", results.size()}, {"failed", failed}, {"rows", rows}};
  return doc.dump(1);
}

}  // namespace k3moe::validation
