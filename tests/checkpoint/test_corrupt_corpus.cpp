// The corrupted-checkpoint corpus: a valid small checkpoint, damaged one way per case. Loading
// each must end in a k3moe::Error that names the file and the tensor or field, never a crash.
// Set K3MOE_KEEP_CORPUS=DIR to keep the generated cases in DIR.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "k3moe/checkpoint.h"
#include "k3moe/error.h"
#include "k3moe/synthetic.h"

namespace k3moe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::edit_header;
using testing::edit_header_text;
using testing::edit_json_file;

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";  // experts 0..3
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";  // experts 4..7 and the router
constexpr const char* kIndex = "model.safetensors.index.json";
const std::string kTensor = "model.layers.1.mlp.experts.1.w1.weight_packed";  // in shard 1, [192, 64] U8
const std::string kOther = "model.layers.1.mlp.experts.1.w3.weight_packed";   // same shape
const std::string kGate = "model.layers.1.mlp.gate.weight";
const std::string kBias = "model.layers.1.mlp.gate.e_score_correction_bias";
// A shard that cannot be opened is reported with the tensor the loader wanted from it.
const std::string kFirstRead = "while reading tensor model.layers.1.mlp.experts.0.w1.weight_packed";

SyntheticSpec corpus_spec() {
  SyntheticSpec spec;
  spec.config = testing::small_config();
  spec.seed = 11;
  spec.layers = {1};
  spec.num_shards = 2;
  spec.threads = 2;
  return spec;
}

// Everything a user would do with the checkpoint.
void load_everything(const fs::path& dir) {
  const Checkpoint ckpt = Checkpoint::open(dir);
  for (int layer : ckpt.moe_layers()) {
    ckpt.load_experts(layer, {1, 0});
    ckpt.load_router(layer);
  }
}

void truncate_to(const fs::path& path, uintmax_t size) { fs::resize_file(path, size); }

void set_length_field(const fs::path& path, uint64_t value) {
  auto bytes = testing::read_bytes(path);
  testing::put_le64(bytes.data(), value);
  testing::write_bytes(path, bytes);
}

struct Case {
  std::string name;
  std::function<void(const fs::path&)> damage;
  std::vector<std::string> needles;  // besides nothing else: each names the file and tensor/field
  // What validate() says, where its words differ from the load error's (default: the needles but
  // kFirstRead, the load's context).
  std::vector<std::string> validate_needles = {};
};

std::vector<Case> corpus() {
  auto shard1 = [](const fs::path& d) { return d / kShard1; };
  auto set_entry = [](const std::string& tensor, const char* key, json value) {
    return [=](const fs::path& d) { edit_header(d / kShard1, [&](json& h) { h[tensor][key] = value; }); };
  };
  return {
      {"truncated_shard", [&](const fs::path& d) { truncate_to(shard1(d), fs::file_size(shard1(d)) / 2); },
       {kShard1, "tensor 'model.layers.1.mlp.experts.", "past the data section"}},
      {"truncated_inside_header", [&](const fs::path& d) { truncate_to(shard1(d), 100); },
       {kShard1, "header length", "past the end", kFirstRead}},
      {"truncated_to_5_bytes", [&](const fs::path& d) { truncate_to(shard1(d), 5); },
       {kShard1, "5 bytes", kFirstRead}},
      {"empty_shard", [&](const fs::path& d) { truncate_to(shard1(d), 0); }, {kShard1, "0 bytes", kFirstRead}},
      {"header_length_past_end", [&](const fs::path& d) { set_length_field(shard1(d), fs::file_size(shard1(d))); },
       {kShard1, "header length", "past the end", kFirstRead}},
      {"header_length_zero", [&](const fs::path& d) { set_length_field(shard1(d), 0); },
       {kShard1, "header length is 0", kFirstRead}},
      {"header_length_2^63", [&](const fs::path& d) { set_length_field(shard1(d), uint64_t(1) << 63); },
       {kShard1, "header length", "limit", kFirstRead}},
      {"invalid_json",
       [&](const fs::path& d) { edit_header_text(shard1(d), [](std::string& h) { h[h.size() / 2] = '#'; }); },
       {kShard1, "not valid JSON", kFirstRead}},
      {"non_object_json",
       [&](const fs::path& d) { edit_header_text(shard1(d), [](std::string& h) { h = "[" + h + "]"; }); },
       {kShard1, "JSON object", kFirstRead}},
      {"unknown_dtype", set_entry(kTensor, "dtype", "U4"), {kShard1, kTensor, "unknown dtype \"U4\""}},
      {"negative_shape", set_entry(kTensor, "shape", {-192, -64}), {kShard1, kTensor, "negative"}},
      {"size_not_numel_times_dtype", set_entry(kTensor, "shape", {192, 65}), {kShard1, kTensor, "12480 bytes"}},
      {"numel_overflow", set_entry(kTensor, "shape", {int64_t(1) << 40, int64_t(1) << 40}),
       {kShard1, kTensor, "overflow"}},
      {"offsets_out_of_range", set_entry(kTensor, "data_offsets", {0, uint64_t(1) << 40}),
       {kShard1, kTensor, "past the data section"}},
      {"offsets_begin_after_end",
       [](const fs::path& d) {
         edit_header(d / kShard1, [](json& h) {
           const uint64_t b = h[kTensor]["data_offsets"][0], e = h[kTensor]["data_offsets"][1];
           h[kTensor]["data_offsets"] = {e, b};
         });
       },
       {kShard1, kTensor, "begin > end"}},
      {"overlapping_tensors",
       [](const fs::path& d) {
         edit_header(d / kShard1, [](json& h) { h[kOther]["data_offsets"] = h[kTensor]["data_offsets"]; });
       },
       {kShard1, kTensor, kOther, "overlap"}},
      {"duplicate_tensor_name",
       [&](const fs::path& d) {
         edit_header_text(shard1(d), [](std::string& h) {
           const std::string entry = "\"" + kTensor + "\":";
           const size_t at = h.find(entry);
           const size_t end = h.find('}', at) + 1;
           h.insert(1, h.substr(at, end - at) + ",");
         });
       },
       {kShard1, kTensor, "twice"}},
      {"metadata_not_strings",
       [](const fs::path& d) { edit_header(d / kShard1, [](json& h) { h["__metadata__"]["format"] = 1; }); },
       {kShard1, "__metadata__", "format", kFirstRead}},
      {"missing_tensor_in_shard",
       [](const fs::path& d) {  // its bytes kept under another name: the shard itself stays valid
         edit_header(d / kShard1, [](json& h) {
           h["model.layers.1.self_attn.o_proj.weight"] = h[kTensor];
           h.erase(kTensor);
         });
       },
       {kShard1, kTensor, "not found", kIndex}},
      {"missing_tensor_in_index",
       [](const fs::path& d) { edit_json_file(d / kIndex, [](json& j) { j["weight_map"].erase(kTensor); }); },
       {kIndex, kTensor, "missing"}},
      {"wrong_dtype", set_entry(kTensor, "dtype", "I8"), {kShard1, kTensor, "[192, 64] U8", "got [192, 64] I8"}},
      {"wrong_shape", set_entry(kTensor, "shape", {64, 192}), {kShard1, kTensor, "[192, 64] U8", "got [64, 192] U8"}},
      {"wrong_scale_shape",
       set_entry("model.layers.1.mlp.experts.2.w2.weight_scale", "shape", {6, 128}),
       {kShard1, "model.layers.1.mlp.experts.2.w2.weight_scale", "[128, 6] U8", "got [6, 128]"}},
      {"router_wrong_shape",
       [](const fs::path& d) { edit_header(d / kShard2, [](json& h) { h[kGate]["shape"] = {64, 8}; }); },
       {kShard2, kGate, "[8, 64] BF16|F32", "got [64, 8] BF16"}},
      {"router_bias_missing",
       [](const fs::path& d) { edit_json_file(d / kIndex, [](json& j) { j["weight_map"].erase(kBias); }); },
       {kIndex, kBias, "missing"}},
      {"index_names_missing_shard",
       [](const fs::path& d) {
         edit_json_file(d / kIndex, [](json& j) { j["weight_map"][kTensor] = "model-00003-of-00003.safetensors"; });
       },
       {kIndex, "model-00003-of-00003.safetensors", kTensor, "does not exist"}},
      {"index_shard_outside_dir",
       [](const fs::path& d) {
         edit_json_file(d / kIndex, [](json& j) { j["weight_map"][kTensor] = "../x.safetensors"; });
       },
       {kIndex, kTensor, "../x.safetensors", "not a file name"}},
      {"index_shard_name_with_a_nul",  // a C path would end at the NUL: another file than the index names
       [](const fs::path& d) {
         edit_json_file(d / kIndex, [](json& j) {
           j["weight_map"][kTensor] = std::string("model-00001-of-00002.safetensors\0x", 34);
         });
       },
       {kIndex, kTensor, "\\u0000x", "not a file name"}},
      {"index_invalid_json", [](const fs::path& d) { testing::write_text(d / kIndex, "{\"weight_map\": {"); },
       {kIndex, "not valid JSON"}},
      {"index_nested_a_million_deep",
       [](const fs::path& d) {
         testing::write_text(d / kIndex, "{\"weight_map\": " + std::string(1'000'000, '[') +
                                             std::string(1'000'000, ']') + "}");
       },
       {kIndex, "nested deeper than"}},
      {"index_without_weight_map", [](const fs::path& d) { testing::write_text(d / kIndex, "{\"metadata\": {}}"); },
       {kIndex, "weight_map"}},
      {"index_entry_not_a_string",
       [](const fs::path& d) { edit_json_file(d / kIndex, [](json& j) { j["weight_map"][kTensor] = 1; }); },
       {kIndex, kTensor, "shard file name"}},
      {"index_mixed_prefixes",
       [](const fs::path& d) {
         edit_json_file(d / kIndex, [](json& j) {
           j["weight_map"]["language_model.model.layers.1.mlp.experts.0.w1.weight_packed"] = kShard1;
         });
       },
       {kIndex, "prefix", "language_model.model.layers.1.mlp.experts.0.w1.weight_packed", "'model.'"}},
      {"index_without_experts",
       [](const fs::path& d) {
         edit_json_file(d / kIndex, [](json& j) { j["weight_map"] = {{kGate, kShard2}, {kBias, kShard2}}; });
       },
       {kIndex, "no routed-expert tensors"}},
      {"no_index_no_single_file", [](const fs::path& d) { fs::remove(d / kIndex); },
       {kIndex, "model.safetensors", "found"}},
      {"config_missing", [](const fs::path& d) { fs::remove(d / "config.json"); }, {"config.json", "cannot open"}},
      {"config_invalid_json", [](const fs::path& d) { testing::write_text(d / "config.json", "{\"text_config\": {"); },
       {"config.json", "not valid JSON"}},
      {"config_field_missing",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) { j["text_config"].erase("moe_intermediate_size"); });
       },
       {"config.json", "moe_intermediate_size", "missing"}},
      {"config_field_wrong_type",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) { j["text_config"]["num_experts"] = "8"; });
       },
       {"config.json", "text_config.num_experts", "integer"}},
      {"config_top_k_above_experts",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) { j["text_config"]["num_experts_per_token"] = 9; });
       },
       {"config.json", "num_experts_per_token", "9"}},
      {"config_not_mxfp4",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) {
           j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
         });
       },
       {"config.json", "group_size", "16"}},
      {"config_disagrees_with_tensors",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) { j["text_config"]["moe_intermediate_size"] = 256; });
       },
       {kShard1, "model.layers.1.mlp.experts.0.w1.weight_packed", "[256, 64] U8", "got [192, 64] U8"}},
      {"config_more_experts_than_files",
       [](const fs::path& d) {
         edit_json_file(d / "config.json", [](json& j) { j["text_config"]["num_experts"] = 16; });
       },
       {kIndex, "model.layers.1.mlp.experts.8.w1.weight_packed", "missing"},
       {kIndex, "num_experts is 16: experts 8..15 have no tensors"}},
  };
}

// Loads every case through load_everything(). validate() must report the same damage as a
// problem line when the checkpoint still opens.
TEST(CorruptCheckpoint, EveryCaseIsAClearError) {
  const SyntheticSpec spec = corpus_spec();
  testing::TempDir scratch("corpus");
  const char* keep = std::getenv("K3MOE_KEEP_CORPUS");
  const fs::path root = keep ? fs::path(keep) : scratch.path();
  const fs::path base = scratch.path() / "_valid";
  write_synthetic_checkpoint(base, spec);
  ASSERT_NO_THROW(load_everything(base));

  const std::vector<Case> cases = corpus();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path dir = root / c.name;
    fs::remove_all(dir);
    fs::copy(base, dir, fs::copy_options::recursive);
    c.damage(dir);
    testing::expect_error([&] { load_everything(dir); }, c.needles, c.name);

    std::optional<Checkpoint> ckpt;
    try {
      ckpt.emplace(Checkpoint::open(dir));
    } catch (const Error&) {
      continue;  // the config or index is what is broken: open() already said so
    }
    const std::vector<std::string> problems = ckpt->validate();
    ASSERT_FALSE(problems.empty()) << c.name << ": validate() found nothing";
    // One problem line says what the load error says: every needle, not just the file's name.
    std::vector<std::string> needles = c.validate_needles;
    if (needles.empty())
      for (const std::string& needle : c.needles)
        if (needle != kFirstRead) needles.push_back(needle);
    bool named = false;
    for (const std::string& p : problems) {
      bool all = true;
      for (const std::string& needle : needles) all &= p.find(needle) != std::string::npos;
      named |= all;
    }
    EXPECT_TRUE(named) << c.name << ": no problem line holds every needle; first: " << problems[0];
  }
  EXPECT_GE(cases.size(), 40u);
}

}  // namespace
}  // namespace k3moe
