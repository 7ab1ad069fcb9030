#include "k3moe/config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "bounded_json.h"
#include "k3moe/error.h"

namespace k3moe {
namespace {

using nlohmann::json;

constexpr const char* kMxfp4Format = "mxfp4-pack-quantized";
constexpr int kMaxJsonDepth = 64;  // HF configs nest a handful of levels
constexpr int kMxGroup = 32;  // MXFP4: one E8M0 scale per 32 values, whatever a bad config claims

std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text + " (" + value.type_name() + ")";
}

// Looks fields up under "text_config" first, then at the top level, and names what it read
// ("text_config.moe_intermediate_size") in every error.
class Fields {
 public:
  Fields(const json& root, const std::string& source) : root_(root), source_(source) {
    if (auto it = root.find("text_config"); it != root.end()) {
      K3MOE_CHECK(it->is_object(), source_, ": text_config must be an object, got ", describe(*it));
      text_ = &*it;
    }
  }

  const std::string& source() const { return source_; }

  // The first of `names` present (text_config before top level); null when none is. Aliases
  // in the same scope (num_experts and n_routed_experts) must agree.
  const json* find(std::initializer_list<const char*> names, std::string* where) const {
    for (const json* scope : {text_, &root_}) {
      if (scope == nullptr) continue;
      const std::string prefix = scope == text_ ? "text_config." : "";
      const json* found = nullptr;
      for (const char* name : names) {
        const auto it = scope->find(name);
        if (it == scope->end()) continue;
        if (found == nullptr) {
          found = &*it;
          *where = prefix + name;
        } else {
          K3MOE_CHECK(*it == *found, source_, ": ", *where, " = ", describe(*found), " and ", prefix, name, " = ",
                      describe(*it), " disagree (they name the same setting)");
        }
      }
      if (found != nullptr) return found;
    }
    return nullptr;
  }

  const json& require(std::initializer_list<const char*> names, std::string* where) const {
    const json* value = find(names, where);
    if (value == nullptr) {
      std::string list;
      for (const char* name : names) list += (list.empty() ? "'" : "' or '") + std::string(name);
      K3MOE_FAIL(source_, ": field ", list, "' missing (looked under text_config and at the top level)");
    }
    return *value;
  }

  int integer(std::initializer_list<const char*> names, std::optional<int> fallback = {}) const {
    std::string where;
    const json* value = fallback ? find(names, &where) : &require(names, &where);
    if (value == nullptr) return *fallback;
    return as_int(*value, where);
  }

  double number(std::initializer_list<const char*> names, double fallback) const {
    std::string where;
    const json* value = find(names, &where);
    if (value == nullptr) return fallback;
    K3MOE_CHECK(value->is_number(), source_, ": field '", where, "' must be a number, got ", describe(*value));
    return value->get<double>();
  }

  bool boolean(std::initializer_list<const char*> names, bool fallback) const {
    std::string where;
    const json* value = find(names, &where);
    if (value == nullptr) return fallback;
    K3MOE_CHECK(value->is_boolean(), source_, ": field '", where, "' must be true or false, got ", describe(*value));
    return value->get<bool>();
  }

  std::string string(std::initializer_list<const char*> names) const {
    std::string where;
    const json& value = require(names, &where);
    K3MOE_CHECK(value.is_string(), source_, ": field '", where, "' must be a string, got ", describe(value));
    return value.get<std::string>();
  }

  int as_int(const json& value, const std::string& where) const {
    K3MOE_CHECK(value.is_number_integer(), source_, ": field '", where, "' must be an integer, got ",
                describe(value));
    const bool fits = value.is_number_unsigned()
                          ? value.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                          : value.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                value.get<int64_t>() <= std::numeric_limits<int>::max();
    K3MOE_CHECK(fits, source_, ": field '", where, "' is out of range: ", value.dump());
    return value.get<int>();
  }

 private:
  const json& root_;
  const json* text_ = nullptr;
  std::string source_;
};

Activation activation_from_hidden_act(const std::string& act, const std::string& source) {
  if (act == "situ") return Activation::Situ;
  if (act == "silu" || act == "swiglu") return Activation::Swiglu;
  if (act == "swiglu_oai") return Activation::SwigluOai;
  K3MOE_FAIL(source, ": field 'hidden_act' must be \"situ\", \"silu\", \"swiglu\" or \"swiglu_oai\", got \"",
             act, "\"");
}

// compressed-tensors keeps format / num_bits / group_size either at the top of
// quantization_config or inside config_groups.<group>.{format, weights.{num_bits, group_size}}.
// Every place that states a value must agree; at least one place must state each.
void read_quantization(const Fields& fields, MoeConfig& config) {
  std::string where;
  const json* qc = fields.find({"quantization_config"}, &where);
  const std::string& source = fields.source();
  K3MOE_CHECK(qc != nullptr, source, ": field 'quantization_config' missing: k3moe loads compressed-tensors ",
              kMxfp4Format, " experts (4 bits, group 32)");
  K3MOE_CHECK(qc->is_object(), source, ": field '", where, "' must be an object, got ", describe(*qc));

  std::optional<std::string> format;
  std::optional<int> num_bits, group_size;
  auto take_format = [&](const json& value, const std::string& at) {
    K3MOE_CHECK(value.is_string(), source, ": field '", at, "' must be a string, got ", describe(value));
    const std::string text = value.get<std::string>();
    K3MOE_CHECK(!format || *format == text, source, ": field '", at, "' is \"", text,
                "\" but another part of quantization_config says \"", *format, "\"");
    format = text;
  };
  auto take_int = [&](std::optional<int>& slot, const json& value, const std::string& at) {
    const int v = fields.as_int(value, at);
    K3MOE_CHECK(!slot || *slot == v, source, ": field '", at, "' is ", v,
                " but another part of quantization_config says ", *slot);
    slot = v;
  };

  if (auto it = qc->find("format"); it != qc->end()) take_format(*it, where + ".format");
  if (auto it = qc->find("num_bits"); it != qc->end()) take_int(num_bits, *it, where + ".num_bits");
  if (auto it = qc->find("group_size"); it != qc->end()) take_int(group_size, *it, where + ".group_size");
  if (auto groups = qc->find("config_groups"); groups != qc->end()) {
    const std::string at = where + ".config_groups";
    K3MOE_CHECK(groups->is_object(), source, ": field '", at, "' must be an object, got ", describe(*groups));
    for (const auto& [name, group] : groups->items()) {
      const std::string group_at = at + "." + name;
      K3MOE_CHECK(group.is_object(), source, ": field '", group_at, "' must be an object, got ", describe(group));
      if (auto it = group.find("format"); it != group.end()) take_format(*it, group_at + ".format");
      auto weights = group.find("weights");
      if (weights == group.end() || weights->is_null()) continue;
      K3MOE_CHECK(weights->is_object(), source, ": field '", group_at, ".weights' must be an object, got ",
                  describe(*weights));
      if (auto it = weights->find("num_bits"); it != weights->end())
        take_int(num_bits, *it, group_at + ".weights.num_bits");
      if (auto it = weights->find("group_size"); it != weights->end())
        take_int(group_size, *it, group_at + ".weights.group_size");
    }
  }

  K3MOE_CHECK(format.has_value(), source, ": field '", where, ".format' missing (expected \"", kMxfp4Format, "\")");
  K3MOE_CHECK(num_bits.has_value(), source, ": field '", where,
              ".config_groups.<group>.weights.num_bits' missing (expected 4)");
  K3MOE_CHECK(group_size.has_value(), source, ": field '", where,
              ".config_groups.<group>.weights.group_size' missing (expected 32)");
  config.quant_format = *format;
  config.num_bits = *num_bits;
  config.group_size = *group_size;
}

}  // namespace

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::A16: return "a16";
    case Mode::Mxfp8: return "mxfp8";
  }
  return "?";
}

std::string_view to_string(Activation activation) {
  switch (activation) {
    case Activation::Situ: return "situ";
    case Activation::Swiglu: return "swiglu";
    case Activation::SwigluOai: return "swiglu_oai";
  }
  return "?";
}

Mode parse_mode(std::string_view text) {
  if (text == "a16") return Mode::A16;
  if (text == "mxfp8") return Mode::Mxfp8;
  K3MOE_FAIL("mode must be \"a16\" or \"mxfp8\", got \"", text, "\"");
}

Activation parse_activation(std::string_view text) {
  if (text == "situ") return Activation::Situ;
  if (text == "swiglu") return Activation::Swiglu;
  if (text == "swiglu_oai") return Activation::SwigluOai;
  K3MOE_FAIL("activation must be \"situ\", \"swiglu\" or \"swiglu_oai\", got \"", text, "\"");
}

MoeConfig MoeConfig::from_json(std::string_view text, const std::string& source) {
  std::string why;
  const json root = detail::parse_bounded_json(text, kMaxJsonDepth, why);
  K3MOE_CHECK(!root.is_discarded(), source, ": not valid JSON: ", why);
  K3MOE_CHECK(root.is_object(), source, ": must hold a JSON object, got ", root.type_name());
  const Fields fields(root, source);

  // Fields that are absent take Kimi-K3's values; the ones that size the experts are required.
  MoeConfig c;
  c.model_hidden = fields.integer({"hidden_size"});
  c.hidden = fields.integer({"routed_expert_hidden_size"}, c.model_hidden);
  c.intermediate = fields.integer({"moe_intermediate_size"});
  c.num_experts = fields.integer({"num_experts", "n_routed_experts"});
  c.top_k = fields.integer({"num_experts_per_token", "num_experts_per_tok"});
  c.num_layers = fields.integer({"num_hidden_layers"});
  c.first_k_dense_replace = fields.integer({"first_k_dense_replace"}, c.first_k_dense_replace);
  c.moe_layer_freq = fields.integer({"moe_layer_freq"}, c.moe_layer_freq);
  c.routed_scaling_factor = float(fields.number({"routed_scaling_factor"}, c.routed_scaling_factor));
  c.renormalize = fields.boolean({"moe_renormalize", "norm_topk_prob"}, c.renormalize);
  c.activation = activation_from_hidden_act(fields.string({"hidden_act"}), source);
  ActivationParams& p = c.activation_params;
  p.situ_beta = float(fields.number({"activation_situ_beta"}, p.situ_beta));
  p.situ_linear_beta = float(fields.number({"activation_situ_linear_beta"}, p.situ_linear_beta));
  p.swiglu_alpha = float(fields.number({"swiglu_alpha"}, p.swiglu_alpha));
  p.swiglu_limit = float(fields.number({"swiglu_limit"}, p.swiglu_limit));
  read_quantization(fields, c);

  try {
    c.validate();
  } catch (const Error& e) {
    K3MOE_FAIL(source, ": ", e.message());
  }
  return c;
}

MoeConfig MoeConfig::from_file(const std::filesystem::path& path) {
  return from_json(detail::read_json_file(path), path.string());
}

std::string MoeConfig::to_json() const {
  json weights = {{"num_bits", num_bits}, {"type", "float"}, {"strategy", "group"},
                  {"group_size", group_size}, {"symmetric", true}, {"dynamic", false}};
  json quantization = {
      {"quant_method", "compressed-tensors"},
      {"format", quant_format},
      {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights},
                                      {"input_activations", nullptr}, {"format", quant_format}}}}},
      {"ignore", {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.gate$"}}};
  json text = {
      {"hidden_size", model_hidden},
      {"routed_expert_hidden_size", hidden},
      {"moe_intermediate_size", intermediate},
      {"num_experts", num_experts},
      {"num_experts_per_token", top_k},
      {"routed_scaling_factor", routed_scaling_factor},
      {"moe_renormalize", renormalize},
      {"hidden_act", activation == Activation::Swiglu ? "silu" : std::string(to_string(activation))},
      {"activation_situ_beta", activation_params.situ_beta},
      {"activation_situ_linear_beta", activation_params.situ_linear_beta},
      {"num_hidden_layers", num_layers},
      {"first_k_dense_replace", first_k_dense_replace},
      {"moe_layer_freq", moe_layer_freq},
      {"quantization_config", quantization}};
  if (activation == Activation::SwigluOai) {
    text["swiglu_alpha"] = activation_params.swiglu_alpha;
    text["swiglu_limit"] = activation_params.swiglu_limit;
  }
  return json{{"text_config", text}}.dump(2) + "\n";
}

void MoeConfig::validate() const {
  K3MOE_CHECK(model_hidden > 0, "hidden_size must be > 0, got ", model_hidden);
  K3MOE_CHECK(model_hidden <= kMaxDimension, "hidden_size (the router's input width) must be <= 2^20 = ",
              kMaxDimension, ", got ", model_hidden);
  K3MOE_CHECK(hidden > 0, "routed_expert_hidden_size (H) must be > 0, got ", hidden);
  K3MOE_CHECK(intermediate > 0, "moe_intermediate_size (I) must be > 0, got ", intermediate);
  K3MOE_CHECK(quant_format == kMxfp4Format, "quantization_config format must be \"", kMxfp4Format,
              "\", got \"", quant_format, "\"");
  K3MOE_CHECK(num_bits == 4, "quantization_config num_bits must be 4 (MXFP4), got ", num_bits);
  K3MOE_CHECK(group_size == 32, "quantization_config group_size must be 32 (MXFP4), got ", group_size);
  K3MOE_CHECK(hidden % group_size == 0, "routed_expert_hidden_size (H) must be a multiple of the group size ",
              group_size, ", got ", hidden);
  K3MOE_CHECK(intermediate % group_size == 0, "moe_intermediate_size (I) must be a multiple of the group size ",
              group_size, ", got ", intermediate);
  K3MOE_CHECK(hidden % 64 == 0, "routed_expert_hidden_size (H) must be a multiple of 64 (the GPU kernels step "
              "K and N in 64-wide tiles), got ", hidden);
  K3MOE_CHECK(intermediate % 64 == 0, "moe_intermediate_size (I) must be a multiple of 64 (the GPU kernels "
              "step K and N in 64-wide tiles), got ", intermediate);
  K3MOE_CHECK(num_experts >= 1, "num_experts (E) must be >= 1, got ", num_experts);
  check_layer_bytes();
  K3MOE_CHECK(top_k >= 1 && top_k <= num_experts, "num_experts_per_token (K) must be in [1, num_experts = ",
              num_experts, "], got ", top_k);
  K3MOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f,
              "routed_scaling_factor must be finite and > 0, got ", routed_scaling_factor);
  activation_params.validate();
  K3MOE_CHECK(num_layers >= 1, "num_hidden_layers must be >= 1, got ", num_layers);
  K3MOE_CHECK(moe_layer_freq >= 1, "moe_layer_freq must be >= 1, got ", moe_layer_freq);
  K3MOE_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace < num_layers,
              "first_k_dense_replace must be in [0, num_hidden_layers = ", num_layers,
              ") so that some layer is MoE, got ", first_k_dense_replace);
  K3MOE_CHECK(first_moe_layer() >= 0, "no MoE layer: num_hidden_layers = ", num_layers,
              ", first_k_dense_replace = ", first_k_dense_replace, ", moe_layer_freq = ", moe_layer_freq);
}

void ActivationParams::validate() const {
  K3MOE_CHECK(std::isfinite(situ_beta) && situ_beta > 0.0f, "activation_situ_beta must be finite and > 0, got ",
              situ_beta);
  K3MOE_CHECK(std::isfinite(situ_linear_beta) && situ_linear_beta > 0.0f,
              "activation_situ_linear_beta must be finite and > 0, got ", situ_linear_beta);
  K3MOE_CHECK(std::isfinite(swiglu_alpha), "swiglu_alpha must be finite, got ", swiglu_alpha);
  K3MOE_CHECK(std::isfinite(swiglu_limit) && swiglu_limit > 0.0f, "swiglu_limit must be finite and > 0, got ",
              swiglu_limit);
}

void MoeConfig::check_layer_bytes() const {
  K3MOE_CHECK(hidden <= kMaxDimension, "routed_expert_hidden_size (H) must be <= 2^20 = ", kMaxDimension, ", got ",
              hidden);
  K3MOE_CHECK(intermediate <= kMaxDimension, "moe_intermediate_size (I) must be <= 2^20 = ", kMaxDimension,
              ", got ", intermediate);
  // In double: the products below overflow int64 for H and I near 2^31.
  const double h = hidden, i = intermediate;
  const double layer_bytes = double(num_experts) * (2 * i * (h / 2 + h / kMxGroup) + h * (i / 2 + i / kMxGroup));
  K3MOE_CHECK(layer_bytes <= double(kMaxLayerBytes), "one layer's experts (num_experts ", num_experts,
              " x the MXFP4 bytes of H ", hidden, ", I ", intermediate, ": ", layer_bytes,
              " bytes) must fit in 2^53 bytes");
}

// HF's DeepSeek-V3 rule: layer >= first_k_dense_replace and layer % moe_layer_freq == 0.
bool MoeConfig::is_moe_layer(int layer) const {
  return layer >= 0 && layer < num_layers && layer >= first_k_dense_replace && moe_layer_freq > 0 &&
         layer % moe_layer_freq == 0;
}

// The smallest multiple of moe_layer_freq at or above first_k_dense_replace, if below num_layers
// (computed in int64: rounding up near 2^31 would wrap in int).
int MoeConfig::first_moe_layer() const {
  if (moe_layer_freq <= 0) return -1;
  const int64_t from = std::max(first_k_dense_replace, 0);
  const int64_t layer = (from + moe_layer_freq - 1) / moe_layer_freq * moe_layer_freq;
  return layer < num_layers ? int(layer) : -1;
}

int64_t MoeConfig::w13_bytes() const {
  const int64_t rows = 2 * int64_t(intermediate);
  return rows * (hidden / 2) + rows * (hidden / kMxGroup);
}

int64_t MoeConfig::w2_bytes() const {
  const int64_t rows = hidden;
  return rows * (intermediate / 2) + rows * (intermediate / kMxGroup);
}

void ExpertParallel::validate(int num_experts) const {
  K3MOE_CHECK(size >= 1, "EP size must be >= 1, got ", size);
  K3MOE_CHECK(rank >= 0 && rank < size, "EP rank must be in [0, ", size, "), got ", rank);
  K3MOE_CHECK(num_experts % size == 0, "EP size ", size, " must divide num_experts = ", num_experts);
}

}  // namespace k3moe
