// torch.classes.k3moe.Checkpoint: the library's K3 checkpoint loader (k3moe/checkpoint.h) for
// Python, which loads one EP rank's experts of one layer (reading only those tensors' bytes) and
// the layer's router. Tensors come back on the CPU; k3moe.nn moves them to the GPU.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <charconv>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "k3moe/checkpoint.h"
#include "k3moe/plan.h"
#include "torch_tensors.h"

namespace k3moe::torch_binding {
namespace {

// The shortest text that reads back as the same float (1.702f -> "1.702").
std::string number(float value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

class CheckpointHolder : public torch::CustomClassHolder {
 public:
  explicit CheckpointHolder(const std::string& dir)
      : checkpoint_(translate_errors("k3moe.Checkpoint", [&] { return Checkpoint::open(dir); })) {}

  // The MoE config as JSON with the binding's names (see k3moe.MoeConfig).
  std::string config_json() const {
    const MoeConfig& c = checkpoint_.config();
    const ActivationParams& p = c.activation_params;
    std::ostringstream json;
    const char* separator = "{";
    auto field = [&](const char* name, const std::string& value) {
      json << separator << '"' << name << "\": " << value;
      separator = ", ";
    };
    field("num_experts", std::to_string(c.num_experts));
    field("top_k", std::to_string(c.top_k));
    field("hidden", std::to_string(c.hidden));
    field("intermediate", std::to_string(c.intermediate));
    field("model_hidden", std::to_string(c.model_hidden));
    field("activation", '"' + std::string(to_string(c.activation)) + '"');
    field("situ_beta", number(p.situ_beta));
    field("situ_linear_beta", number(p.situ_linear_beta));
    field("swiglu_alpha", number(p.swiglu_alpha));
    field("swiglu_limit", number(p.swiglu_limit));
    field("renormalize", c.renormalize ? "true" : "false");
    field("routed_scaling_factor", number(c.routed_scaling_factor));
    json << "}";
    return json.str();
  }

  std::vector<int64_t> moe_layers() const {
    const std::vector<int> layers = checkpoint_.moe_layers();
    return {layers.begin(), layers.end()};
  }

  // The rank's experts in the checkpoint layout: w13_packed [L, 2I, H/2], w13_scale [L, 2I, H/32],
  // w2_packed [L, H, I/2], w2_scale [L, H, I/32] (W13 = [W1; W3]).
  std::vector<at::Tensor> load_experts(int64_t layer, int64_t ep_size, int64_t ep_rank) const {
    constexpr const char* op = "k3moe.Checkpoint.load_experts";
    const ExpertParallel ep{to_int(op, "ep_size", ep_size), to_int(op, "ep_rank", ep_rank)};
    return translate_errors(op, [&] {
      RankExperts e = checkpoint_.load_experts(to_int(op, "layer", layer), ep);
      const int64_t L = e.num_local, H = e.config.hidden, I = e.config.intermediate;
      return std::vector<at::Tensor>{adopt(std::move(e.w13_packed), {L, 2 * I, H / 2}),
                                     adopt(std::move(e.w13_scale), {L, 2 * I, H / 32}),
                                     adopt(std::move(e.w2_packed), {L, H, I / 2}),
                                     adopt(std::move(e.w2_scale), {L, H, I / 32})};
    });
  }

  // The same experts already in the kernel layout (what k3moe.prepare_experts returns), reordered
  // on the host without an intermediate copy.
  std::vector<at::Tensor> load_kernel_layout(int64_t layer, int64_t ep_size, int64_t ep_rank) const {
    constexpr const char* op = "k3moe.Checkpoint.load_kernel_layout";
    const ExpertParallel ep{to_int(op, "ep_size", ep_size), to_int(op, "ep_rank", ep_rank)};
    return translate_errors(op, [&] {
      KernelLayout k = to_kernel_layout(checkpoint_.load_experts(to_int(op, "layer", layer), ep));
      const KernelLayoutSizes s = kernel_layout_sizes(checkpoint_.config(), ep);
      const int64_t L = ep.num_local(checkpoint_.config().num_experts);
      return std::vector<at::Tensor>{adopt(std::move(k.w13_codes), {L, s.w13_codes / L}),
                                     adopt(std::move(k.w13_scales), {L, s.w13_scales / L}),
                                     adopt(std::move(k.w2_codes), {L, s.w2_codes / L}),
                                     adopt(std::move(k.w2_scales), {L, s.w2_scales / L})};
    });
  }

  // The layer's router, widened to fp32: gate weight [E, model_hidden], correction bias [E].
  std::vector<at::Tensor> load_router(int64_t layer) const {
    constexpr const char* op = "k3moe.Checkpoint.load_router";
    return translate_errors(op, [&] {
      Router r = checkpoint_.load_router(to_int(op, "layer", layer));
      const int64_t E = r.num_experts, D = r.model_hidden;
      return std::vector<at::Tensor>{adopt(std::move(r.weight), {E, D}), adopt(std::move(r.bias), {E})};
    });
  }

 private:
  Checkpoint checkpoint_;
};

}  // namespace
}  // namespace k3moe::torch_binding

TORCH_LIBRARY_FRAGMENT(k3moe, m) {
  using k3moe::torch_binding::CheckpointHolder;
  m.class_<CheckpointHolder>("Checkpoint")
      .def(torch::init<std::string>())
      .def("config_json", &CheckpointHolder::config_json)
      .def("moe_layers", &CheckpointHolder::moe_layers)
      .def("load_experts", &CheckpointHolder::load_experts)
      .def("load_kernel_layout", &CheckpointHolder::load_kernel_layout)
      .def("load_router", &CheckpointHolder::load_router);
}
