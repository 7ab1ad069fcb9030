#include "k3moe/checkpoint.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "bounded_json.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/safetensors.h"
#include "runtime/worker_threads.h"

namespace k3moe {
namespace {

using nlohmann::json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr size_t kMaxProblems = 100;
constexpr int kLoadThreads = 4;
constexpr int kMaxJsonDepth = 64;

// {prefix}layers.{layer}.mlp.experts.{expert}.{rest}
struct ExpertName {
  std::string_view prefix;
  int layer = 0;
  int expert = 0;
};

bool parse_index_number(std::string_view text, size_t& pos, int& value) {
  const size_t start = pos;
  while (pos < text.size() && pos - start < 9 && text[pos] >= '0' && text[pos] <= '9') ++pos;
  if (pos == start) return false;
  std::from_chars(text.data() + start, text.data() + pos, value);
  return true;
}

std::optional<ExpertName> parse_expert_name(std::string_view name) {
  constexpr std::string_view kLayers = "layers.", kExperts = ".mlp.experts.";
  for (size_t at = name.find(kLayers); at != std::string_view::npos; at = name.find(kLayers, at + 1)) {
    ExpertName parsed{name.substr(0, at)};
    size_t pos = at + kLayers.size();
    if (!parse_index_number(name, pos, parsed.layer)) continue;
    if (name.substr(pos, kExperts.size()) != kExperts) continue;
    pos += kExperts.size();
    if (!parse_index_number(name, pos, parsed.expert)) continue;
    if (pos >= name.size() || name[pos] != '.') continue;
    return parsed;
  }
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string layer_list(const std::vector<int>& layers) {
  if (layers.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]) +
           (j > i ? ".." + std::to_string(layers[j]) : std::string());
    i = j + 1;
  }
  return out;
}

// The six tensors of one expert and where they land in RankExperts.
struct ExpertPart {
  const char* which;
  const char* part;
};
constexpr std::array<ExpertPart, 6> kExpertParts{{{"w1", "weight_packed"},
                                                  {"w1", "weight_scale"},
                                                  {"w3", "weight_packed"},
                                                  {"w3", "weight_scale"},
                                                  {"w2", "weight_packed"},
                                                  {"w2", "weight_scale"}}};

std::vector<int64_t> expected_shape(const MoeConfig& c, const ExpertPart& p) {
  const bool down = std::strcmp(p.which, "w2") == 0;
  const bool packed = std::strcmp(p.part, "weight_packed") == 0;
  const int64_t rows = down ? c.hidden : c.intermediate;
  const int64_t k = down ? c.intermediate : c.hidden;
  return {rows, packed ? k / 2 : k / 32};
}

struct Located {
  const SafetensorsFile* file;
  const TensorInfo* info;
  std::string shard_path;
};

}  // namespace

struct Checkpoint::Impl {
  std::filesystem::path dir;
  std::string index_label;  // the index (or single file), named in errors
  bool single_file = false;
  MoeConfig config;
  std::string prefix;
  std::vector<std::string> shards;                 // file names, sorted
  std::unordered_map<std::string, int> weight_map;  // tensor -> index into shards
  std::vector<int> layers;
  std::map<int, std::set<int>> named_experts;  // per layer, the expert ids the index names

  mutable std::mutex mutex;
  mutable std::map<int, std::unique_ptr<SafetensorsFile>> opened;
  mutable std::map<int, std::string> failed;  // shard -> why it could not be opened

  void read_index(const std::filesystem::path& path);
  void resolve_prefix();

  // Why the experts of `layer` are not to be loaded although the index has them, or "": config.json
  // makes it a dense layer. Layers past num_hidden_layers are DeepSeek-style MTP layers, which may
  // carry experts.
  std::string dense_layer_problem(int layer) const {
    const MoeConfig& c = config;
    if (layer >= c.num_layers || c.is_moe_layer(layer)) return {};
    return index_label + ": layer " + std::to_string(layer) + " has expert tensors, but config.json makes it a " +
           "dense layer (num_hidden_layers " + std::to_string(c.num_layers) + ", first_k_dense_replace " +
           std::to_string(c.first_k_dense_replace) + ", moe_layer_freq " + std::to_string(c.moe_layer_freq) + ")";
  }

  const SafetensorsFile& shard(int index) const {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = opened.find(index); it != opened.end()) return *it->second;
    if (auto it = failed.find(index); it != failed.end()) throw Error(it->second, __FILE__, __LINE__);
    try {
      auto file = std::make_unique<SafetensorsFile>(SafetensorsFile::open(dir / shards[size_t(index)]));
      return *opened.emplace(index, std::move(file)).first->second;
    } catch (const Error& e) {
      failed.emplace(index, e.message());
      throw;
    }
  }

  Located locate(const std::string& name) const {
    const auto it = weight_map.find(name);
    K3MOE_CHECK(it != weight_map.end(), index_label, ": tensor ", name,
                single_file ? " missing" : " missing (not in the weight map)");
    const SafetensorsFile* opened_file = nullptr;
    try {
      opened_file = &shard(it->second);
    } catch (const Error& e) {
      K3MOE_FAIL(e.message(), " (while reading tensor ", name, ")");
    }
    const SafetensorsFile& file = *opened_file;
    const std::string shard_path = (dir / shards[size_t(it->second)]).string();
    const TensorInfo* info = file.find(name);
    K3MOE_CHECK(info != nullptr, shard_path, ": tensor ", name, " not found, though ", index_label,
                " places it in this shard");
    return {&file, info, shard_path};
  }

  Located locate_checked(const std::string& name, std::initializer_list<Dtype> dtypes,
                         const std::vector<int64_t>& shape) const {
    Located t = locate(name);
    const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.info->dtype) != dtypes.end();
    if (!dtype_ok || t.info->shape != shape) {
      std::string allowed;
      for (Dtype d : dtypes) {
        if (!allowed.empty()) allowed += '|';
        allowed += to_string(d);
      }
      K3MOE_FAIL(t.shard_path, ": tensor ", name, " must be ", shape_str(shape), " ", allowed, ", got ",
                 t.info->shape_string(), " ", to_string(t.info->dtype));
    }
    return t;
  }

  std::string router_name(int layer, const char* what) const {
    return prefix + "layers." + std::to_string(layer) + ".mlp.gate." + what;
  }
};

void Checkpoint::Impl::read_index(const std::filesystem::path& path) {
  index_label = path.string();
  std::string why;
  const json index = detail::parse_bounded_json(detail::read_json_file(path), kMaxJsonDepth, why);
  K3MOE_CHECK(!index.is_discarded(), index_label, ": not valid JSON: ", why);
  K3MOE_CHECK(index.is_object(), index_label, ": must hold a JSON object, got ", index.type_name());
  const auto map = index.find("weight_map");
  K3MOE_CHECK(map != index.end(), index_label, ": field 'weight_map' missing");
  K3MOE_CHECK(map->is_object(), index_label, ": field 'weight_map' must be an object, got ", map->type_name());

  std::map<std::string, std::string> first_tensor;  // shard -> a tensor the index puts there
  for (const auto& [name, file] : map->items()) {
    K3MOE_CHECK(file.is_string(), index_label, ": weight_map entry for tensor ", name,
                " must be a shard file name, got ", file.type_name());
    const std::string& shard = file.get_ref<const std::string&>();
    K3MOE_CHECK(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos &&
                    shard.find('\\') == std::string::npos && shard.find('\0') == std::string::npos,
                index_label, ": weight_map puts tensor ", name, " in ", json(shard).dump(), ", which is not a file name");
    first_tensor.emplace(shard, name);
  }
  for (const auto& [shard, tensor] : first_tensor) {
    std::error_code ec;
    K3MOE_CHECK(std::filesystem::is_regular_file(dir / shard, ec), index_label, ": shard ", shard,
                " (where it places tensor ", tensor, ") does not exist in ", dir.string());
    shards.push_back(shard);
  }
  for (const auto& [name, file] : map->items()) {
    const auto pos = std::lower_bound(shards.begin(), shards.end(), file.get_ref<const std::string&>());
    weight_map.emplace(name, int(pos - shards.begin()));
  }
}

void Checkpoint::Impl::resolve_prefix() {
  std::string first_name;
  std::set<int> layer_set;
  for (const auto& [name, shard] : weight_map) {
    const auto parsed = parse_expert_name(name);
    if (!parsed) continue;
    if (first_name.empty()) {
      first_name = name;
      prefix = std::string(parsed->prefix);
    }
    K3MOE_CHECK(parsed->prefix == prefix, index_label, ": expert tensors disagree on the name prefix: ",
                first_name, " has '", prefix, "', ", name, " has '", parsed->prefix, "'");
    layer_set.insert(parsed->layer);
    named_experts[parsed->layer].insert(parsed->expert);
  }
  K3MOE_CHECK(!first_name.empty(), index_label,
              ": no routed-expert tensors (named {prefix}layers.{L}.mlp.experts.{e}.w1.weight_packed and so on)");
  layers.assign(layer_set.begin(), layer_set.end());
}

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  std::error_code ec;
  K3MOE_CHECK(std::filesystem::is_directory(dir, ec), dir.string(), ": not a checkpoint directory");
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->config = MoeConfig::from_file(dir / "config.json");
  if (std::filesystem::exists(dir / kIndexFile, ec)) {
    impl->read_index(dir / kIndexFile);
  } else if (std::filesystem::exists(dir / kSingleFile, ec)) {
    impl->index_label = (dir / kSingleFile).string();
    impl->single_file = true;
    impl->shards = {kSingleFile};
    const SafetensorsFile& file = impl->shard(0);
    for (const TensorInfo& t : file.tensors()) impl->weight_map.emplace(t.name, 0);
  } else {
    K3MOE_FAIL(dir.string(), ": neither ", kIndexFile, " nor ", kSingleFile, " found");
  }
  impl->resolve_prefix();
  return Checkpoint(std::move(impl));
}

const std::filesystem::path& Checkpoint::dir() const { return impl_->dir; }
const MoeConfig& Checkpoint::config() const { return impl_->config; }
const std::string& Checkpoint::prefix() const { return impl_->prefix; }
std::vector<int> Checkpoint::moe_layers() const { return impl_->layers; }
int Checkpoint::num_shards() const { return int(impl_->shards.size()); }

std::string Checkpoint::expert_tensor_name(int layer, int expert, const std::string& which,
                                           const std::string& part) const {
  return impl_->prefix + "layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." +
         which + "." + part;
}

RankExperts Checkpoint::load_experts(int layer, ExpertParallel ep, const ProgressFn& progress) const {
  const MoeConfig& c = impl_->config;
  ep.validate(c.num_experts);
  K3MOE_CHECK(std::binary_search(impl_->layers.begin(), impl_->layers.end(), layer), impl_->index_label,
              ": layer ", layer, " has no expert tensors (layers with experts: ", layer_list(impl_->layers), ")");
  const std::string dense = impl_->dense_layer_problem(layer);
  K3MOE_CHECK(dense.empty(), dense);
  // Every tensor's name, dtype and shape first (header lookups), then the buffers: a checkpoint
  // that does not hold what config.json says fails before gigabytes are allocated.
  const int first = ep.first_expert(c.num_experts);
  for (int expert = first; expert < first + ep.num_local(c.num_experts); ++expert)
    for (const ExpertPart& p : kExpertParts)
      impl_->locate_checked(expert_tensor_name(layer, expert, p.which, p.part), {Dtype::U8}, expected_shape(c, p));
  RankExperts r = RankExperts::allocate(c, layer, ep);
  const int64_t i_rows = c.intermediate, h_rows = c.hidden;
  const int64_t w13_packed = r.w13_row_bytes(), w13_scale = c.hidden / 32;
  const int64_t w2_packed = r.w2_row_bytes(), w2_scale = c.intermediate / 32;

  auto load_one = [&](int local) {
    uint64_t bytes = 0;
    for (const ExpertPart& p : kExpertParts) {
      const std::string name = expert_tensor_name(layer, r.first_expert + local, p.which, p.part);
      const Located t = impl_->locate_checked(name, {Dtype::U8}, expected_shape(c, p));
      const bool packed = std::strcmp(p.part, "weight_packed") == 0;
      uint8_t* dst = nullptr;
      if (std::strcmp(p.which, "w2") == 0) {
        dst = packed ? r.w2_packed.data() + local * h_rows * w2_packed : r.w2_scale.data() + local * h_rows * w2_scale;
      } else {
        // W13 = [W1 (gate); W3 (up)]: contiguous halves of 2I rows, never interleaved.
        const int64_t row = (2 * int64_t(local) + (std::strcmp(p.which, "w3") == 0)) * i_rows;
        dst = packed ? r.w13_packed.data() + row * w13_packed : r.w13_scale.data() + row * w13_scale;
      }
      t.file->copy_to(*t.info, {dst, size_t(t.info->nbytes())});
      bytes += t.info->nbytes();
    }
    return bytes;
  };

  // NOTE: a few experts in flight at once keep several reads queued on the device; one thread
  // waiting on each tensor's read in turn reads at a fraction of the disk's speed.
  std::atomic<uint64_t> bytes{0};
  std::mutex mutex;
  int done = 0;
  parallel_for(r.num_local, kLoadThreads, "checkpoint loader", [&](int64_t local) {
    bytes += load_one(int(local));
    std::lock_guard<std::mutex> lock(mutex);
    report(progress, "load experts", ++done, r.num_local);
  });
  r.bytes_read = bytes;
  return r;
}

Router Checkpoint::load_router(int layer) const {
  const MoeConfig& c = impl_->config;
  const Located w = impl_->locate_checked(impl_->router_name(layer, "weight"), {Dtype::BF16, Dtype::F32},
                                          {c.num_experts, c.model_hidden});
  const Located b = impl_->locate_checked(impl_->router_name(layer, "e_score_correction_bias"),
                                          {Dtype::BF16, Dtype::F32}, {c.num_experts});
  auto widen = [](const Located& t) {
    std::vector<uint8_t> bytes(size_t(t.info->nbytes()));
    t.file->copy_to(*t.info, bytes);
    std::vector<float> out(size_t(t.info->numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (t.info->dtype == Dtype::BF16) {
        out[i] = bf16_bits_to_float(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
      } else {
        uint32_t u = 0;
        for (int k = 3; k >= 0; --k) u = (u << 8) | bytes[4 * i + size_t(k)];
        out[i] = bits_float(u);
      }
    }
    return out;
  };
  Router router;
  router.num_experts = c.num_experts;
  router.model_hidden = c.model_hidden;
  router.weight = widen(w);
  router.bias = widen(b);
  return router;
}

int64_t Checkpoint::rank_bytes(int layer, ExpertParallel ep) const {
  ep.validate(impl_->config.num_experts);
  const int first = ep.first_expert(impl_->config.num_experts);
  int64_t bytes = 0;
  for (int expert = first; expert < first + ep.num_local(impl_->config.num_experts); ++expert)
    for (const ExpertPart& p : kExpertParts)
      bytes += int64_t(impl_->locate(expert_tensor_name(layer, expert, p.which, p.part)).info->nbytes());
  return bytes;
}

std::vector<std::string> Checkpoint::validate(std::optional<int> layer) const {
  const MoeConfig& c = impl_->config;
  std::vector<std::string> problems;
  std::set<std::string> seen;
  size_t omitted = 0;
  auto add = [&](std::string line) {
    if (problems.size() == kMaxProblems) {
      ++omitted;  // counted, not kept
    } else if (seen.insert(line).second) {
      problems.push_back(std::move(line));
    }
  };
  // A shard that cannot be opened is one problem, not one per tensor in it.
  std::set<int> broken_shards;
  auto check = [&](const std::string& name, std::initializer_list<Dtype> dtypes, const std::vector<int64_t>& shape) {
    const auto it = impl_->weight_map.find(name);
    if (it != impl_->weight_map.end() && !broken_shards.count(it->second)) {
      try {
        impl_->shard(it->second);
      } catch (const Error& e) {
        broken_shards.insert(it->second);
        add(e.message());
      }
    }
    if (it != impl_->weight_map.end() && broken_shards.count(it->second)) return;
    try {
      impl_->locate_checked(name, dtypes, shape);
    } catch (const Error& e) {
      add(e.message());
    }
  };

  std::vector<int> layers = impl_->layers;
  if (layer) {
    if (!std::binary_search(layers.begin(), layers.end(), *layer))
      return {impl_->index_label + ": layer " + std::to_string(*layer) + " has no expert tensors (layers with " +
              "experts: " + layer_list(layers) + ")"};
    layers = {*layer};
  }
  for (int l : layers) {
    if (std::string dense = impl_->dense_layer_problem(l); !dense.empty()) add(dense);
    const std::set<int>& experts = impl_->named_experts.at(l);  // every layer listed names an expert
    const int named = *experts.rbegin() + 1;
    if (named > c.num_experts)
      add(impl_->index_label + ": layer " + std::to_string(l) + " names expert " + std::to_string(named - 1) +
          ", but num_experts is " + std::to_string(c.num_experts));
    // Experts past the last one the index names are one problem, not six per expert.
    if (named < c.num_experts)
      add(impl_->index_label + ": layer " + std::to_string(l) + " names experts up to " + std::to_string(named - 1) +
          ", but num_experts is " + std::to_string(c.num_experts) + ": experts " + std::to_string(named) + ".." +
          std::to_string(c.num_experts - 1) + " have no tensors");
    // Experts the index names no tensor of are one line per gap, and only the experts it names are
    // checked name by name: the work is bounded by the index, not by the largest id in it.
    int next = 0;
    for (int expert : experts) {
      if (expert >= c.num_experts) break;
      if (expert > next)
        add(impl_->index_label + ": layer " + std::to_string(l) + " names no tensor of expert" +
            (expert - 1 > next ? "s " + std::to_string(next) + ".." : " ") + std::to_string(expert - 1));
      for (const ExpertPart& p : kExpertParts)
        check(expert_tensor_name(l, expert, p.which, p.part), {Dtype::U8}, expected_shape(c, p));
      next = expert + 1;
    }
    check(impl_->router_name(l, "weight"), {Dtype::BF16, Dtype::F32}, {c.num_experts, c.model_hidden});
    check(impl_->router_name(l, "e_score_correction_bias"), {Dtype::BF16, Dtype::F32}, {c.num_experts});
  }
  if (omitted > 0) problems.push_back("... and " + std::to_string(omitted) + " more problems");
  return problems;
}

}  // namespace k3moe
