// config.json parsing and the MoE config's invariants.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_test_util.h"
#include "k3moe/config.h"
#include "k3moe/error.h"

namespace k3moe {
namespace {

using nlohmann::json;
using testing::expect_error;

// Kimi-K3's text_config as published (abridged), with compressed-tensors nesting.
json k3_text_config() {
  return json::parse(R"({
    "hidden_size": 7168, "routed_expert_hidden_size": 3584, "moe_intermediate_size": 3072,
    "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
    "routed_scaling_factor": 1.0, "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": true, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "num_hidden_layers": 93, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "quantization_config": {
      "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group"}}}}
  })");
}

std::string k3_json() {
  return json{{"architectures", {"KimiK3ForCausalLM"}}, {"text_config", k3_text_config()}}.dump();
}

void expect_k3(const MoeConfig& c) {
  EXPECT_EQ(c.model_hidden, 7168);
  EXPECT_EQ(c.hidden, 3584);
  EXPECT_EQ(c.intermediate, 3072);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.top_k, 16);
  EXPECT_EQ(c.routed_scaling_factor, 1.0f);
  EXPECT_TRUE(c.renormalize);
  EXPECT_EQ(c.activation, Activation::Situ);
  EXPECT_EQ(c.activation_params.situ_beta, 4.0f);
  EXPECT_EQ(c.activation_params.situ_linear_beta, 25.0f);
  EXPECT_EQ(c.num_layers, 93);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.group_size, 32);
  EXPECT_EQ(c.num_bits, 4);
  EXPECT_EQ(c.quant_format, "mxfp4-pack-quantized");
}

TEST(Config, ReadsKimiK3TextConfig) { expect_k3(MoeConfig::from_json(k3_json(), "config.json")); }

TEST(Config, ReadsFieldsAtTopLevel) { expect_k3(MoeConfig::from_json(k3_text_config().dump(), "config.json")); }

TEST(Config, PrefersTextConfigOverTopLevel) {
  json j = k3_text_config();
  j["text_config"] = {{"moe_intermediate_size", 1024}, {"num_experts", 64}};
  j["moe_intermediate_size"] = 3072;
  const MoeConfig c = MoeConfig::from_json(j.dump(), "config.json");
  EXPECT_EQ(c.intermediate, 1024);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.hidden, 3584);  // only at the top level: still read
}

TEST(Config, QuantizationConfigAtTopLevelBesideTextConfig) {
  json text = k3_text_config();
  json root = {{"quantization_config", text["quantization_config"]}};
  text.erase("quantization_config");
  root["text_config"] = text;
  expect_k3(MoeConfig::from_json(root.dump(), "config.json"));
}

TEST(Config, AcceptsCommonAliases) {
  json j = k3_text_config();
  j.erase("num_experts");
  j.erase("num_experts_per_token");
  j.erase("moe_renormalize");
  j.erase("routed_expert_hidden_size");
  j["n_routed_experts"] = 256;
  j["num_experts_per_tok"] = 8;
  j["norm_topk_prob"] = false;
  j["hidden_act"] = "silu";
  j["hidden_size"] = 2048;
  const MoeConfig c = MoeConfig::from_json(j.dump(), "config.json");
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_FALSE(c.renormalize);
  EXPECT_EQ(c.hidden, 2048);  // routed_expert_hidden_size absent: hidden_size
  EXPECT_EQ(c.model_hidden, 2048);
  EXPECT_EQ(c.activation, Activation::Swiglu);
}

// Two names of one setting in the same scope must agree: which one a reader takes is not the
// config author's intent. Equal values, and a top-level value under a text_config one, are fine.
TEST(Config, AliasesThatDisagreeAreNamed) {
  json j = k3_text_config();
  j["n_routed_experts"] = 64;
  expect_error([&] { MoeConfig::from_json(json{{"text_config", j}}.dump(), "ckpt/config.json"); },
               {"ckpt/config.json", "text_config.num_experts = 896", "text_config.n_routed_experts = 64", "disagree"});
  j["n_routed_experts"] = 896;
  j["num_experts_per_tok"] = 8;
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); },
               {"num_experts_per_token = 16", "num_experts_per_tok = 8", "disagree"});
  j["num_experts_per_tok"] = 16;
  json outer = {{"text_config", j}, {"num_experts", 32}};  // another model's setting beside text_config
  EXPECT_EQ(MoeConfig::from_json(outer.dump(), "config.json").num_experts, 896);
}

TEST(Config, HiddenActNames) {
  for (const auto& [text, act] : std::vector<std::pair<std::string, Activation>>{
           {"situ", Activation::Situ}, {"silu", Activation::Swiglu}, {"swiglu", Activation::Swiglu},
           {"swiglu_oai", Activation::SwigluOai}}) {
    json j = k3_text_config();
    j["hidden_act"] = text;
    EXPECT_EQ(MoeConfig::from_json(j.dump(), "config.json").activation, act) << text;
  }
  json j = k3_text_config();
  j["hidden_act"] = "gelu";
  expect_error([&] { MoeConfig::from_json(j.dump(), "cfg/config.json"); }, {"cfg/config.json", "hidden_act", "gelu"});
}

TEST(Config, QuantizationAtTheTopOfQuantizationConfig) {
  json j = k3_text_config();
  j["quantization_config"] = {{"format", "mxfp4-pack-quantized"}, {"num_bits", 4}, {"group_size", 32}};
  EXPECT_EQ(MoeConfig::from_json(j.dump(), "config.json").group_size, 32);
}

TEST(Config, MissingFieldsAreNamed) {
  for (const char* field : {"hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_token",
                            "num_hidden_layers", "hidden_act", "quantization_config"}) {
    json j = k3_text_config();
    j.erase(field);
    expect_error([&] { MoeConfig::from_json(json{{"text_config", j}}.dump(), "ckpt/config.json"); },
                 {"ckpt/config.json", field}, field);
  }
  json j = k3_text_config();
  j["quantization_config"]["config_groups"]["group_0"]["weights"].erase("group_size");
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"config.json", "group_size", "missing"});
  j = k3_text_config();
  j["quantization_config"].erase("format");
  j["quantization_config"]["config_groups"]["group_0"].erase("format");
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"quantization_config.format", "missing"});
}

TEST(Config, WrongTypesAreNamed) {
  const std::vector<std::pair<const char*, json>> cases{{"moe_intermediate_size", "3072"},
                                                        {"num_experts", 896.5},
                                                        {"num_experts_per_token", true},
                                                        {"moe_renormalize", 1},
                                                        {"hidden_act", 3},
                                                        {"routed_scaling_factor", "1.0"},
                                                        {"num_hidden_layers", 1e12},
                                                        {"hidden_size", 99999999999LL},
                                                        {"quantization_config", "mxfp4"}};
  for (const auto& [field, value] : cases) {
    json j = k3_text_config();
    j[field] = value;
    expect_error([&] { MoeConfig::from_json(json{{"text_config", j}}.dump(), "config.json"); },
                 {"config.json", std::string("text_config.") + field}, field);
  }
}

TEST(Config, InconsistentFieldsAreNamed) {
  struct Case {
    const char* field;
    json value;
    const char* needle;
  };
  const std::vector<Case> cases{
      {"num_experts_per_token", 897, "num_experts_per_token"},
      {"num_experts_per_token", 0, "num_experts_per_token"},
      {"num_experts", 0, "num_experts"},
      {"routed_expert_hidden_size", 3552, "multiple of 64"},  // 32 * 111: a whole number of groups
      {"moe_intermediate_size", 3056, "multiple of the group size"},
      {"moe_intermediate_size", -3072, "moe_intermediate_size"},
      {"hidden_size", 0, "hidden_size"},
      {"first_k_dense_replace", 93, "first_k_dense_replace"},
      {"moe_layer_freq", 0, "moe_layer_freq"},
      {"routed_scaling_factor", 0.0, "routed_scaling_factor"},
      {"activation_situ_beta", -4.0, "activation_situ_beta"},
      // I 2^31 - 64 would make 2 I wrap in int (and 896 such experts ~2.2e19 bytes, past int64).
      {"moe_intermediate_size", 2147483584, "moe_intermediate_size (I) must be <= 2^20 = 1048576, got 2147483584"},
      {"moe_intermediate_size", (1 << 20) + 64, "must be <= 2^20"},
      {"routed_expert_hidden_size", (1 << 20) + 64, "routed_expert_hidden_size (H) must be <= 2^20"},
      {"hidden_size", 2147483647, "hidden_size (the router's input width) must be <= 2^20 = 1048576, got 2147483647"},
      // 2^30 experts of K3's size: ~1.9e16 bytes (no buffer size may wrap).
      {"num_experts", 1 << 30, "must fit in 2^53 bytes"},
  };
  for (const Case& c : cases) {
    json j = k3_text_config();
    j[c.field] = c.value;
    expect_error([&] { MoeConfig::from_json(j.dump(), "k3/config.json"); }, {"k3/config.json", c.needle},
                 std::string(c.field) + " = " + c.value.dump());
  }
  json j = k3_text_config();
  j["routed_expert_hidden_size"] = 1 << 20;  // 896 experts of H = I = 2^20: ~1.6e15 bytes, in bounds
  j["moe_intermediate_size"] = 1 << 20;
  EXPECT_EQ(MoeConfig::from_json(j.dump(), "config.json").intermediate, 1 << 20);
  j = k3_text_config();
  j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"group_size", "32", "16"});
  j = k3_text_config();
  j["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"num_bits", "8"});
  j = k3_text_config();
  j["quantization_config"]["format"] = "pack-quantized";
  j["quantization_config"]["config_groups"]["group_0"]["format"] = "pack-quantized";
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"format", "pack-quantized"});
  j = k3_text_config();
  j["quantization_config"]["format"] = "nvfp4-pack-quantized";  // disagrees with group_0's format
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); },
               {"config_groups.group_0.format", "nvfp4-pack-quantized"});
  j = k3_text_config();
  j["quantization_config"]["group_size"] = 16;  // disagrees with group_0's weights
  expect_error([&] { MoeConfig::from_json(j.dump(), "config.json"); }, {"group_size", "16", "32"});
}

TEST(Config, NotJsonOrNotAnObject) {
  expect_error([] { MoeConfig::from_json("{\"hidden_size\": ", "a/config.json"); }, {"a/config.json", "JSON"});
  expect_error([] { MoeConfig::from_json("[1, 2]", "a/config.json"); }, {"a/config.json", "object"});
  expect_error([] { MoeConfig::from_json("{\"text_config\": 3}", "a/config.json"); }, {"a/config.json", "text_config"});
  const std::string twice = R"({"text_config": {"num_experts": 896, "num_experts": 8}})";
  expect_error([&] { MoeConfig::from_json(twice, "a/config.json"); }, {"a/config.json", "'num_experts' appears twice"});
  expect_error([] { MoeConfig::from_file("/nonexistent/k3moe/config.json"); }, {"/nonexistent/k3moe/config.json"});
  // A FIFO must be refused at once, not block the read until a writer comes.
  const testing::TempDir dir("config-fifo");
  const auto fifo = dir.path() / "config.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { MoeConfig::from_file(fifo); }, {"config.json", "not a regular file"});
  // A file of gigabytes is refused by its size, before its text is read (a sparse file here).
  const auto huge = dir.path() / "huge-config.json";
  std::ofstream(huge) << k3_text_config().dump();
  std::filesystem::resize_file(huge, uintmax_t(6) << 30);
  expect_error([&] { MoeConfig::from_file(huge); }, {"huge-config.json", "6442450944 bytes", "268435456"});
  expect_error([] { MoeConfig::from_json("\xEF\xBB\xBF" + k3_text_config().dump(), "bom/config.json"); },
               {"bom/config.json", "byte order mark"});
}

TEST(Config, DeepNestingIsAnErrorNotACrash) {
  json j = k3_text_config();
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  std::string text = j.dump();
  text.insert(1, "\"hidden_size\":" + deep + ",");
  expect_error([&] { MoeConfig::from_json(text, "deep/config.json"); }, {"deep/config.json", "nested deeper than"});
}

TEST(Config, ReadsEveryActivationParameter) {
  json j = k3_text_config();
  j["activation_situ_beta"] = 3.0;
  j["activation_situ_linear_beta"] = 20.0;
  j["swiglu_alpha"] = 1.5;
  j["swiglu_limit"] = 6.0;
  const ActivationParams p = MoeConfig::from_json(j.dump(), "config.json").activation_params;
  EXPECT_EQ(p.situ_beta, 3.0f);
  EXPECT_EQ(p.situ_linear_beta, 20.0f);
  EXPECT_EQ(p.swiglu_alpha, 1.5f);
  EXPECT_EQ(p.swiglu_limit, 6.0f);
}

TEST(Config, ToJsonReadsBack) {
  MoeConfig a = MoeConfig::kimi_k3();
  a.activation_params.situ_beta = 3.0f;
  a.activation_params.situ_linear_beta = 20.0f;
  MoeConfig b = testing::small_config();
  b.activation = Activation::SwigluOai;
  b.activation_params.swiglu_alpha = 1.5f;
  b.activation_params.swiglu_limit = 9.0f;
  b.renormalize = false;
  b.routed_scaling_factor = 2.5f;
  b.num_layers = 7;
  b.first_k_dense_replace = 3;
  b.moe_layer_freq = 2;
  MoeConfig c = testing::small_config();
  c.activation = Activation::Swiglu;
  for (const MoeConfig& in : {a, b, c}) {
    const MoeConfig out = MoeConfig::from_json(in.to_json(), "roundtrip");
    EXPECT_EQ(out.model_hidden, in.model_hidden);
    EXPECT_EQ(out.hidden, in.hidden);
    EXPECT_EQ(out.intermediate, in.intermediate);
    EXPECT_EQ(out.num_experts, in.num_experts);
    EXPECT_EQ(out.top_k, in.top_k);
    EXPECT_EQ(out.routed_scaling_factor, in.routed_scaling_factor);
    EXPECT_EQ(out.renormalize, in.renormalize);
    EXPECT_EQ(out.activation, in.activation);
    EXPECT_EQ(out.activation_params.situ_beta, in.activation_params.situ_beta);
    EXPECT_EQ(out.activation_params.situ_linear_beta, in.activation_params.situ_linear_beta);
    if (in.activation == Activation::SwigluOai) {
      EXPECT_EQ(out.activation_params.swiglu_alpha, in.activation_params.swiglu_alpha);
      EXPECT_EQ(out.activation_params.swiglu_limit, in.activation_params.swiglu_limit);
    }
    EXPECT_EQ(out.num_layers, in.num_layers);
    EXPECT_EQ(out.first_k_dense_replace, in.first_k_dense_replace);
    EXPECT_EQ(out.moe_layer_freq, in.moe_layer_freq);
    EXPECT_EQ(out.group_size, in.group_size);
    EXPECT_EQ(out.num_bits, in.num_bits);
    EXPECT_EQ(out.quant_format, in.quant_format);
  }
}

TEST(Config, KimiK3Bytes) {
  const MoeConfig c = MoeConfig::kimi_k3();
  c.validate();
  // The contract's table: w1/w3 packed 5,505,024 + scale 344,064 each; w2 the same.
  EXPECT_EQ(c.w13_bytes(), 2 * (5'505'024 + 344'064));
  EXPECT_EQ(c.w2_bytes(), 5'505'024 + 344'064);
  EXPECT_EQ(c.expert_bytes(), 17'547'264);
  EXPECT_EQ(28 * c.expert_bytes(), 491'323'392);  // EP32: ~0.49 GB
}

TEST(Config, MoeLayers) {
  MoeConfig c = MoeConfig::kimi_k3();
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(92));
  EXPECT_FALSE(c.is_moe_layer(93));
  EXPECT_FALSE(c.is_moe_layer(-1));
  EXPECT_EQ(c.first_moe_layer(), 1);
  c.first_k_dense_replace = 3;
  c.moe_layer_freq = 2;
  EXPECT_EQ(c.first_moe_layer(), 4);
  EXPECT_FALSE(c.is_moe_layer(5));
  EXPECT_TRUE(c.is_moe_layer(6));
}

TEST(Config, FirstMoeLayerOfHugeLayerCounts) {
  // config.json bounds none of these below 2^31: the first MoE layer is computed, not searched for
  // (a search took seconds per validate() here).
  constexpr int kMax = std::numeric_limits<int>::max();
  MoeConfig c = testing::small_config();
  c.num_layers = kMax;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1 << 30;
  const auto start = std::chrono::steady_clock::now();
  c.validate();
  EXPECT_EQ(c.first_moe_layer(), 1 << 30);
  c.moe_layer_freq = kMax;  // its multiples: layer 0 (dense) and 2^31 - 1 (not below num_layers)
  EXPECT_EQ(c.first_moe_layer(), -1);
  expect_error([&] { c.validate(); }, {"no MoE layer", "moe_layer_freq = 2147483647"});
  c.first_k_dense_replace = 0;
  EXPECT_EQ(c.first_moe_layer(), 0);
  c.first_k_dense_replace = kMax - 1;
  c.moe_layer_freq = 1;
  EXPECT_EQ(c.first_moe_layer(), kMax - 1);
  c.moe_layer_freq = 2;  // kMax - 1 is even
  EXPECT_EQ(c.first_moe_layer(), kMax - 1);
  c.first_k_dense_replace = 3;
  c.moe_layer_freq = kMax - 1;
  EXPECT_EQ(c.first_moe_layer(), kMax - 1);
  c.num_layers = kMax - 1;
  EXPECT_EQ(c.first_moe_layer(), -1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(Config, ExpertParallel) {
  const ExpertParallel ep{32, 7};
  ep.validate(896);
  EXPECT_EQ(ep.num_local(896), 28);
  EXPECT_EQ(ep.first_expert(896), 196);
  EXPECT_EQ((ExpertParallel{16, 15}.first_expert(896)), 840);
  expect_error([] { ExpertParallel{3, 0}.validate(896); }, {"EP size 3", "896"});
  expect_error([] { ExpertParallel{32, 32}.validate(896); }, {"rank", "32"});
  expect_error([] { ExpertParallel{32, -1}.validate(896); }, {"rank", "-1"});
  expect_error([] { ExpertParallel{0, 0}.validate(896); }, {"EP size", "0"});
}

TEST(Config, ModeAndActivationNames) {
  for (Mode m : {Mode::A16, Mode::Mxfp8}) EXPECT_EQ(parse_mode(to_string(m)), m);
  for (Activation a : {Activation::Situ, Activation::Swiglu, Activation::SwigluOai})
    EXPECT_EQ(parse_activation(to_string(a)), a);
  expect_error([] { parse_mode("fp16"); }, {"fp16", "a16", "mxfp8"});
  expect_error([] { parse_activation("gelu"); }, {"gelu", "situ"});
}

}  // namespace
}  // namespace k3moe
