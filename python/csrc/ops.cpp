// torch.ops.k3moe: the ops a serving engine calls, over the public k3moe API (k3moe/plan.h).
//
//   prepare_experts  checkpoint-layout MXFP4 experts -> the kernel layout (one-time, synchronous)
//   route            router logits + bias -> top-k ids and weights
//   forward          x, ids, weights, kernel-layout experts -> out          (allocates out)
//   forward_out      the same into a caller's out                            (returns nothing)
//
// route and forward enqueue on the current CUDA stream of the input's device and never synchronise
// the host; forward's workspace is kept per stream or comes from torch's caching allocator (a
// graph-private pool during CUDA graph capture; stream_workspace.h), so they can be captured and
// replayed. Their fake (meta) implementations, for torch.compile, are in k3moe/_ops.py.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/error.h"
#include "k3moe/experts.h"
#include "k3moe/forward_graph.h"
#include "k3moe/plan.h"
#include "plan_cache.h"
#include "stream_workspace.h"
#include "torch_tensors.h"

namespace k3moe::torch_binding {
namespace {

cudaStream_t current_stream(c10::Device device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

// Eager forwards run as one graph launch each (ForwardGraph) unless K3MOE_EAGER_GRAPH=0 is set when
// the module loads (then as their kernels' launches: the comparison in test_torch_overhead.py).
bool eager_forward_as_graph() {
  static const bool enabled = [] {
    const char* value = std::getenv("K3MOE_EAGER_GRAPH");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

// ------------------------------------------------------------------------------- prepare_experts

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> prepare_experts(const at::Tensor& w13_packed,
                                                                           const at::Tensor& w13_scale,
                                                                           const at::Tensor& w2_packed,
                                                                           const at::Tensor& w2_scale) {
  constexpr const char* op = "k3moe.prepare_experts";
  TORCH_CHECK(w13_packed.defined() && w13_packed.dim() == 3 && w13_packed.size(1) % 2 == 0, op,
              ": w13_packed must be [E, 2I, H/2] uint8, got ", describe(w13_packed));
  const int64_t E = w13_packed.size(0), I = w13_packed.size(1) / 2, H = 2 * w13_packed.size(2);
  const c10::Device device = w13_packed.device();
  // NOTE: any strides and alignment are taken here (the tensors are copied to the host), unlike
  // route/forward.
  auto check = [&](const char* name, const at::Tensor& t, std::initializer_list<int64_t> shape) {
    check_tensor_type(op, name, t, {at::kByte}, shape, device);
  };
  check("w13_packed", w13_packed, {E, 2 * I, H / 2});
  check("w13_scale", w13_scale, {E, 2 * I, H / 32});
  check("w2_packed", w2_packed, {E, H, I / 2});
  check("w2_scale", w2_scale, {E, H, I / 32});

  return translate_errors(op, [&] {
    MoeConfig config;
    config.model_hidden = config.hidden = to_int(op, "H (2 * w13_packed.size(2))", H);
    config.intermediate = to_int(op, "I (w13_packed.size(1) / 2)", I);
    config.num_experts = to_int(op, "E (w13_packed.size(0))", E);
    config.top_k = 1;
    // NOTE: E is the rank's local expert count here; expert numbers in errors are local.
    RankExperts experts = RankExperts::allocate(config, /*layer=*/0, ExpertParallel{1, 0});
    auto to_host = [](const at::Tensor& t, std::vector<uint8_t>& dst) {
      const at::Tensor host = t.to(at::kCPU).contiguous();  // synchronous: a one-time load step
      std::memcpy(dst.data(), host.data_ptr(), dst.size());
    };
    to_host(w13_packed, experts.w13_packed);
    to_host(w13_scale, experts.w13_scale);
    to_host(w2_packed, experts.w2_packed);
    to_host(w2_scale, experts.w2_scale);
    KernelLayout layout = to_kernel_layout(experts);
    const KernelLayoutSizes sizes = kernel_layout_sizes(config, ExpertParallel{1, 0});
    auto place = [&](std::vector<uint8_t>&& bytes, int64_t total) {
      return adopt(std::move(bytes), {E, total / E}).to(device);
    };
    return std::make_tuple(place(std::move(layout.w13_codes), sizes.w13_codes),
                           place(std::move(layout.w13_scales), sizes.w13_scales),
                           place(std::move(layout.w2_codes), sizes.w2_codes),
                           place(std::move(layout.w2_scales), sizes.w2_scales));
  });
}

// ------------------------------------------------------------------------------------------ route

std::tuple<at::Tensor, at::Tensor> route(const at::Tensor& router_logits, const at::Tensor& router_bias,
                                         int64_t top_k, bool renormalize, double routed_scaling_factor) {
  constexpr const char* op = "k3moe.route";
  check_cuda_input(op, "router_logits", router_logits, 2);
  const c10::Device device = router_logits.device();
  const int64_t T = router_logits.size(0), E = router_logits.size(1);
  check_tensor(op, "router_logits", router_logits, {at::kFloat}, {T, E}, device);
  check_tensor(op, "router_bias", router_bias, {at::kFloat}, {E}, device);
  return translate_errors(op, [&] {
    PlanKey key;
    key.num_experts = to_int(op, "num_experts", E);
    key.top_k = to_int(op, "top_k", top_k);
    // NOTE: routing does not read H, I or the activation; Kimi-K3's values make a valid plan.
    key.hidden = MoeConfig{}.hidden;
    key.intermediate = MoeConfig{}.intermediate;
    const ActivationParams defaults;
    key.situ_beta = defaults.situ_beta;
    key.situ_linear_beta = defaults.situ_linear_beta;
    key.swiglu_alpha = defaults.swiglu_alpha;
    key.swiglu_limit = defaults.swiglu_limit;
    key.renormalize = renormalize;
    key.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
    key.device = device.index();
    const cudaStream_t stream = current_stream(device);
    const MoePlan& plan = plan_for(key, stream);
    at::Tensor ids = at::empty({T, top_k}, router_logits.options().dtype(at::kInt));
    at::Tensor weights = at::empty({T, top_k}, router_logits.options().dtype(at::kFloat));
    const DLTensor logits_dl = borrow(router_logits), bias_dl = borrow(router_bias);
    DLTensor ids_dl = borrow(ids), weights_dl = borrow(weights);
    plan.route(logits_dl, bias_dl, ids_dl, weights_dl, stream);
    return std::make_tuple(ids, weights);
  });
}

// ---------------------------------------------------------------------------------------- forward

struct ForwardConfig {
  int64_t num_experts, top_k, hidden, intermediate;
  std::string_view precision, activation;  // precision: the mode, "a16" | "mxfp8"
  double situ_beta, situ_linear_beta, swiglu_alpha, swiglu_limit;
  int64_t ep_size, ep_rank;
};

struct ExpertTensors {
  const at::Tensor &w13_codes, &w13_scales, &w2_codes, &w2_scales;
};

// Checks every argument, then enqueues the forward into `out_given` ([T, H] bf16), or into a new
// tensor when it is null. Returns the output.
at::Tensor run_forward(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& x_scales,
                       const at::Tensor& topk_ids, const at::Tensor& topk_weights, const ExpertTensors& w,
                       const ForwardConfig& f, const at::Tensor* out_given) {
  check_cuda_input(op, "x", x, 2);
  const c10::Device device = x.device();
  PlanKey key;
  translate_errors(op, [&] {
    key.num_experts = to_int(op, "num_experts", f.num_experts);
    key.top_k = to_int(op, "top_k", f.top_k);
    key.hidden = to_int(op, "hidden", f.hidden);
    key.intermediate = to_int(op, "intermediate", f.intermediate);
    key.mode = parse_mode(f.precision);
    key.activation = parse_activation(f.activation);
    key.situ_beta = static_cast<float>(f.situ_beta);
    key.situ_linear_beta = static_cast<float>(f.situ_linear_beta);
    key.swiglu_alpha = static_cast<float>(f.swiglu_alpha);
    key.swiglu_limit = static_cast<float>(f.swiglu_limit);
    key.ep_size = to_int(op, "ep_size", f.ep_size);
    key.ep_rank = to_int(op, "ep_rank", f.ep_rank);
    key.device = device.index();
  });
  const cudaStream_t stream = current_stream(device);
  // NOTE: the plan validates the configuration (E, K, H, I, EP) before the tensors are checked
  // against it.
  const MoePlan& plan = translate_errors(op, [&]() -> const MoePlan& { return plan_for(key, stream); });

  const int64_t T = x.size(0), H = f.hidden, I = f.intermediate, K = f.top_k;
  const int64_t L = f.num_experts / f.ep_size;  // local experts
  const bool prequantized = x.scalar_type() == at::kByte || x.scalar_type() == at::kFloat8_e4m3fn;
  if (prequantized) {
    TORCH_CHECK(key.mode == Mode::Mxfp8, op, ": x is ", describe(x),
                " (pre-quantized MXFP8 codes), which needs precision \"mxfp8\"; precision is \"", f.precision, "\"");
    check_tensor(op, "x", x, {at::kByte, at::kFloat8_e4m3fn}, {T, H}, device);
    TORCH_CHECK(x_scales.has_value(), op, ": x is pre-quantized (", describe(x), "), so x_scales must be [", T, ", ",
                H / 128, "] int32 on ", device.str(), ", got no tensor");
    check_tensor(op, "x_scales", *x_scales, {at::kInt}, {T, H / 128}, device);
  } else {
    check_tensor(op, "x", x, {at::kBFloat16}, {T, H}, device);
    TORCH_CHECK(!x_scales.has_value(), op, ": x_scales is only taken with a pre-quantized x (uint8 E4M3 codes); x is ",
                describe(x));
  }
  check_tensor(op, "topk_ids", topk_ids, {at::kInt}, {T, K}, device);
  check_tensor(op, "topk_weights", topk_weights, {at::kFloat}, {T, K}, device);
  check_tensor(op, "w13_codes", w.w13_codes, {at::kByte}, {L, I * H}, device);
  check_tensor(op, "w13_scales", w.w13_scales, {at::kByte}, {L, I * H / 16}, device);
  check_tensor(op, "w2_codes", w.w2_codes, {at::kByte}, {L, H * I / 2}, device);
  check_tensor(op, "w2_scales", w.w2_scales, {at::kByte}, {L, H * I / 32}, device);
  if (out_given) check_tensor(op, "out", *out_given, {at::kBFloat16}, {T, H}, device);
  TORCH_CHECK(T <= plan.max_forward_tokens(), op, ": x has ", T, " tokens; one forward takes at most ",
              plan.max_forward_tokens(), " at top_k ", K, ", H ", H, ", I ", I, " (32-bit row offsets): split the batch");
  const int tokens = to_int(op, "the token count (x.size(0))", T);
  const at::Tensor out = out_given ? *out_given : at::empty({T, H}, x.options().dtype(at::kBFloat16));

  translate_errors(op, [&] {
    const std::shared_ptr<const DeviceExperts> experts = experts_view(
        plan, {w.w13_codes.data_ptr<uint8_t>(), w.w13_scales.data_ptr<uint8_t>(), w.w2_codes.data_ptr<uint8_t>(),
               w.w2_scales.data_ptr<uint8_t>()});
    const StreamWorkspace workspace(plan.workspace_bytes(tokens), device, stream);
    const DLTensor x_dl = borrow(x), ids_dl = borrow(topk_ids), weights_dl = borrow(topk_weights);
    DLTensor out_dl = borrow(out);
    DLTensor scales_dl{};
    ForwardArgs args;
    args.x = &x_dl;
    if (prequantized) {
      scales_dl = borrow(*x_scales);
      args.x_scales = &scales_dl;
    }
    args.topk_ids = &ids_dl;
    args.topk_weights = &weights_dl;
    args.out = &out_dl;
    if (ForwardGraph* graph = workspace.forward_graph(); graph != nullptr && eager_forward_as_graph())
      graph->forward(plan, *experts, args, stream, workspace.data());
    else
      plan.forward(*experts, args, stream, workspace.data());
  });
  return out;
}

at::Tensor forward(const at::Tensor& x, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                   const at::Tensor& w13_codes, const at::Tensor& w13_scales, const at::Tensor& w2_codes,
                   const at::Tensor& w2_scales, int64_t num_experts, int64_t top_k, int64_t hidden,
                   int64_t intermediate, c10::string_view precision, c10::string_view activation, double situ_beta,
                   double situ_linear_beta, double swiglu_alpha, double swiglu_limit, int64_t ep_size,
                   int64_t ep_rank, const std::optional<at::Tensor>& x_scales) {
  return run_forward("k3moe.forward", x, x_scales, topk_ids, topk_weights, {w13_codes, w13_scales, w2_codes, w2_scales},
              {num_experts, top_k, hidden, intermediate, precision, activation, situ_beta, situ_linear_beta, swiglu_alpha,
               swiglu_limit, ep_size, ep_rank},
              nullptr);
}

void forward_out(const at::Tensor& x, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                 const at::Tensor& w13_codes, const at::Tensor& w13_scales, const at::Tensor& w2_codes,
                 const at::Tensor& w2_scales, int64_t num_experts, int64_t top_k, int64_t hidden, int64_t intermediate,
                 c10::string_view precision, c10::string_view activation, double situ_beta, double situ_linear_beta,
                 double swiglu_alpha, double swiglu_limit, int64_t ep_size, int64_t ep_rank,
                 const std::optional<at::Tensor>& x_scales, const at::Tensor& out) {
  run_forward("k3moe.forward_out", x, x_scales, topk_ids, topk_weights, {w13_codes, w13_scales, w2_codes, w2_scales},
              {num_experts, top_k, hidden, intermediate, precision, activation, situ_beta, situ_linear_beta, swiglu_alpha,
               swiglu_limit, ep_size, ep_rank},
              &out);
}

}  // namespace
}  // namespace k3moe::torch_binding

// The config arguments may be given by position or by keyword; their defaults are Kimi-K3's.
// NOTE: by position is the fast way from Python (parsing a dozen keywords costs a few us per call,
// k3moe.forward passes them by position). `precision` is the mode
// ("a16" | "mxfp8"; k3moe::Mode). NOTE: not named `mode`: torch.compile's auto_functionalized_v2,
// which wraps forward_out, takes a `mode` argument of its own and fails on an op argument of that name.
#define K3MOE_FORWARD_ARGS                                                                                     \
  "Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13_codes, Tensor w13_scales, Tensor w2_codes, "     \
  "Tensor w2_scales, int num_experts, int top_k, int hidden, int intermediate, str precision=\"a16\", "          \
  "str activation=\"situ\", float situ_beta=4.0, float situ_linear_beta=25.0, float swiglu_alpha=1.702, "      \
  "float swiglu_limit=7.0, int ep_size=1, int ep_rank=0, Tensor? x_scales=None"

TORCH_LIBRARY(k3moe, m) {
  // The fake (meta) implementations, which torch.compile traces with, live in this Python module.
  m.set_python_module("k3moe._ops");
  m.def(
      "prepare_experts(Tensor w13_packed, Tensor w13_scale, Tensor w2_packed, Tensor w2_scale) "
      "-> (Tensor w13_codes, Tensor w13_scales, Tensor w2_codes, Tensor w2_scales)");
  m.def(
      "route(Tensor router_logits, Tensor router_bias, int top_k, bool renormalize=True, "
      "float routed_scaling_factor=1.0) -> (Tensor topk_ids, Tensor topk_weights)");
  m.def("forward(" K3MOE_FORWARD_ARGS ") -> Tensor");
  m.def("forward_out(" K3MOE_FORWARD_ARGS ", *, Tensor(a!) out) -> ()");
}

// NOTE: CompositeExplicitAutograd, not CUDA: a CPU or meta tensor then reaches the binding's own
// checks, which name the argument, instead of the dispatcher's "no kernel for backend" error. The
// fake implementations registered from Python take precedence under FakeTensorMode.
TORCH_LIBRARY_IMPL(k3moe, CompositeExplicitAutograd, m) {
  using namespace k3moe::torch_binding;
  m.impl("prepare_experts", &prepare_experts);
  m.impl("route", &route);
  m.impl("forward", &forward);
  m.impl("forward_out", &forward_out);
}
