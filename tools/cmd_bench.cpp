// k3moe bench: the benchmark protocol of PERF.md. Ceilings measured in the same run; each case's
// forward captured in CUDA graphs (one per rotated input set), timed over graph replays with events,
// L2 emptied before each (l2_flush.h); realistic random data, the same in both modes; active
// experts counted from the run's routing; per input set the floor = max(bytes / copy ceiling,
// FLOPs / matrix ceiling) and the median replay, averaged over the sets (bench_sets.h); the in-run
// baseline (bench_baseline.h) timed the same way and checked against the forward's output; the SM
// clock sampled while the forward and the ceilings are timed (gpu_clock.h), since a long series may
// run under the power cap.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_baseline.h"
#include "bench_ceilings.h"
#include "bench_sets.h"
#include "bench_stages.h"
#include "bench_timing.h"
#include "cli_common.h"
#include "commands.h"
#include "gpu_clock.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/plan.h"
#include "k3moe/reference.h"
#include "k3moe/synthetic.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_tensor.h"
#include "runtime/tensor_checks.h"

namespace k3moe::cli {
namespace {

constexpr int kInputSets = 4;
constexpr int kRepeats = 80;  // timed replays per series: each input set's median is over 20 (PERF.md)
// Warm-up calls: every input set's graph runs at least once (its first launch uploads it) before
// the timed calls.
constexpr int kWarmup = kInputSets + 1;

struct Shape {
  std::string name;
  MoeConfig config;
  ExpertParallel ep;
};

std::vector<Shape> shapes() {
  MoeConfig local28;
  local28.num_experts = 28;  // top-16 among the 28 experts of one rank
  const MoeConfig k3;
  return {{"local28", local28, {1, 0}}, {"ep32", k3, {32, 0}}, {"ep16", k3, {16, 0}}};
}

struct Case {
  std::string shape;
  int tokens;
  Mode mode;
};

std::vector<Case> suite(const std::string& name) {
  std::vector<Case> cases;
  auto add = [&](const std::string& shape, std::vector<int> tokens) {
    for (Mode mode : {Mode::A16, Mode::Mxfp8})
      for (int t : tokens) cases.push_back({shape, t, mode});
  };
  if (name == "decode" || name == "all") {
    add("local28", {1, 8, 32});
    add("ep32", {8, 64});
    add("ep16", {256});
  }
  if (name == "prefill" || name == "all") {
    add("local28", {128, 512, 1024, 2048, 4096, 16384});
    add("ep16", {8192});
  }
  K3MOE_CHECK(!cases.empty(), "--suite must be decode, prefill or all, got ", name);
  return cases;
}

// Means over the input sets (bench_sets.h) where not said otherwise.
struct Row {
  Case c;
  double active_experts = 0, local_pairs = 0, bytes = 0, flops = 0;
  double us_ids = 0, us_logits = 0, spread_pct = 0, baseline_us = 0;
  double floor_us = 0, floor_ratio = 0;
  std::vector<double> active_per_set, floor_us_per_set, us_per_set;
  double us_series_median = 0;  // the median of the mixed series: how rows were timed before per-set means
  double baseline_rel_l2 = 0;   // the largest over the sets
  std::string baseline_failure;  // why the baseline's output is not the forward's function; empty: it is
  double read_us = 0;  // the streaming-read kernel over the same bytes
  ClockSummary clock;  // the SM clock during the forward's timed replays (us_ids)
  StageSpans stages;   // --stages
};

struct Options {
  std::string suite = "decode", shape, json, commit = "unknown";
  std::vector<int> tokens;
  std::string mode;
  bool no_baseline = false;
  std::vector<int> splits;  // {both} or {GEMM1, GEMM2}; 0: the heuristic's
  int tile = 0;             // 0: the heuristic's
  std::vector<int> unit_rows;  // {both} or {GEMM1, GEMM2}; 0: the heuristic's
  std::string kernel = "auto";
  bool explain = false;
  bool stages = false;
  bool no_clock = false;
  bool idle_launch = false;  // time each call from an idle stream: the host's submission counts (up to Session 63)
  bool per_set = false;
  bool no_l2_flush = false;  // a diagnostic: each timed replay meets what the previous one left in L2
  double sustain_ms = 0.0;  // 0: burst timing (a few warm-up calls); > 0: steady state under load
};

// The share of NVML's samples under the power cap, or "-" without them.
std::string capped_text(const ClockSummary& c) {
  char buf[16] = "-";
  if (c.samples > 0) std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * c.power_capped_fraction);
  return buf;
}

// The clock columns: the median clock the SMs counted (the probe) and capped_text.
std::string clock_columns(const ClockSummary& c) {
  char buf[32] = "     -";
  if (c.counted_median_mhz > 0) std::snprintf(buf, sizeof buf, "%6.0f", c.counted_median_mhz);
  char out[48];
  std::snprintf(out, sizeof out, "%s %6s", buf, capped_text(c).c_str());
  return out;
}

// The baseline and the forward compute the same function up to the baseline's bf16 GEMM outputs
// (k3moe keeps them fp32) and, in mxfp8, k3moe's MXFP8 rounding of the activations, which the
// baseline does not do: relative L2 measured 4.1e-3..4.4e-3 (a16) and 4.7e-2..4.8e-2 (mxfp8) in
// every run up to 8b1ab48; the bounds are about twice that.
double baseline_bound(Mode mode) { return mode == Mode::A16 ? 1e-2 : 1e-1; }

Row run_case(const Case& c, const Shape& shape, const RankExperts& host, const DeviceExperts& experts,
             const Ceilings& ceil, StreamingRead& read, const L2Flush* flush, ClockWatch clock, bool with_baseline,
             const Options& o) {
  const MoeConfig& cfg = shape.config;
  const int64_t T = c.tokens, H = cfg.hidden, E = cfg.num_experts, K = cfg.top_k;
  PlanOptions options{cfg, c.tokens, c.mode, cfg.activation, cfg.activation_params, shape.ep, 0};
  if (!o.splits.empty()) {
    options.gemm1_splits = o.splits.front();
    options.gemm2_splits = o.splits.back();
  }
  options.token_tile = o.tile;
  if (!o.unit_rows.empty()) {
    options.gemm1_unit_rows = o.unit_rows.front();
    options.gemm2_unit_rows = o.unit_rows.back();
  }
  options.gemm_kernel = o.kernel == "wgmma" ? GemmKernel::Wgmma : o.kernel == "mmasync" ? GemmKernel::MmaSync : GemmKernel::Auto;
  MoePlan plan = MoePlan::create(options);
  if (o.explain) std::printf("  %s T=%d %.*s: %s\n", shape.name.c_str(), c.tokens, int(to_string(c.mode).size()), to_string(c.mode).data(),
                             plan.describe(c.tokens).c_str());
  const CudaStream stream;

  struct Set {
    DeviceTensor x, logits, bias, ids, weights, out, out_baseline;
    CapturedGraph with_ids, with_logits, with_stage_times;
    std::map<int, int> local_rows;  // local expert id -> its rows (routed pairs) in this set
  };
  // --stages: a third graph per set that also marks stage_records; the timed graphs do not.
  const DeviceBuffer stage_records(o.stages ? kForwardStages * int64_t(sizeof(StageTimes)) : 0);
  std::vector<std::unique_ptr<Set>> sets;
  // The same inputs and routing in both modes (the seed of a16's rows in every run before).
  std::mt19937_64 rng(uint64_t(c.tokens) * 131);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Row row;
  row.c = c;
  std::unique_ptr<BaselineForward> baseline;
  if (with_baseline) baseline = std::make_unique<BaselineForward>(host, cfg.activation, cfg.activation_params);
  auto capture = [&](const ForwardArgs& args) {
    return CapturedGraph(stream, [&] { plan.forward(experts, args, stream); });
  };
  for (int s = 0; s < kInputSets; ++s) {
    auto set = std::make_unique<Set>();
    std::vector<uint16_t> x(size_t(T * H));
    for (auto& v : x) v = float_to_bf16_bits(normal(rng));
    std::vector<float> logits(size_t(T * E)), bias(static_cast<size_t>(E));
    for (auto& v : logits) v = normal(rng);
    // NOTE: at top-16 of 896 the selected sigmoids sit within a few hundredths of each other, so a
    // bias of spread 0.1 would hand most slots to the few experts it favours (ep16 T = 256: 27 active
    // experts instead of 56). Spread 0.01 keeps the load near uniform, as the trained correction bias
    // does and as the cases (ep32 T = 64 ~ 20 active, ep16 T = 256 ~ 56) assume.
    for (auto& v : bias) v = 0.01f * normal(rng);
    set->x = DeviceTensor::from_host(x, {T, H}, kBf16, 0);
    set->logits = DeviceTensor::from_host(logits, {T, E}, kF32, 0);
    set->bias = DeviceTensor::from_host(bias, {E}, kF32, 0);
    set->ids = DeviceTensor({T, K}, kI32, 0);
    set->weights = DeviceTensor({T, K}, kF32, 0);
    set->out = DeviceTensor({T, H}, kBf16, 0);
    set->out_baseline = DeviceTensor({T, H}, kBf16, 0);
    plan.route(*set->logits.dl(), *set->bias.dl(), *set->ids.dl(), *set->weights.dl(), stream);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto ids = set->ids.download<int32_t>();
    for (int32_t id : ids)
      if (id >= host.first_expert && id < host.first_expert + host.num_local) ++set->local_rows[id];
    ForwardArgs args;
    args.x = set->x.dl();
    args.topk_ids = set->ids.dl();
    args.topk_weights = set->weights.dl();
    args.out = set->out.dl();
    set->with_ids = capture(args);
    ForwardArgs from_logits = args;
    from_logits.topk_ids = from_logits.topk_weights = nullptr;
    from_logits.router_logits = set->logits.dl();
    from_logits.router_bias = set->bias.dl();
    set->with_logits = capture(from_logits);
    if (o.stages) {
      ForwardArgs marked = args;
      marked.stage_times = stage_records.get<StageTimes>();
      set->with_stage_times = capture(marked);
    }
    if (baseline)
      baseline->add_input_set(static_cast<const uint16_t*>(set->x.data()), ids, set->weights.download<float>(),
                              static_cast<uint16_t*>(set->out_baseline.data()), c.tokens, stream);
    sets.push_back(std::move(set));
  }

  const Timing t_ids = time_ms(stream, kWarmup, kRepeats, [&](int i) {
    sets[i % kInputSets]->with_ids.launch(stream);
  }, o.sustain_ms, clock, flush);
  const Timing t_logits = time_ms(stream, kWarmup, kRepeats, [&](int i) {
    sets[i % kInputSets]->with_logits.launch(stream);
  }, o.sustain_ms, {}, flush);
  // Call i of a series ran set i % kInputSets, and the first timed call is call kWarmup.
  const auto us_over_sets = [](const Timing& t) {
    return 1000.0 * mean_of(median_per_set(t.in_order_ms, kWarmup % kInputSets, kInputSets));
  };
  for (double ms : median_per_set(t_ids.in_order_ms, kWarmup % kInputSets, kInputSets))
    row.us_per_set.push_back(1000.0 * ms);
  row.us_ids = mean_of(row.us_per_set);
  row.us_series_median = 1000.0 * t_ids.median_ms;
  row.clock = t_ids.clock;

  row.us_logits = us_over_sets(t_logits);
  // The range of one series' timed replays over its median. It mixes the input sets' routing and
  // the GPU's power state; it is not the run-to-run spread (that takes two runs: bench/NOTES.md).
  row.spread_pct = 100.0 * (t_ids.max_ms - t_ids.min_ms) / t_ids.median_ms;
  // --per-set: is a spread between input sets (their routing) or within each?
  // Each call's us, the clock the SMs counted after it and NVML's last reading before its end (MHz,
  // and its clock event reasons in hex when there are any).
  auto print_in_order = [](const char* what, const Timing& t) {
    std::printf("         %s, us in order%s:", what, t.counted_mhz.empty() ? "" : " @ counted MHz, NVML MHz[, reasons]");
    size_t next = 0;
    for (size_t i = 0; i < t.in_order_ms.size(); ++i) {
      std::printf(" %.0f", 1000.0 * t.in_order_ms[i]);
      if (i < t.counted_mhz.size()) std::printf("@%.0f", t.counted_mhz[i]);
      if (t.clock_samples.empty() || i >= t.in_order_end_ms.size()) continue;
      while (next + 1 < t.clock_samples.size() && t.clock_samples[next + 1].t_ms <= t.in_order_end_ms[i]) ++next;
      const ClockSample& c = t.clock_samples[next];
      std::printf(",%u", c.mhz);
      if (c.reasons != 0) std::printf(",%llx", static_cast<unsigned long long>(c.reasons));
    }
    if (t.clock.samples > 0)
      std::printf("; memory %.0f MHz (NVML median), reasons seen %llx", t.clock.median_mem_mhz,
                  static_cast<unsigned long long>(t.clock.reasons_seen));
    std::printf("\n");
  };
  if (o.per_set) print_in_order("forward, input sets in turn", t_ids);
  for (int s = 0; o.per_set && s < kInputSets; ++s) {
    const Timing t =
        time_ms(stream, 2, kRepeats / 2, [&](int) { sets[s]->with_ids.launch(stream); }, 0.0, clock, flush);
    int min_rows = INT32_MAX, max_rows = 0, tiles128 = 0;
    for (const auto& [expert, rows] : sets[s]->local_rows) {
      min_rows = std::min(min_rows, rows);
      max_rows = std::max(max_rows, rows);
      tiles128 += (rows + 127) / 128;
    }
    std::printf("         input set %d: %.1f us (min %.1f, max %.1f), %zu experts of %d-%d rows, %d tiles of 128; MHz, "
                "capped: %s\n",
                s, 1000.0 * t.median_ms, 1000.0 * t.min_ms, 1000.0 * t.max_ms, sets[s]->local_rows.size(),
                sets[s]->local_rows.empty() ? 0 : min_rows, max_rows, tiles128, clock_columns(t.clock).c_str());
    print_in_order("  the same set", t);
  }
  if (o.stages)
    row.stages = measure_stage_spans(stream, stage_records, kRepeats, [&](int i) {
      if (flush != nullptr) flush->run(stream);
      sets[i % kInputSets]->with_stage_times.launch(stream);
    });
  if (baseline) {
    const Timing t_base = time_ms(stream, kWarmup, kRepeats,
                                  [&](int i) { baseline->launch(i % kInputSets, stream); }, o.sustain_ms, {}, flush);
    row.baseline_us = us_over_sets(t_base);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    // The baseline must compute the same function: every set's output against ours.
    for (int s = 0; s < kInputSets; ++s) {
      std::vector<double> ours, base;
      for (uint16_t b : sets[s]->out.download<uint16_t>()) ours.push_back(bf16_bits_to_float(b));
      for (uint16_t b : sets[s]->out_baseline.download<uint16_t>()) base.push_back(bf16_bits_to_float(b));
      const Comparison cmp = compare(base, ours);
      row.baseline_rel_l2 = std::max(row.baseline_rel_l2, cmp.rel_l2);
      if (row.baseline_failure.empty() && (cmp.nonfinite_mismatch > 0 || !(cmp.rel_l2 <= baseline_bound(c.mode)))) {
        std::ostringstream why;
        why << c.shape << " T=" << c.tokens << " " << to_string(c.mode) << ", input set " << s
            << ": the baseline's output against the forward's, relative L2 " << cmp.rel_l2 << " (bound "
            << baseline_bound(c.mode) << "), " << cmp.nonfinite_mismatch << " elements finite in one only";
        row.baseline_failure = why.str();
      }
    }
  }

  // Per input set: its routing's bytes (each weight byte, x, the output, ids and weights once),
  // FLOPs and floor; the row's figures are their means.
  const double expert_bytes = double(cfg.expert_bytes());
  const double flops_per_pair = 2.0 * (2.0 * cfg.intermediate * cfg.hidden + double(cfg.hidden) * cfg.intermediate);
  const double matrix_tflops = c.mode == Mode::A16 ? ceil.bf16_tflop_s : ceil.fp8_tflop_s;
  std::vector<double> bytes, pairs;
  for (const auto& set : sets) {
    double local_pairs = 0;
    for (const auto& [expert, rows] : set->local_rows) local_pairs += rows;
    row.active_per_set.push_back(double(set->local_rows.size()));
    bytes.push_back(double(set->local_rows.size()) * expert_bytes + double(T * H * 2 * 2) + double(T * K * 8));
    pairs.push_back(local_pairs);
    row.floor_us_per_set.push_back(
        std::max(bytes.back() / (ceil.copy_tb_s * 1e12), flops_per_pair * local_pairs / (matrix_tflops * 1e12)) * 1e6);
  }
  row.active_experts = mean_of(row.active_per_set);
  row.local_pairs = mean_of(pairs);
  row.bytes = mean_of(bytes);
  row.flops = flops_per_pair * row.local_pairs;
  row.floor_us = mean_of(row.floor_us_per_set);
  row.floor_ratio = row.floor_us / row.us_ids;
  row.read_us = read.median_us(row.bytes, stream, o.sustain_ms);
  return row;
}

nlohmann::json clock_json(const ClockSummary& c) {
  return {{"samples", c.samples},
          {"min_mhz", c.min_mhz},
          {"median_mhz", c.median_mhz},
          {"max_mhz", c.max_mhz},
          {"power_capped_fraction", c.power_capped_fraction},
          {"median_mem_mhz", c.median_mem_mhz},
          {"reasons_seen", c.reasons_seen},
          {"counted_min_mhz", c.counted_min_mhz},
          {"counted_median_mhz", c.counted_median_mhz},
          {"counted_max_mhz", c.counted_max_mhz}};
}

std::string today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

void bench(const Options& o) {
  timed_launch = o.idle_launch ? Launch::Idle : Launch::Held;
  std::vector<Case> cases;
  for (const Case& c : suite(o.suite)) {
    if (!o.shape.empty() && c.shape != o.shape) continue;
    if (!o.tokens.empty() && std::find(o.tokens.begin(), o.tokens.end(), c.tokens) == o.tokens.end()) continue;
    if (!o.mode.empty() && to_string(c.mode) != o.mode) continue;
    cases.push_back(c);
  }
  if (!o.tokens.empty() && !o.shape.empty())  // explicit cases outside the suites
    for (int t : o.tokens)
      for (Mode mode : {Mode::A16, Mode::Mxfp8})
        if ((o.mode.empty() || to_string(mode) == o.mode) &&
            std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return c.tokens == t && c.mode == mode; }))
          cases.push_back({o.shape, t, mode});
  K3MOE_CHECK(!cases.empty(), "bench: no case of --suite ", o.suite, " matches the --shape, --tokens and --mode given",
              o.shape.empty() && !o.tokens.empty() ? " (--tokens outside the suite need --shape)" : "");
  std::string why;
  K3MOE_CHECK(hopper_gpu_available(&why), "bench needs a Hopper GPU: ", why);

  char bus_id[64] = {};
  K3MOE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
  std::unique_ptr<ClockSampler> sampler = o.no_clock ? nullptr : std::make_unique<ClockSampler>(bus_id);
  const std::string no_clock = o.no_clock ? "--no-clock" : sampler->available() ? "" : sampler->why();
  std::unique_ptr<ClockProbe> probe = o.no_clock ? nullptr : std::make_unique<ClockProbe>(kRepeats);
  const ClockWatch clock{no_clock.empty() ? sampler.get() : nullptr, probe.get()};
  std::printf("measuring ceilings (device copy, cuBLASLt bf16 and fp8 8192^3)...\n");
  const Ceilings ceil = measure_ceilings(0, o.sustain_ms, clock);
  std::printf("%s, %d SMs, %.0f MB L2, driver %d, commit %s\n", ceil.gpu_name.c_str(), ceil.sm_count, ceil.l2_mb,
              ceil.driver_version, o.commit.c_str());
  std::printf("ceilings: copy %.2f TB/s, bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s\n", ceil.copy_tb_s, ceil.bf16_tflop_s,
              ceil.fp8_tflop_s);
  if (probe != nullptr)
    std::printf("SM clock: MHz = the median clock the SMs counted (clock64 over the global timer) right after each of "
                "the forward's timed replays; capped = share of NVML's 1 ms samples under the power cap (%s; NVML "
                "lags a change by tens of ms). Ceilings at: copy %.0f MHz (%s capped), bf16 %.0f MHz (%s), fp8 %.0f "
                "MHz (%s)\n\n",
                no_clock.empty() ? "sampled" : no_clock.c_str(), ceil.copy_clock.counted_median_mhz,
                capped_text(ceil.copy_clock).c_str(), ceil.bf16_clock.counted_median_mhz,
                capped_text(ceil.bf16_clock).c_str(), ceil.fp8_clock.counted_median_mhz,
                capped_text(ceil.fp8_clock).c_str());
  else
    std::printf("SM clock: not measured (--no-clock)\n\n");
  if (o.sustain_ms > 0)
    std::printf("timing: every series after %.0f ms of back-to-back calls (the GPU's steady state under load)\n",
                o.sustain_ms);
  else
    std::printf("timing: burst (a few warm-up calls; a series longer than ~0.1 s reaches the power cap: see capped)\n");
  if (o.idle_launch)
    std::printf("launch: each timed call enqueued on an idle stream (--idle-launch): the host's submission counts "
                "in its time, as in runs up to Session 63's\n");
  else
    std::printf("launch: each timed call enqueued behind a held stream: its events time the GPU's work, not the "
                "host's submission\n");
  if (o.no_l2_flush)
    std::printf("L2: NOT emptied before the timed replays (--no-l2-flush): each meets what the one before it left "
                "there, dirty lines included (a diagnostic, not the protocol)\n");
  std::printf("read/t: a kernel that only streams the same bytes, over this case's time (1.0 = as fast as a pure read)\n");
  std::printf("%-8s %5s %-6s %6s %9s %9s %7s %8s %6s %9s %7s %10s %9s %7s %6s %6s %6s\n", "shape", "T", "mode", "experts",
              "us", "us+route", "TB/s", "TFLOP/s", "floor", "floor/t", "read/t", "baseline", "speedup", "spread", "base-d",
              "MHz", "capped");
  StreamingRead read;
  std::optional<L2Flush> flush;  // none with --no-l2-flush: its 4x-L2 buffer is not even allocated
  if (!o.no_l2_flush) flush.emplace(0);
  std::map<std::string, std::pair<RankExperts, std::unique_ptr<DeviceExperts>>> loaded;
  std::vector<Row> rows;
  for (const Case& c : cases) {
    const std::vector<Shape> all = shapes();
    const auto shape_it = std::find_if(all.begin(), all.end(), [&](const Shape& s) { return s.name == c.shape; });
    K3MOE_CHECK(shape_it != all.end(), "--shape must be local28, ep32 or ep16, got ", c.shape);
    const Shape& shape = *shape_it;
    if (!loaded.count(c.shape)) {
      loaded.clear();  // one shape's experts on the GPU at a time
      SyntheticSpec spec;
      spec.config = shape.config;
      spec.seed = 42;
      RankExperts host = synthesize_experts(spec, shape.config.first_moe_layer(), shape.ep, stderr_progress());
      auto device = std::make_unique<DeviceExperts>(DeviceExperts::upload(host, 0));
      loaded.emplace(c.shape, std::make_pair(std::move(host), std::move(device)));
    }
    const auto& [host, device] = loaded.at(c.shape);
    const Row r = run_case(c, shape, host, *device, ceil, read, flush ? &*flush : nullptr, clock,
                           !o.no_baseline, o);
    std::printf("%-8s %5d %-6s %6.1f %9.1f %9.1f %7.2f %8.1f %6.1f %9.3f %7.3f %10.1f %8.2fx %6.1f%% %6.0e %s\n",
                c.shape.c_str(), c.tokens, std::string(to_string(c.mode)).c_str(), r.active_experts, r.us_ids,
                r.us_logits, r.bytes / (r.us_ids * 1e-6) / 1e12, r.flops / (r.us_ids * 1e-6) / 1e12, r.floor_us,
                r.floor_ratio, r.read_us / r.us_ids, r.baseline_us, r.baseline_us > 0 ? r.baseline_us / r.us_ids : 0.0,
                r.spread_pct, r.baseline_rel_l2, clock_columns(r.clock).c_str());
    if (!r.baseline_failure.empty()) std::printf("         BASELINE FAILED: %s\n", r.baseline_failure.c_str());
    if (o.stages) std::printf("         stages, us from the first mark (last CTA start / last wait / last end): %s\n",
                              describe(r.stages).c_str());
    std::fflush(stdout);
    rows.push_back(r);
  }

  if (!o.json.empty()) {
    nlohmann::json j;
    j["machine"] = {{"gpu", ceil.gpu_name}, {"sms", ceil.sm_count}, {"l2_mb", ceil.l2_mb}};
    j["driver"] = ceil.driver_version;  // the CUDA driver API version (13000: 13.0)
    j["driver_release"] = sampler != nullptr && !sampler->driver_release().empty() ? sampler->driver_release()
                                                                                    : "unknown";
    j["commit"] = o.commit;
    j["date"] = today();
    j["ceilings"] = {{"copy_tb_s", ceil.copy_tb_s}, {"bf16_tflop_s", ceil.bf16_tflop_s}, {"fp8_tflop_s", ceil.fp8_tflop_s}};
    if (probe != nullptr) {
      j["ceilings"]["copy_sm_clock"] = clock_json(ceil.copy_clock);
      j["ceilings"]["bf16_sm_clock"] = clock_json(ceil.bf16_clock);
      j["ceilings"]["fp8_sm_clock"] = clock_json(ceil.fp8_clock);
    }
    j["protocol"] = {{"input_sets", kInputSets},
                     {"warmup", kWarmup},
                     {"repeats", kRepeats},
                     {"timing", "CUDA graph replay, events; before each timed replay L2 emptied (reads of 4x its "
                                "size) and the GPU idle, then (launch: held) the stream held until the replay and its "
                                "events are enqueued; us = the mean over the input sets of each set's median "
                                "replay (repeats / input_sets each), floor_us = the mean of the sets' floors (up to "
                                "8b1ab48's run: the median of 40 mixed replays, us_series_median here, no L2 flush, "
                                "inputs seeded per mode)"},
                     {"l2_flush", !o.no_l2_flush},
                     {"launch", o.idle_launch ? "idle: the host's submission inside the events (runs up to Session 63's)"
                                              : "held: the GPU's work only (the copy ceiling's 4 GiB memcpy: idle)"},
                     {"sustain_ms", o.sustain_ms},
                     {"sm_clock", probe == nullptr ? "not measured: --no-clock"
                                  : "counted_*: clock64 over the global timer after each timed replay; the rest: "
                                    "NVML every 1 ms during the forward's timed replays" +
                                        (no_clock.empty() ? "" : " (not sampled: " + no_clock + ")")}};
    // Settings that override the heuristic: rows timed with any of them are not the shipped choice.
    j["forced"] = {{"tile", o.tile}, {"kernel", o.kernel}, {"splits", o.splits}, {"unit_rows", o.unit_rows}};
    for (const Row& r : rows) {
      j["rows"].push_back({{"shape", r.c.shape},
                           {"tokens", r.c.tokens},
                           {"mode", to_string(r.c.mode)},
                           {"active_experts", r.active_experts},
                           {"local_pairs", r.local_pairs},
                           {"bytes", r.bytes},
                           {"flops", r.flops},
                           {"us", r.us_ids},
                           {"us_with_routing", r.us_logits},
                           {"tb_s", r.bytes / (r.us_ids * 1e-6) / 1e12},
                           {"tflop_s", r.flops / (r.us_ids * 1e-6) / 1e12},
                           {"floor_us", r.floor_us},
                           {"floor_ratio", r.floor_ratio},
                           {"streaming_read_us", r.read_us},
                           {"read_ratio", r.read_us / r.us_ids},
                           {"spread_pct", r.spread_pct},
                           {"baseline_us", r.baseline_us},
                           {"speedup", r.baseline_us > 0 && r.baseline_failure.empty() ? r.baseline_us / r.us_ids : 0.0},
                           {"baseline_rel_l2_vs_k3moe", r.baseline_rel_l2},
                           {"baseline_failure", r.baseline_failure},
                           {"active_experts_per_set", r.active_per_set},
                           {"floor_us_per_set", r.floor_us_per_set},
                           {"us_per_set", r.us_per_set},
                           {"us_series_median", r.us_series_median}});
      if (probe != nullptr) j["rows"].back()["sm_clock"] = clock_json(r.clock);
      for (int s = 0; s < int(r.stages.size()); ++s)
        if (r.stages[s].ran)
          j["rows"].back()["stages_us"][std::string(to_string(ForwardStage(s)))] = {
              {"last_start", r.stages[s].start_us}, {"last_wait", r.stages[s].wait_us}, {"last_end", r.stages[s].end_us}};
    }
    std::ofstream(o.json) << j.dump(1) << "\n";
    std::printf("\nwrote %s\n", o.json.c_str());
  }
  std::string failures;
  for (const Row& r : rows)
    if (!r.baseline_failure.empty()) failures += "\n  " + r.baseline_failure;
  K3MOE_CHECK(failures.empty(), "bench: the baseline does not compute the forward's function (no speed-up is valid):",
              failures);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark the forward against the physical floor (PERF.md protocol)");
  auto o = std::make_shared<Options>();
  cmd->add_option("--suite", o->suite, "decode | prefill | all")
      ->capture_default_str()
      ->check(CLI::IsMember({"decode", "prefill", "all"}));
  cmd->add_option("--shape", o->shape, "local28 | ep32 | ep16")->check(CLI::IsMember({"local28", "ep32", "ep16"}));
  cmd->add_option("--tokens", o->tokens, "Token counts (with --shape: also outside the suite)")
      ->check(non_negative_integer());
  cmd->add_option("--mode", o->mode, "a16 | mxfp8")->check(CLI::IsMember({"a16", "mxfp8"}));
  cmd->add_option("--json", o->json, "Write the rows, ceilings, device, commit and date as JSON");
  cmd->add_option("--commit", o->commit, "The commit being measured (recorded in the JSON)");
  cmd->add_flag("--no-baseline", o->no_baseline, "Skip the dequantize + cuBLASLt baseline");
  cmd->add_option("--splits", o->splits, "Force the K split: N for both GEMMs, or N1,N2 (0: the heuristic's)")
      ->delimiter(',')
      ->expected(1, 2)
      ->check(non_negative_integer());
  cmd->add_option("--unit-rows", o->unit_rows,
                  "Force the weight rows per work unit on 8- and 16-token tiles: N for both GEMMs, or N1,N2 (128 or 256; 0: "
                  "the heuristic's)")
      ->delimiter(',')
      ->expected(1, 2)
      ->check(CLI::IsMember({0, 128, 256}));
  cmd->add_option("--tile", o->tile, "Force the expert GEMMs' token tile: 8, 16, 24, 32 (mma.sync) or 32, 64, 96, 128 (wgmma); 0: the heuristic's")
      ->check(non_negative_integer())
      ->check(CLI::IsMember({0, 8, 16, 24, 32, 64, 96, 128}));
  cmd->add_option("--kernel", o->kernel, "Force the expert GEMMs' kernel: auto, mmasync or wgmma")
      ->check(CLI::IsMember({"auto", "mmasync", "wgmma"}));
  cmd->add_option("--sustain-ms", o->sustain_ms,
                  "Run each timed call (forward, ceiling, pure read, baseline) back to back for this long before "
                  "timing it: the GPU's steady state under load (power-limited); 0: burst timing")
      ->check(CLI::Range(0.0, 600000.0))
      ->capture_default_str();
  cmd->add_flag("--per-set", o->per_set,
                "Print the timed replays in order, each with the clock after it, then time each rotated input set "
                "alone (their routing differs) with its rows per expert");
  cmd->add_flag("--no-l2-flush", o->no_l2_flush,
                "A diagnostic: do not empty L2 before each timed replay, so that each meets what the previous one "
                "left there (clean and dirty lines), as runs up to 8b1ab48's did");
  cmd->add_flag("--idle-launch", o->idle_launch,
                "Enqueue each timed call on an idle stream, so that the host's submission (0.2-0.8 us of a decode "
                "forward on an H100) counts in its time, as runs up to Session 63's did; by default the stream is "
                "held until the call and its events are enqueued");
  cmd->add_flag("--no-clock", o->no_clock,
                "Do not measure the SM clock (NVML samples during the timed series, a probe after each call)");
  cmd->add_flag("--explain", o->explain, "Print each case's plan: the kernels the heuristic chose and why");
  cmd->add_flag("--stages", o->stages,
                "Print when each stage ran in the replayed graph (medians; a separate graph with stage_times)");
  cmd->callback([o] { bench(*o); });
}

}  // namespace k3moe::cli
