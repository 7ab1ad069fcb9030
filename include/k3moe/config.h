// The MoE configuration (from a checkpoint's config.json), the precision modes, the gated
// activations and expert parallelism.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace k3moe {

// Precision contract of the forward (see docs/PRECISION.md).
//   A16:   bf16 activations into GEMM1; the activation output rounded to bf16 before GEMM2;
//          GEMM outputs accumulated in fp32; combine in fp32, stored bf16.
//   Mxfp8: activations quantized to MXFP8 (per token, 32-wide groups, round-up E8M0 scale);
//          the activation output quantized to MXFP8 the same way before GEMM2; fp32 combine,
//          stored bf16.
enum class Mode { A16, Mxfp8 };

// Gated activations on h = [gate | up] (the gate is the FIRST half).
//   Situ:      (beta tanh(g/beta) sigmoid(g)) * (beta_lin tanh(u/beta_lin))      (Kimi-K3)
//   Swiglu:    silu(g) * u
//   SwigluOai: gpt-oss: g = min(g, limit), u = clamp(u, -limit, limit),
//              g sigmoid(alpha g) (u + 1)
enum class Activation { Situ, Swiglu, SwigluOai };

struct ActivationParams {
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // Throws k3moe::Error naming the field: the betas and the limit finite and > 0, alpha finite.
  void validate() const;
};

std::string_view to_string(Mode mode);
std::string_view to_string(Activation activation);
Mode parse_mode(std::string_view text);              // "a16" | "mxfp8"
Activation parse_activation(std::string_view text);  // "situ" | "swiglu" | "swiglu_oai"

// The routed-expert part of a Kimi-K3-class model. Defaults are Kimi-K3's.
struct MoeConfig {
  int model_hidden = 7168;        // hidden_size: the router's input width
  int hidden = 3584;              // H = routed_expert_hidden_size (hidden_size when absent)
  int intermediate = 3072;        // I = moe_intermediate_size
  int num_experts = 896;          // E = num_experts | n_routed_experts
  int top_k = 16;                 // K = num_experts_per_token | num_experts_per_tok
  float routed_scaling_factor = 1.0f;
  bool renormalize = true;        // moe_renormalize | norm_topk_prob
  Activation activation = Activation::Situ;  // hidden_act
  ActivationParams activation_params;        // activation_situ_beta, activation_situ_linear_beta
  int num_layers = 93;            // num_hidden_layers
  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;
  int group_size = 32;            // quantization_config ... group_size
  int num_bits = 4;               // quantization_config ... num_bits
  std::string quant_format = "mxfp4-pack-quantized";

  static MoeConfig kimi_k3() { return {}; }

  // Parses config.json text; fields may sit at the top level or under "text_config". `source`
  // names the file in errors. Throws k3moe::Error naming the field on anything missing or wrong.
  static MoeConfig from_json(std::string_view text, const std::string& source);
  static MoeConfig from_file(const std::filesystem::path& path);
  // A config.json that from_json reads back to this config (K3 field names, under text_config).
  std::string to_json() const;

  // Throws k3moe::Error naming the field when the numbers are inconsistent.
  void validate() const;
  // Throws unless H and I are at most kMaxDimension (so that row and column counts such as 2 I
  // stay far inside int) and one layer's experts (num_experts x expert_bytes()) fit in
  // kMaxLayerBytes (so that every byte count and offset derived from H, I and E is exact in int64
  // and in double).
  void check_layer_bytes() const;
  static constexpr int kMaxDimension = 1 << 20;
  static constexpr int64_t kMaxLayerBytes = int64_t(1) << 53;
  bool is_moe_layer(int layer) const;
  int first_moe_layer() const;

  // Bytes of one expert's MXFP4 tensors (packed + E8M0 scales): W13 and W2.
  int64_t w13_bytes() const;
  int64_t w2_bytes() const;
  int64_t expert_bytes() const { return w13_bytes() + w2_bytes(); }
};

// Expert parallelism: rank r of P owns the contiguous experts [r E/P, (r+1) E/P).
struct ExpertParallel {
  int size = 1;
  int rank = 0;

  // Throws k3moe::Error unless 0 <= rank < size and size divides num_experts.
  void validate(int num_experts) const;
  int num_local(int num_experts) const { return num_experts / size; }
  int first_expert(int num_experts) const { return rank * num_local(num_experts); }
};

}  // namespace k3moe
