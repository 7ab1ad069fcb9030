// The K3 expert loader and the synthetic generator on reduced configs: EP slices, prefixes, the
// W13 layout, byte accounting, routers, single-file checkpoints, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/fast_mxfp4.h"
#include "k3moe/checkpoint.h"
#include "k3moe/error.h"
#include "k3moe/quantize.h"
#include "k3moe/safetensors.h"
#include "k3moe/synthetic.h"

namespace k3moe {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

SyntheticSpec reduced_spec() {
  SyntheticSpec spec;
  spec.config = MoeConfig::kimi_k3();
  spec.config.hidden = 256;
  spec.config.intermediate = 128;
  spec.config.num_experts = 32;
  spec.config.top_k = 4;
  spec.config.model_hidden = 512;
  spec.seed = 1234;
  spec.layers = {1, 2};
  spec.num_shards = 3;
  spec.threads = 2;
  return spec;
}

void expect_same_experts(const RankExperts& a, const RankExperts& b, const std::string& what) {
  EXPECT_EQ(a.num_local, b.num_local) << what;
  EXPECT_EQ(a.first_expert, b.first_expert) << what;
  EXPECT_EQ(a.layer, b.layer) << what;
  EXPECT_TRUE(a.w13_packed == b.w13_packed) << what << ": w13_packed differs";
  EXPECT_TRUE(a.w13_scale == b.w13_scale) << what << ": w13_scale differs";
  EXPECT_TRUE(a.w2_packed == b.w2_packed) << what << ": w2_packed differs";
  EXPECT_TRUE(a.w2_scale == b.w2_scale) << what << ": w2_scale differs";
}

class Loader : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("loader");
    write_synthetic_checkpoint(dir_->path(), reduced_spec());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static const fs::path& dir() { return dir_->path(); }
  static TempDir* dir_;
};
TempDir* Loader::dir_ = nullptr;

TEST_F(Loader, OpensAndDescribes) {
  const Checkpoint ckpt = Checkpoint::open(dir());
  EXPECT_EQ(ckpt.prefix(), "model.");
  EXPECT_EQ(ckpt.moe_layers(), (std::vector<int>{1, 2}));
  EXPECT_EQ(ckpt.num_shards(), 3);
  EXPECT_EQ(ckpt.config().num_experts, 32);
  EXPECT_EQ(ckpt.config().hidden, 256);
  EXPECT_EQ(ckpt.expert_tensor_name(2, 17, "w3", "weight_scale"), "model.layers.2.mlp.experts.17.w3.weight_scale");
  EXPECT_TRUE(ckpt.validate().empty());
  EXPECT_TRUE(ckpt.validate(2).empty());
  const auto problems = ckpt.validate(5);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("layer 5 has no expert tensors"), std::string::npos) << problems[0];
}

TEST_F(Loader, EpSlicesAreExactlyTheRanksExperts) {
  const SyntheticSpec spec = reduced_spec();
  const Checkpoint ckpt = Checkpoint::open(dir());
  for (int layer : {1, 2}) {
    for (int P : {1, 2, 4}) {
      for (int r = 0; r < P; ++r) {
        const std::string what =
            "layer " + std::to_string(layer) + " EP" + std::to_string(P) + " rank " + std::to_string(r);
        const RankExperts loaded = ckpt.load_experts(layer, {P, r});
        loaded.validate();
        EXPECT_EQ(loaded.num_local, 32 / P) << what;
        EXPECT_EQ(loaded.first_expert, r * 32 / P) << what;
        expect_same_experts(loaded, synthesize_experts(spec, layer, {P, r}), what);
        EXPECT_EQ(loaded.bytes_read, uint64_t(ckpt.rank_bytes(layer, {P, r}))) << what;
        EXPECT_EQ(loaded.bytes_read, uint64_t(loaded.num_local * spec.config.expert_bytes())) << what;
      }
    }
  }
}

TEST_F(Loader, LayersAndExpertsDiffer) {
  const SyntheticSpec spec = reduced_spec();
  const RankExperts l1 = synthesize_experts(spec, 1, {32, 0});
  const RankExperts l2 = synthesize_experts(spec, 2, {32, 0});
  const RankExperts e1 = synthesize_experts(spec, 1, {32, 1});
  EXPECT_NE(l1.w13_packed, l2.w13_packed);
  EXPECT_NE(l1.w13_packed, e1.w13_packed);
  SyntheticSpec other = spec;
  other.seed = spec.seed + 1;
  EXPECT_NE(l1.w2_packed, synthesize_experts(other, 1, {32, 0}).w2_packed);
}

// W13 = [W1 (gate); W3 (up)] as contiguous halves: compare with the w1/w3 tensors in the files.
TEST_F(Loader, W13IsGateThenUpNeverInterleaved) {
  const Checkpoint ckpt = Checkpoint::open(dir());
  const MoeConfig& c = ckpt.config();
  const RankExperts r = ckpt.load_experts(1, {4, 2});  // experts 16..23: shards 2 and 3
  std::map<std::string, SafetensorsFile> shards;
  for (const auto& entry : fs::directory_iterator(dir()))
    if (entry.path().extension() == ".safetensors")
      shards.emplace(entry.path().filename().string(), SafetensorsFile::open(entry.path()));
  auto tensor = [&](int expert, const char* which, const char* part) {
    const std::string name = ckpt.expert_tensor_name(1, expert, which, part);
    for (const auto& [file, st] : shards)
      if (const TensorInfo* t = st.find(name)) {
        std::vector<uint8_t> b(t->nbytes());
        st.copy_to(*t, b);
        return b;
      }
    ADD_FAILURE() << name << " in no shard";
    return std::vector<uint8_t>{};
  };
  const size_t I = size_t(c.intermediate), packed_row = size_t(c.hidden / 2), scale_row = size_t(c.hidden / 32);
  for (int local = 0; local < r.num_local; ++local) {
    const int e = r.first_expert + local;
    const uint8_t* p = r.w13_packed.data() + size_t(local) * 2 * I * packed_row;
    const uint8_t* s = r.w13_scale.data() + size_t(local) * 2 * I * scale_row;
    const auto w1 = tensor(e, "w1", "weight_packed"), w3 = tensor(e, "w3", "weight_packed");
    const auto w1s = tensor(e, "w1", "weight_scale"), w3s = tensor(e, "w3", "weight_scale");
    ASSERT_EQ(w1.size(), I * packed_row);
    EXPECT_TRUE(std::equal(w1.begin(), w1.end(), p)) << "expert " << e << ": rows 0..I-1 are not w1 (gate)";
    EXPECT_TRUE(std::equal(w3.begin(), w3.end(), p + I * packed_row)) << "expert " << e << ": rows I..2I-1 are not w3";
    EXPECT_TRUE(std::equal(w1s.begin(), w1s.end(), s)) << "expert " << e;
    EXPECT_TRUE(std::equal(w3s.begin(), w3s.end(), s + I * scale_row)) << "expert " << e;
    // An interleaved (gpt-oss) layout would put w3's row 0 at row 1.
    EXPECT_FALSE(std::equal(w3.begin(), w3.begin() + long(packed_row), p + packed_row));
    const auto w2 = tensor(e, "w2", "weight_packed"), w2s = tensor(e, "w2", "weight_scale");
    EXPECT_TRUE(std::equal(w2.begin(), w2.end(), r.w2_packed.data() + size_t(local) * w2.size())) << "expert " << e;
    EXPECT_TRUE(std::equal(w2s.begin(), w2s.end(), r.w2_scale.data() + size_t(local) * w2s.size())) << "expert " << e;
  }
  // The dequantized accessor reads the same halves: W13 row I + n is W3 row n.
  const auto w3 = tensor(r.first_expert, "w3", "weight_packed");
  const auto w3s = tensor(r.first_expert, "w3", "weight_scale");
  for (int k = 0; k < c.hidden; k += 7) {
    const double expect = double(e2m1_to_float(e2m1_nibble(w3[size_t(k / 2)], k))) * e8m0_to_float(w3s[size_t(k / 32)]);
    EXPECT_EQ(r.w13(0, c.intermediate, k), expect);
  }
}

TEST_F(Loader, RouterMatchesTheGeneratorAndGivesUnitLogits) {
  const SyntheticSpec spec = reduced_spec();
  const Checkpoint ckpt = Checkpoint::open(dir());
  for (int layer : {1, 2}) {
    const Router loaded = ckpt.load_router(layer);
    const Router made = synthesize_router(spec, layer);
    EXPECT_EQ(loaded.num_experts, 32);
    EXPECT_EQ(loaded.model_hidden, 512);
    EXPECT_EQ(loaded.weight, made.weight);
    EXPECT_EQ(loaded.bias, made.bias);
    double w2 = 0.0, b2 = 0.0;
    for (float w : loaded.weight) w2 += double(w) * w;
    for (float b : loaded.bias) b2 += double(b) * b;
    // Unit-variance inputs: logit variance = model_hidden * var(w) ~ 1; bias sd ~ 0.05.
    const double logit_var = w2 / double(loaded.weight.size()) * loaded.model_hidden;
    EXPECT_NEAR(logit_var, 1.0, 0.05);
    EXPECT_NEAR(std::sqrt(b2 / 32.0), 0.05, 0.02);
  }
  EXPECT_NE(synthesize_router(spec, 1).weight, synthesize_router(spec, 2).weight);
  // Only the layers the written checkpoint has routers for.
  for (int layer : {0, -1, spec.config.num_layers})
    testing::expect_error([&] { synthesize_router(spec, layer); },
                          {"synthesize_router: layer " + std::to_string(layer) + " is not a MoE layer"});
}

TEST_F(Loader, OpensOnlyTheShardsItNeeds) {
  TempDir copy("lazy");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  // Shard 3 holds experts 21..31 and the routers: break it.
  testing::write_text(copy.path() / "model-00003-of-00003.safetensors", "garbage!garbage!");
  const Checkpoint ckpt = Checkpoint::open(copy.path());
  const RankExperts r = ckpt.load_experts(1, {4, 1});  // experts 8..15: shards 1 and 2 only
  expect_same_experts(r, synthesize_experts(reduced_spec(), 1, {4, 1}), "rank 1 of 4");
  expect_error([&] { ckpt.load_experts(1, {4, 3}); }, {"model-00003-of-00003.safetensors", "header length"});
  expect_error([&] { ckpt.load_router(1); }, {"model-00003-of-00003.safetensors"});
}

// A shard the open checkpoint has already read, cut short before the next load (a copy or sync
// rewriting it in place): the next load from it fails naming the shard and a tensor, and loads
// from the other shards still succeed.
TEST_F(Loader, ShardTruncatedWhileOpenIsAnErrorNotACrash) {
  TempDir copy("cut");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  const Checkpoint ckpt = Checkpoint::open(copy.path());
  const RankExperts before = ckpt.load_experts(2, {4, 3});  // experts 24..31: shard 3, opened now
  const fs::path shard3 = copy.path() / "model-00003-of-00003.safetensors";
  fs::resize_file(shard3, fs::file_size(shard3) / 2);
  expect_error([&] { ckpt.load_experts(2, {4, 3}); },
               {"model-00003-of-00003.safetensors", "changed since it was opened", "tensor 'model.layers.2.mlp.experts."});
  expect_same_experts(ckpt.load_experts(2, {4, 0}), synthesize_experts(reduced_spec(), 2, {4, 0}), "rank 0 of 4");
  expect_same_experts(before, synthesize_experts(reduced_spec(), 2, {4, 3}), "rank 3 of 4, before the cut");
}

TEST_F(Loader, ValidateFlagsWhatTheConfigDoesNotExplain) {
  TempDir copy("validate");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  testing::edit_json_file(copy.path() / "config.json", [](nlohmann::json& j) {
    j["text_config"]["first_k_dense_replace"] = 2;  // layer 1 becomes dense, yet has experts
    j["text_config"]["num_experts"] = 16;           // the files hold 32
  });
  const auto problems = Checkpoint::open(copy.path()).validate();
  auto has = [&](const std::string& needle) {
    for (const std::string& p : problems)
      if (p.find(needle) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("layer 1 has expert tensors, but config.json makes it a dense layer"));
  EXPECT_TRUE(has("layer 2 names expert 31, but num_experts is 16"));
  EXPECT_TRUE(has("model.layers.2.mlp.gate.weight must be [16, 512] BF16|F32, got [32, 512] BF16"));
  EXPECT_FALSE(has("layer 2 has expert tensors, but"));
  // Per layer: the extra experts and the two router tensors; layer 1 also the dense complaint.
  EXPECT_EQ(problems.size(), 7u);
}

// A layer that config.json makes dense is not loaded as a MoE layer although its files hold experts.
TEST_F(Loader, LoadingADenseLayersExpertsIsAnError) {
  TempDir copy("dense");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  testing::edit_json_file(copy.path() / "config.json",
                          [](nlohmann::json& j) { j["text_config"]["first_k_dense_replace"] = 2; });
  const Checkpoint ckpt = Checkpoint::open(copy.path());
  expect_error([&] { ckpt.load_experts(1, {4, 0}); },
               {"layer 1 has expert tensors, but config.json makes it a dense layer", "first_k_dense_replace 2"});
  expect_same_experts(ckpt.load_experts(2, {4, 0}), synthesize_experts(reduced_spec(), 2, {4, 0}), "layer 2");
}

TEST_F(Loader, ValidateFlagsTheFirstExpertPastNumExperts) {
  TempDir copy("validate-edge");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  testing::edit_json_file(copy.path() / "config.json", [](nlohmann::json& j) { j["text_config"]["num_experts"] = 31; });
  const auto problems = Checkpoint::open(copy.path()).validate();
  const auto named = std::count_if(problems.begin(), problems.end(), [](const std::string& p) {
    return p.find("names expert 31, but num_experts is 31") != std::string::npos;
  });
  EXPECT_EQ(named, 2) << "layers 1 and 2";
}

TEST_F(Loader, MoreExpertsInTheConfigThanInTheFilesFailBeforeAnyAllocation) {
  TempDir copy("validate-more");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  // 2^22 experts of this shape would need ~0.5 TB: the loader must name the first missing tensor
  // instead of allocating, and validate must say it in one line per layer, not six per expert.
  testing::edit_json_file(copy.path() / "config.json",
                          [](nlohmann::json& j) { j["text_config"]["num_experts"] = 1 << 22; });
  const Checkpoint ckpt = Checkpoint::open(copy.path());
  expect_error([&] { ckpt.load_experts(1, {1, 0}); }, {"layers.1.mlp.experts.32.w1.weight_packed", "not in"});
  const auto problems = ckpt.validate();
  for (int layer : {1, 2}) {
    const std::string line = "layer " + std::to_string(layer) + " names experts up to 31, but num_experts is " +
                             std::to_string(1 << 22) + ": experts 32.." + std::to_string((1 << 22) - 1) +
                             " have no tensors";
    EXPECT_TRUE(std::any_of(problems.begin(), problems.end(),
                            [&](const std::string& p) { return p.find(line) != std::string::npos; }))
        << line;
  }
  EXPECT_LE(problems.size(), 6u) << "per layer: the missing experts and the two router tensors' shapes";
}

TEST_F(Loader, ValidateNamesGapsOfMissingExpertsOnceEach) {
  TempDir copy("validate-gaps");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  // Layer 1 loses every tensor of experts 5 and 6 and of expert 9; layer 2 gains one name of expert
  // 4,000,000 (of 2^22): checked by name, the experts between would be 24 million lookups.
  testing::edit_json_file(copy.path() / "model.safetensors.index.json", [](nlohmann::json& j) {
    nlohmann::json& map = j["weight_map"];
    for (auto it = map.begin(); it != map.end();) {
      const std::string& name = it.key();
      const bool gone = name.find("layers.1.mlp.experts.5.") != std::string::npos ||
                        name.find("layers.1.mlp.experts.6.") != std::string::npos ||
                        name.find("layers.1.mlp.experts.9.") != std::string::npos;
      it = gone ? map.erase(it) : std::next(it);
    }
    map["model.layers.2.mlp.experts.4000000.w1.weight_packed"] = map["model.layers.2.mlp.experts.0.w1.weight_packed"];
  });
  testing::edit_json_file(copy.path() / "config.json",
                          [](nlohmann::json& j) { j["text_config"]["num_experts"] = 1 << 22; });
  const auto problems = Checkpoint::open(copy.path()).validate();
  auto count = [&](const std::string& needle) {
    return std::count_if(problems.begin(), problems.end(),
                         [&](const std::string& p) { return p.find(needle) != std::string::npos; });
  };
  EXPECT_EQ(count("layer 1 names no tensor of experts 5..6"), 1);
  EXPECT_EQ(count("layer 1 names no tensor of expert 9"), 1);
  EXPECT_EQ(count("layer 2 names no tensor of experts 32..3999999"), 1);
  EXPECT_EQ(count("layers.2.mlp.experts.4000000.w3.weight_packed"), 1) << "the named expert's missing parts";
  EXPECT_EQ(count("experts.5."), 0) << "a gap is one line, not six per expert";
  EXPECT_LT(problems.size(), 20u);
}

TEST_F(Loader, ValidateListsAHundredProblemsThenCountsTheRest) {
  TempDir copy("validate-many");
  fs::copy(dir(), copy.path(), fs::copy_options::recursive);
  // Every expert tensor of both MoE layers now has the wrong shape: 2 layers x 32 experts x 6.
  testing::edit_json_file(copy.path() / "config.json",
                          [](nlohmann::json& j) { j["text_config"]["moe_intermediate_size"] = 256; });
  const auto problems = Checkpoint::open(copy.path()).validate();
  ASSERT_EQ(problems.size(), 101u);
  EXPECT_EQ(problems.back(), "... and " + std::to_string(2 * 32 * 6 - 100) + " more problems");
  EXPECT_EQ(std::set<std::string>(problems.begin(), problems.end()).size(), problems.size());
}

TEST_F(Loader, ReportsProgressPerExpert) {
  const Checkpoint ckpt = Checkpoint::open(dir());
  std::vector<int64_t> done;
  ckpt.load_experts(2, {2, 1}, [&](std::string_view, int64_t d, int64_t total) {
    EXPECT_EQ(total, 16);
    done.push_back(d);
  });
  ASSERT_EQ(done.size(), 16u);
  EXPECT_EQ(done.back(), 16);
}

TEST_F(Loader, RejectsBadRequests) {
  const Checkpoint ckpt = Checkpoint::open(dir());
  expect_error([&] { ckpt.load_experts(3, {1, 0}); }, {"layer 3 has no expert tensors", "1..2"});
  expect_error([&] { ckpt.load_experts(1, {3, 0}); }, {"EP size 3"});
  expect_error([&] { ckpt.load_experts(1, {4, 4}); }, {"rank"});
  expect_error([&] { ckpt.load_router(3); }, {"model.layers.3.mlp.gate.weight", "missing"});
}

TEST(LoaderPrefix, LanguageModelPrefix) {
  SyntheticSpec spec = reduced_spec();
  spec.prefix = "language_model.model.";
  spec.layers = {4};
  spec.num_shards = 2;
  TempDir dir("prefix");
  write_synthetic_checkpoint(dir.path(), spec);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.prefix(), "language_model.model.");
  EXPECT_EQ(ckpt.moe_layers(), std::vector<int>{4});
  EXPECT_EQ(ckpt.expert_tensor_name(4, 0, "w1", "weight_packed"),
            "language_model.model.layers.4.mlp.experts.0.w1.weight_packed");
  expect_same_experts(ckpt.load_experts(4, {2, 1}), synthesize_experts(spec, 4, {2, 1}), "prefixed");
  EXPECT_EQ(ckpt.load_router(4).weight, synthesize_router(spec, 4).weight);
  EXPECT_TRUE(ckpt.validate().empty());
}

// A writer that fails leaves no staging directory and no index or config.json of what it wrote:
// here a directory stands where the second shard goes, so only the first shard moves in; and a
// checkpoint written there before is still whole.
TEST(LoaderWriter, AFailedWriteLeavesNoPartialCheckpoint) {
  SyntheticSpec spec = reduced_spec();
  spec.num_shards = 2;
  TempDir dir("failed-write");
  fs::create_directories(dir.path() / "model-00002-of-00002.safetensors" / "in-the-way");
  expect_error([&] { write_synthetic_checkpoint(dir.path(), spec); },
               {"model-00002-of-00002.safetensors", "cannot move the written file there"});
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path())) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));

  TempDir whole("failed-rewrite");
  write_synthetic_checkpoint(whole.path(), spec);
  SyntheticSpec other = spec;
  other.num_shards = 3;
  fs::create_directories(whole.path() / "model-00001-of-00003.safetensors" / "in-the-way");
  EXPECT_THROW(write_synthetic_checkpoint(whole.path(), other), Error);
  const Checkpoint ckpt = Checkpoint::open(whole.path());
  EXPECT_EQ(ckpt.num_shards(), 2);
  EXPECT_TRUE(ckpt.validate().empty());
}

// A single model.safetensors (no index), router in F32, written by hand with the writer.
TEST(LoaderSingleFile, ReadsModelSafetensorsWithF32Router) {
  SyntheticSpec spec = reduced_spec();
  spec.config = testing::small_config();
  const MoeConfig& c = spec.config;
  const RankExperts ref = synthesize_experts(spec, 1, {1, 0});
  TempDir dir("single");
  testing::write_text(dir.path() / "config.json", c.to_json());

  const int64_t H = c.hidden, I = c.intermediate;
  std::vector<SafetensorsWriter::Entry> entries;
  const std::string p = "backbone.";
  auto expert = [&](int e, const char* tail) { return p + "layers.1.mlp.experts." + std::to_string(e) + "." + tail; };
  for (int e = 0; e < c.num_experts; ++e) {
    entries.push_back({expert(e, "w2.weight_packed"), Dtype::U8, {H, I / 2}});
    entries.push_back({expert(e, "w2.weight_scale"), Dtype::U8, {H, I / 32}});
    entries.push_back({expert(e, "w3.weight_packed"), Dtype::U8, {I, H / 2}});
    entries.push_back({expert(e, "w3.weight_scale"), Dtype::U8, {I, H / 32}});
    entries.push_back({expert(e, "w1.weight_packed"), Dtype::U8, {I, H / 2}});
    entries.push_back({expert(e, "w1.weight_scale"), Dtype::U8, {I, H / 32}});
  }
  entries.push_back({p + "layers.1.mlp.gate.weight", Dtype::F32, {c.num_experts, c.model_hidden}});
  entries.push_back({p + "layers.1.mlp.gate.e_score_correction_bias", Dtype::F32, {c.num_experts}});
  std::vector<float> gate(size_t(c.num_experts * c.model_hidden)), bias(size_t(c.num_experts));
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = float(i) * 0.25f - 3.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = -float(i) / 3.0f;
  {
    SafetensorsWriter w(dir.path() / "model.safetensors", entries);
    const size_t w13p = size_t(2 * I * H / 2), w13s = size_t(2 * I * H / 32);
    const size_t w2p = size_t(H * I / 2), w2s = size_t(H * I / 32);
    for (int e = 0; e < c.num_experts; ++e) {
      const uint8_t* P = ref.w13_packed.data() + size_t(e) * w13p;
      const uint8_t* S = ref.w13_scale.data() + size_t(e) * w13s;
      w.write(expert(e, "w2.weight_packed"), {ref.w2_packed.data() + size_t(e) * w2p, w2p});
      w.write(expert(e, "w2.weight_scale"), {ref.w2_scale.data() + size_t(e) * w2s, w2s});
      w.write(expert(e, "w3.weight_packed"), {P + w13p / 2, w13p / 2});
      w.write(expert(e, "w3.weight_scale"), {S + w13s / 2, w13s / 2});
      w.write(expert(e, "w1.weight_packed"), {P, w13p / 2});
      w.write(expert(e, "w1.weight_scale"), {S, w13s / 2});
    }
    w.write(p + "layers.1.mlp.gate.weight", {reinterpret_cast<const uint8_t*>(gate.data()), gate.size() * 4});
    w.write(p + "layers.1.mlp.gate.e_score_correction_bias",
            {reinterpret_cast<const uint8_t*>(bias.data()), bias.size() * 4});
    w.finish();
  }
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.prefix(), "backbone.");
  EXPECT_EQ(ckpt.num_shards(), 1);
  EXPECT_TRUE(ckpt.validate().empty());
  expect_same_experts(ckpt.load_experts(1, {1, 0}), ref, "single file");
  const Router router = ckpt.load_router(1);
  EXPECT_EQ(router.weight, gate);
  EXPECT_EQ(router.bias, bias);
}

TEST(Synthetic, SameBytesWhateverTheThreadCount) {
  SyntheticSpec spec = reduced_spec();
  spec.threads = 1;
  const RankExperts one = synthesize_experts(spec, 1, {2, 0});
  spec.threads = 3;
  expect_same_experts(one, synthesize_experts(spec, 1, {2, 0}), "1 vs 3 threads");
  // An expert's bytes do not depend on the EP slicing it was generated in.
  const RankExperts all = synthesize_experts(spec, 1, {1, 0});
  EXPECT_TRUE(std::equal(one.w2_scale.begin(), one.w2_scale.end(), all.w2_scale.begin()));
  EXPECT_EQ(all.bytes_read, 0u);
}

// More threads than experts to generate: the surplus has no work, and is not started (65536
// threads are more than Linux's default map count lets a process start).
TEST(Synthetic, ThreadsBeyondTheExperts) {
  SyntheticSpec spec = reduced_spec();
  spec.config.hidden = spec.config.intermediate = 64;
  spec.config.num_experts = 2;
  spec.config.top_k = 1;
  spec.layers = {1};
  spec.num_shards = 1;
  spec.threads = 1 << 16;
  const TempDir dir("threads");
  write_synthetic_checkpoint(dir.path(), spec);
  const RankExperts generated = synthesize_experts(spec, 1, {1, 0});
  spec.threads = 1;
  const RankExperts one = synthesize_experts(spec, 1, {1, 0});
  expect_same_experts(generated, one, "65536 threads vs 1, generated");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_TRUE(ckpt.validate().empty());
  expect_same_experts(ckpt.load_experts(1, {1, 0}), one, "65536 threads vs 1, written");
}

// Per-row sd in [0.5, 2]/sqrt(fan_in) and normal values: group scales spread over several binades
// and the E2M1 codes use the whole range, as in a trained model.
TEST(Synthetic, ScalesAndCodesSpread) {
  const SyntheticSpec spec = reduced_spec();
  const RankExperts r = synthesize_experts(spec, 1, {8, 0});
  std::map<int, int64_t> scales;
  for (uint8_t s : r.w13_scale) ++scales[s];
  EXPECT_GE(scales.size(), 4u) << "W13 scales span fewer than 4 binades";
  EXPECT_EQ(scales.count(255), 0u);
  std::array<int64_t, 16> codes{};
  for (uint8_t b : r.w2_packed) {
    ++codes[b & 15];
    ++codes[b >> 4];
  }
  for (int code = 0; code < 16; ++code) EXPECT_GT(codes[size_t(code)], 0) << "E2M1 code " << code << " never used";
  // The dequantized weights have the intended scale: rms ~ 1/sqrt(H) times E[sd] (~1.08).
  double sum2 = 0.0;
  int64_t n = 0;
  for (int row = 0; row < 2 * spec.config.intermediate; ++row)
    for (int k = 0; k < spec.config.hidden; ++k, ++n) sum2 += r.w13(0, row, k) * r.w13(0, row, k);
  const double rms = std::sqrt(sum2 / double(n)) * std::sqrt(double(spec.config.hidden));
  EXPECT_GT(rms, 0.8);
  EXPECT_LT(rms, 1.5);
}

TEST(Synthetic, RejectsBadSpecs) {
  SyntheticSpec spec = reduced_spec();
  TempDir dir("badspec");
  spec.layers = {0};
  expect_error([&] { write_synthetic_checkpoint(dir.path(), spec); }, {"layer 0", "not a MoE layer"});
  spec.layers = {1};
  spec.num_shards = 0;
  expect_error([&] { write_synthetic_checkpoint(dir.path(), spec); }, {"num_shards"});
  spec.num_shards = 33;
  expect_error([&] { write_synthetic_checkpoint(dir.path(), spec); }, {"num_shards", "33"});
  spec.num_shards = 2;
  spec.config.intermediate = 96;
  expect_error([&] { synthesize_experts(spec, 1, {1, 0}); }, {"moe_intermediate_size", "64"});
  spec = reduced_spec();
  spec.prefix = "m\xe9.";  // Latin-1, not UTF-8: the index and headers could not hold the names
  expect_error([&] { write_synthetic_checkpoint(dir.path() / "latin1", spec); }, {"prefix must be UTF-8"});
  EXPECT_FALSE(fs::exists(dir.path() / "latin1"));
  expect_error([&] { write_synthetic_checkpoint("", reduced_spec()); }, {"output directory", "empty path"});
}

// The generator's tabulated encoder gives quantize_mxfp4_group's bytes, bit for bit.
TEST(Synthetic, FastEncoderMatchesQuantizeMxfp4Group) {
  const detail::Mxfp4GroupEncoder encoder;
  for (uint32_t hi = 0; hi < (1u << 12); ++hi)  // every class boundary and class interior
    for (uint32_t lo : {0u, 1u, 0x100000u, 0x1FFFFFu}) {
      const float x = bits_float((hi << 20) | lo);
      EXPECT_EQ(encoder.e2m1(x), float_to_e2m1(x)) << std::hex << ((hi << 20) | lo);
    }
  std::mt19937_64 rng(42);
  const float specials[] = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 1e-40f, -1e-45f,
                            3e38f, -3.4028235e38f, INFINITY, -INFINITY, NAN};
  float group[32];
  uint8_t codes[32], packed[16];
  for (int it = 0; it < 200000; ++it) {
    const int mode = int(rng() % 4);
    const float sd = std::ldexp(1.0f, int(rng() % 40) - 30);
    std::normal_distribution<float> normal(0.0f, sd);
    for (float& v : group) {
      if (mode == 0) v = bits_float(uint32_t(rng()));                 // any bit pattern
      else if (mode == 1 && rng() % 8 == 0) v = specials[rng() % std::size(specials)] * (rng() % 2 ? 1 : sd);
      else v = normal(rng);
    }
    const uint8_t s = quantize_mxfp4_group(group, 32, codes);
    ASSERT_EQ(encoder.quantize_group(group, packed), s) << "iteration " << it;
    for (int j = 0; j < 16; ++j) ASSERT_EQ(packed[j], pack_e2m1(codes[2 * j], codes[2 * j + 1])) << "iteration " << it;
  }
}

}  // namespace
}  // namespace k3moe
