#include "k3moe/synthetic.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "bounded_json.h"
#include "fast_mxfp4.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/safetensors.h"
#include "runtime/worker_threads.h"

namespace k3moe {
namespace {

// ------------------------------------------------------------------ random numbers
// NOTE: a counter-based scheme: every (seed, layer, expert, tensor, row) gets its own splitmix64
// stream, so any row can be generated alone, in any order, on any thread.
enum class Stream : uint64_t { W1 = 1, W3 = 3, W2 = 2, GateWeight = 4, GateBias = 5 };

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, int layer, int expert, Stream stream, int64_t row) {
  uint64_t k = mix64(seed + kGolden);
  k = mix64(k + uint64_t(uint32_t(layer)) + kGolden);
  k = mix64(k + uint64_t(uint32_t(expert)) + kGolden);
  k = mix64(k + uint64_t(stream) + kGolden);
  return mix64(k + uint64_t(row) + kGolden);
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix64(state += kGolden); }
  double uniform() { return double(next() >> 11) * 0x1p-53; }  // [0, 1)
};

// Standard normal samples by a piecewise-linear inverse CDF: 4096 equal-probability intervals
// whose knots are Phi^-1((i + 0.5) / 4097), so the distribution is symmetric and reaches +-3.49.
class NormalTable {
 public:
  static constexpr int kBits = 12;
  static constexpr int kSize = 1 << kBits;

  NormalTable() {
    std::array<double, kSize + 1> knot{};
    for (int i = 0; i <= kSize; ++i) knot[size_t(i)] = inverse_phi((i + 0.5) / (kSize + 1));
    for (int i = 0; i < kSize; ++i) {
      base_[size_t(i)] = float(knot[size_t(i)]);
      step_[size_t(i)] = float(knot[size_t(i) + 1] - knot[size_t(i)]);
    }
  }

  // One sample from 32 random bits: the top 12 pick the interval, the low 20 the point in it.
  float operator()(uint32_t bits) const {
    const uint32_t i = bits >> (32 - kBits);
    const float f = float(bits & ((1u << (32 - kBits)) - 1)) * 0x1p-20f;
    return base_[i] + f * step_[i];
  }

 private:
  static double inverse_phi(double p) {
    double lo = -10.0, hi = 10.0;
    for (int it = 0; it < 80; ++it) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  }
  std::array<float, kSize> base_{}, step_{};
};

const NormalTable& normal_table() {
  static const NormalTable table;
  return table;
}

// ------------------------------------------------------------------ one row, one expert

// quantize_mxfp4_group's bytes, tabulated for speed (see fast_mxfp4.h).
const detail::Mxfp4GroupEncoder& mxfp4_encoder() {
  static const detail::Mxfp4GroupEncoder encoder;
  return encoder;
}

// One weight row of `cols` values: N(0, sd^2) with sd log-uniform in [0.5, 2] / sqrt(cols), MXFP4.
void generate_row(uint64_t key, int cols, float* scratch, uint8_t* packed, uint8_t* scales) {
  const NormalTable& normal = normal_table();
  SplitMix64 rng{key};
  const float sd = float(std::exp2(-1.0 + 2.0 * rng.uniform()) / std::sqrt(double(cols)));
  for (int k = 0; k < cols; k += 2) {
    const uint64_t r = rng.next();
    scratch[k] = normal(uint32_t(r >> 32)) * sd;
    scratch[k + 1] = normal(uint32_t(r)) * sd;
  }
  const detail::Mxfp4GroupEncoder& encoder = mxfp4_encoder();
  for (int g = 0; g < cols / 32; ++g) scales[g] = encoder.quantize_group(scratch + 32 * g, packed + 16 * g);
}

// One expert in RankExperts' per-expert layout: W13 = [W1; W3] (2I rows of H), W2 (H rows of I).
struct ExpertView {
  uint8_t* w13_packed;
  uint8_t* w13_scale;
  uint8_t* w2_packed;
  uint8_t* w2_scale;
};

void generate_expert(const SyntheticSpec& spec, int layer, int expert, const ExpertView& out,
                     std::vector<float>& scratch) {
  const int H = spec.config.hidden, I = spec.config.intermediate;
  scratch.resize(size_t(std::max(H, I)));
  for (int half = 0; half < 2; ++half) {
    const Stream stream = half == 0 ? Stream::W1 : Stream::W3;
    for (int n = 0; n < I; ++n) {
      const int64_t row = int64_t(half) * I + n;
      generate_row(stream_key(spec.seed, layer, expert, stream, n), H, scratch.data(),
                   out.w13_packed + row * (H / 2), out.w13_scale + row * (H / 32));
    }
  }
  for (int n = 0; n < H; ++n)
    generate_row(stream_key(spec.seed, layer, expert, Stream::W2, n), I, scratch.data(),
                 out.w2_packed + int64_t(n) * (I / 2), out.w2_scale + int64_t(n) * (I / 32));
}

constexpr const char* kThreadsWhat = "synthetic checkpoint (SyntheticSpec::threads sets fewer threads)";

int thread_count(const SyntheticSpec& spec) {
  if (spec.threads > 0) return spec.threads;
  return std::max(1, int(std::thread::hardware_concurrency()));
}

std::vector<int> spec_layers(const SyntheticSpec& spec) {
  const MoeConfig& c = spec.config;
  std::set<int> layers(spec.layers.begin(), spec.layers.end());
  if (layers.empty()) layers.insert(c.first_moe_layer());
  for (int layer : layers)
    K3MOE_CHECK(c.is_moe_layer(layer), "synthetic checkpoint: layer ", layer, " is not a MoE layer of the config ",
                "(num_hidden_layers ", c.num_layers, ", first_k_dense_replace ", c.first_k_dense_replace,
                ", moe_layer_freq ", c.moe_layer_freq, ")");
  return {layers.begin(), layers.end()};
}

void check_spec(const SyntheticSpec& spec) {
  spec.config.validate();
  K3MOE_CHECK(spec.num_shards >= 1 && spec.num_shards <= spec.config.num_experts,
              "synthetic checkpoint: num_shards must be in [1, num_experts = ", spec.config.num_experts, "], got ",
              spec.num_shards);
  K3MOE_CHECK(spec.threads >= 0, "synthetic checkpoint: threads must be >= 0, got ", spec.threads);
  // Tensor names are JSON strings in the index and the headers.
  K3MOE_CHECK(detail::is_utf8(spec.prefix), "synthetic checkpoint: the tensor-name prefix must be UTF-8");
}

// ------------------------------------------------------------------ the files

struct ExpertBuffers {
  std::vector<uint8_t> w13_packed, w13_scale, w2_packed, w2_scale;
  explicit ExpertBuffers(const MoeConfig& c)
      : w13_packed(size_t(2) * c.intermediate * (c.hidden / 2)),
        w13_scale(size_t(2) * c.intermediate * (c.hidden / 32)),
        w2_packed(size_t(c.hidden) * (c.intermediate / 2)),
        w2_scale(size_t(c.hidden) * (c.intermediate / 32)) {}
  ExpertView view() { return {w13_packed.data(), w13_scale.data(), w2_packed.data(), w2_scale.data()}; }
};

struct Job {
  int shard, layer, expert;
};

std::string shard_name(int shard, int num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", shard + 1, num_shards);
  return buf;
}

std::string name_of(const SyntheticSpec& spec, int layer, int expert, const char* tail) {
  return spec.prefix + "layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." + tail;
}

std::string router_name(const SyntheticSpec& spec, int layer, const char* tail) {
  return spec.prefix + "layers." + std::to_string(layer) + ".mlp.gate." + tail;
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t b = float_to_bf16_bits(values[i]);
    out[2 * i] = uint8_t(b);
    out[2 * i + 1] = uint8_t(b >> 8);
  }
  return out;
}

// Generates experts on worker threads into a ring of buffers while the caller writes them out in
// order, so the disk and the cores stay busy together and memory stays bounded.
class ExpertPipeline {
 public:
  // Workers beyond the number of jobs would have nothing to do, and each has a ring slot.
  ExpertPipeline(const SyntheticSpec& spec, const std::vector<Job>& jobs, int threads)
      : spec_(spec), jobs_(jobs) {
    const int workers = int(std::min<int64_t>(threads, int64_t(jobs.size())));
    const size_t ring = size_t(workers) + 2;
    for (size_t i = 0; i < ring; ++i) slots_.push_back({ExpertBuffers(spec.config), -1});
    start_threads(workers_, workers, kThreadsWhat, [this] { work(); }, [this] { stop(); });
  }
  ~ExpertPipeline() {
    stop();
    for (std::thread& t : workers_) t.join();
  }

  // The buffers of job j, once generated. Valid until release(j).
  ExpertBuffers& acquire(int64_t j) {
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slots_[size_t(j) % slots_.size()];
    changed_.wait(lock, [&] { return slot.ready_job == j || failure_; });
    if (failure_) std::rethrow_exception(failure_);
    return slot.buffers;
  }
  void release(int64_t j) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = j + 1;
    }
    changed_.notify_all();
  }

 private:
  struct Slot {
    ExpertBuffers buffers;
    int64_t ready_job;
  };

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
  }

  void work() {
    std::vector<float> scratch;
    for (;;) {
      int64_t j = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || next_ >= int64_t(jobs_.size()) ||
                                         next_ < released_ + int64_t(slots_.size()); });
        if (stop_ || next_ >= int64_t(jobs_.size())) return;
        j = next_++;
      }
      Slot& slot = slots_[size_t(j) % slots_.size()];
      try {
        generate_expert(spec_, jobs_[size_t(j)].layer, jobs_[size_t(j)].expert, slot.buffers.view(), scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slot.ready_job = j;
      }
      changed_.notify_all();
    }
  }

  const SyntheticSpec& spec_;
  const std::vector<Job>& jobs_;
  std::vector<Slot> slots_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t next_ = 0, released_ = 0;
  bool stop_ = false;
  std::exception_ptr failure_;
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  K3MOE_CHECK(out.good(), path.string(), ": cannot create");
  out << text;
  out.close();
  K3MOE_CHECK(out.good(), path.string(), ": write failed");
}

// A directory of its own inside `dir` (on the same file system, so that its files move into `dir`
// by rename), removed with what it holds when the writer fails.
class StagingDir {
 public:
  explicit StagingDir(const std::filesystem::path& dir) {
    std::string name = (dir / ".make-checkpoint-XXXXXX").string();
    K3MOE_CHECK(mkdtemp(name.data()) != nullptr, dir.string(), ": cannot create a staging directory in it: ",
                std::strerror(errno));
    path_ = name;
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

void move_into(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code error;
  std::filesystem::rename(from, to, error);
  K3MOE_CHECK(!error, to.string(), ": cannot move the written file there: ", error.message());
}

}  // namespace

void write_synthetic_checkpoint(const std::filesystem::path& dir, const SyntheticSpec& spec,
                                const ProgressFn& progress) {
  check_spec(spec);
  const MoeConfig& c = spec.config;
  const std::vector<int> layers = spec_layers(spec);
  const int S = spec.num_shards, E = c.num_experts;
  K3MOE_CHECK(!dir.empty(), "synthetic checkpoint: the output directory must be given, got an empty path");
  std::filesystem::create_directories(dir);
  // Every file is written into a staging directory first and moved into `dir` only once all are
  // complete, config.json last (synthetic.h says what a failure leaves).
  const StagingDir staging(dir);

  // Shard s holds experts [s E / S, (s + 1) E / S) of every layer; the last shard also the routers.
  std::vector<Job> jobs;
  std::vector<std::vector<SafetensorsWriter::Entry>> entries(static_cast<size_t>(S));
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  auto declare = [&](int shard, std::string name, Dtype dtype, std::vector<int64_t> shape) {
    int64_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= d;
    total_size += uint64_t(n);
    weight_map[name] = shard_name(shard, S);
    entries[size_t(shard)].push_back({std::move(name), dtype, std::move(shape)});
  };
  const int64_t H = c.hidden, I = c.intermediate;
  for (int s = 0; s < S; ++s) {
    for (int layer : layers) {
      for (int e = int(int64_t(s) * E / S); e < int(int64_t(s + 1) * E / S); ++e) {
        jobs.push_back({s, layer, e});
        for (const char* w : {"w1", "w3"}) {
          declare(s, name_of(spec, layer, e, (std::string(w) + ".weight_packed").c_str()), Dtype::U8, {I, H / 2});
          declare(s, name_of(spec, layer, e, (std::string(w) + ".weight_scale").c_str()), Dtype::U8, {I, H / 32});
        }
        declare(s, name_of(spec, layer, e, "w2.weight_packed"), Dtype::U8, {H, I / 2});
        declare(s, name_of(spec, layer, e, "w2.weight_scale"), Dtype::U8, {H, I / 32});
      }
    }
  }
  for (int layer : layers) {
    declare(S - 1, router_name(spec, layer, "weight"), Dtype::BF16, {E, c.model_hidden});
    declare(S - 1, router_name(spec, layer, "e_score_correction_bias"), Dtype::BF16, {E});
  }

  write_text(staging.path() / "config.json", c.to_json());
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  write_text(staging.path() / "model.safetensors.index.json", index.dump(2) + "\n");

  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  ExpertPipeline pipeline(spec, jobs, thread_count(spec));
  size_t j = 0;
  for (int s = 0; s < S; ++s) {
    SafetensorsWriter writer(staging.path() / shard_name(s, S), entries[size_t(s)], metadata);
    for (; j < jobs.size() && jobs[j].shard == s; ++j) {
      ExpertBuffers& b = pipeline.acquire(int64_t(j));
      const size_t w1p = b.w13_packed.size() / 2, w1s = b.w13_scale.size() / 2;
      const int layer = jobs[j].layer, e = jobs[j].expert;
      writer.write(name_of(spec, layer, e, "w1.weight_packed"), {b.w13_packed.data(), w1p});
      writer.write(name_of(spec, layer, e, "w1.weight_scale"), {b.w13_scale.data(), w1s});
      writer.write(name_of(spec, layer, e, "w3.weight_packed"), {b.w13_packed.data() + w1p, w1p});
      writer.write(name_of(spec, layer, e, "w3.weight_scale"), {b.w13_scale.data() + w1s, w1s});
      writer.write(name_of(spec, layer, e, "w2.weight_packed"), b.w2_packed);
      writer.write(name_of(spec, layer, e, "w2.weight_scale"), b.w2_scale);
      pipeline.release(int64_t(j));
      report(progress, "write experts", int64_t(j) + 1, int64_t(jobs.size()));
    }
    if (s == S - 1) {
      for (int layer : layers) {
        const Router router = synthesize_router(spec, layer);
        writer.write(router_name(spec, layer, "weight"), bf16_bytes(router.weight));
        writer.write(router_name(spec, layer, "e_score_correction_bias"), bf16_bytes(router.bias));
      }
    }
    writer.finish();
  }
  for (int s = 0; s < S; ++s) move_into(staging.path() / shard_name(s, S), dir / shard_name(s, S));
  for (const char* name : {"model.safetensors.index.json", "config.json"})
    move_into(staging.path() / name, dir / name);
}

RankExperts synthesize_experts(const SyntheticSpec& spec, int layer, ExpertParallel ep, const ProgressFn& progress) {
  check_spec(spec);
  const MoeConfig& c = spec.config;
  K3MOE_CHECK(c.is_moe_layer(layer), "synthesize_experts: layer ", layer, " is not a MoE layer of the config");
  RankExperts r = RankExperts::allocate(c, layer, ep);
  const int64_t w13_rows = 2 * int64_t(c.intermediate), w2_rows = c.hidden;
  std::mutex progress_mutex;
  int64_t done = 0;
  parallel_for(r.num_local, thread_count(spec), kThreadsWhat, [&](int64_t local) {
    thread_local std::vector<float> scratch;
    const ExpertView view{r.w13_packed.data() + local * w13_rows * (c.hidden / 2),
                          r.w13_scale.data() + local * w13_rows * (c.hidden / 32),
                          r.w2_packed.data() + local * w2_rows * (c.intermediate / 2),
                          r.w2_scale.data() + local * w2_rows * (c.intermediate / 32)};
    generate_expert(spec, layer, r.first_expert + int(local), view, scratch);
    std::lock_guard<std::mutex> lock(progress_mutex);
    report(progress, "generate experts", ++done, r.num_local);
  });
  return r;
}

Router synthesize_router(const SyntheticSpec& spec, int layer) {
  check_spec(spec);
  const MoeConfig& c = spec.config;
  K3MOE_CHECK(c.is_moe_layer(layer), "synthesize_router: layer ", layer, " is not a MoE layer of the config");
  const NormalTable& normal = normal_table();
  Router router;
  router.num_experts = c.num_experts;
  router.model_hidden = c.model_hidden;
  router.weight.resize(size_t(c.num_experts) * size_t(c.model_hidden));
  router.bias.resize(size_t(c.num_experts));
  // Unit-variance inputs give logits ~ N(0, 1): sd = 1/sqrt(model_hidden). Values are bf16 in the file.
  const float sd = float(1.0 / std::sqrt(double(c.model_hidden)));
  for (int e = 0; e < c.num_experts; ++e) {
    SplitMix64 rng{stream_key(spec.seed, layer, e, Stream::GateWeight, 0)};
    float* row = router.weight.data() + size_t(e) * size_t(c.model_hidden);
    for (int k = 0; k < c.model_hidden; ++k) row[k] = round_to_bf16(normal(uint32_t(rng.next() >> 32)) * sd);
  }
  SplitMix64 rng{stream_key(spec.seed, layer, 0, Stream::GateBias, 0)};
  for (float& b : router.bias) b = round_to_bf16(normal(uint32_t(rng.next() >> 32)) * 0.05f);
  return router;
}

}  // namespace k3moe
