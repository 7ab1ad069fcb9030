// MoePlan: validation and workspace at creation; forward() only checks tensors on the host and
// enqueues the stages in order: [routing] -> [MXFP8 quantization] -> permutation -> GEMM1 (+ the
// activation, fused or as its own stage when K is split) -> GEMM2 -> combine.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "k3moe/error.h"
#include "k3moe/plan.h"
#include "kernels/activation.cuh"
#include "kernels/combine.cuh"
#include "kernels/expert_gemm.cuh"
#include "kernels/permute.cuh"
#include "kernels/quantize_mxfp8.cuh"
#include "kernels/routing.cuh"
#include "runtime/device_buffer.h"
#include "runtime/device_experts_impl.h"
#include "runtime/heuristics.h"
#include "runtime/tensor_checks.h"

namespace k3moe {
namespace {

// Carves the workspace into the stages' buffers, 256-byte aligned.
struct Workspace {
  int32_t* route_ids = nullptr;     // [T, K] when routing from logits without caller buffers
  float* route_weights = nullptr;   // [T, K]
  uint8_t* x_codes = nullptr;       // [T, H] MXFP8 codes
  uint8_t* x_scales = nullptr;      // [T, H/32]
  uint16_t* x_dequant = nullptr;    // [T, H] bf16
  int32_t* expert_offset = nullptr;  // [num_local + 1]
  int32_t* row_token = nullptr;     // [T K]
  int32_t* slot_row = nullptr;      // [T K]
  int4* tile_info = nullptr;        // the GEMMs' schedule: [max_tiles] token tiles
  int32_t* num_tiles = nullptr;     // [1]
  int* unit_counters = nullptr;     // [2] GEMM1, GEMM2
  int32_t* permute_scratch = nullptr;  // the large permutation's per-block rows
  float* h = nullptr;               // [splits1][T K, 2I] fp32, when GEMM1 splits K
  uint16_t* inter = nullptr;        // [T K, I] bf16
  float* y = nullptr;               // [splits2][T K, H] fp32

  // Buffers for `tokens` tokens from `base`; with base == nullptr, only counts the bytes.
  static int64_t carve(Workspace* w, char* base, const PlanOptions& o, int64_t tokens, const GpuTraits& gpu) {
    const int64_t T = tokens, K = o.config.top_k, H = o.config.hidden, I = o.config.intermediate;
    const int64_t local = o.config.num_experts / o.ep.size;
    const KernelChoice choice = kernel_choice(o, tokens, gpu);
    int64_t offset = 0;
    auto take = [&](auto*& ptr, int64_t bytes) {
      ptr = base ? reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base + offset) : nullptr;
      offset += (bytes + 255) / 256 * 256;
    };
    take(w->route_ids, T * K * 4);
    take(w->route_weights, T * K * 4);
    take(w->x_codes, o.mode == Mode::Mxfp8 ? T * H : 0);
    take(w->x_scales, o.mode == Mode::Mxfp8 ? T * H / 32 : 0);
    take(w->x_dequant, o.mode == Mode::Mxfp8 ? T * H * 2 : 0);
    take(w->expert_offset, (local + 1) * 4);
    take(w->row_token, T * K * 4);
    take(w->slot_row, T * K * 4);
    take(w->tile_info, kernels::max_tiles(T * K, int(local), kernels::tile_tokens(choice.token_tile)) * 16);
    take(w->num_tiles, 4);
    take(w->unit_counters, 2 * 4);
    take(w->permute_scratch, kernels::permute_scratch_bytes(int(local)));
    take(w->h, choice.gemm1_splits > 1 ? choice.gemm1_splits * T * K * 2 * I * 4 : 0);
    take(w->inter, T * K * I * 2);
    take(w->y, choice.gemm2_splits * T * K * H * 4);
    return offset;
  }
};

// One forward's token count T: 0 <= T <= the GEMMs' 32-bit row-offset limit. `what` starts the
// message ("x has ", "workspace_bytes: ").
void check_token_count(const MoeConfig& c, int64_t T, const char* what) {
  const int64_t limit = kernels::max_gemm_tokens(c.top_k, c.hidden, c.intermediate);
  K3MOE_CHECK(T >= 0 && T <= limit, what, T, " tokens; one forward takes 0 to ", limit, " at top_k ", c.top_k,
              ", H ", c.hidden, ", I ", c.intermediate, " (32-bit row offsets): split the batch");
}

}  // namespace

struct MoePlan::Impl {
  PlanOptions options;
  int num_local = 0, first_expert = 0;
  GpuTraits gpu;
  DeviceBuffer workspace_buffer;
  Workspace ws;
};

bool hopper_gpu_available(std::string* why_not) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why_not) *why_not = status != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(status) + ")"
                                                  : "no CUDA device";
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0) {
    if (why_not) *why_not = std::string("device 0 is ") + prop.name + " (compute capability " +
                            std::to_string(prop.major) + "." + std::to_string(prop.minor) + "), k3moe needs 9.0";
    return false;
  }
  return true;
}

MoePlan MoePlan::create(const PlanOptions& o) {
  o.config.validate();
  o.ep.validate(o.config.num_experts);
  // The kernels run the plan's mode, activation and parameters: the config's unless given.
  K3MOE_CHECK(o.mode == Mode::A16 || o.mode == Mode::Mxfp8, "mode must be A16 or Mxfp8, got ", int(o.mode));
  const Activation activation = o.activation.value_or(o.config.activation);
  K3MOE_CHECK(activation == Activation::Situ || activation == Activation::Swiglu || activation == Activation::SwigluOai,
              "activation must be Situ, Swiglu or SwigluOai, got ", int(activation));
  const ActivationParams activation_params = o.activation_params.value_or(o.config.activation_params);
  activation_params.validate();
  const MoeConfig& c = o.config;
  K3MOE_CHECK(o.max_tokens >= 0, "max_tokens must be >= 0, got ", o.max_tokens);
  const int64_t token_limit = kernels::max_gemm_tokens(c.top_k, c.hidden, c.intermediate);
  K3MOE_CHECK(o.max_tokens <= token_limit, "max_tokens must be <= ", token_limit, " at top_k ", c.top_k, ", H ",
              c.hidden, ", I ", c.intermediate, " (32-bit row offsets), got ", o.max_tokens);
  K3MOE_CHECK(o.gemm1_splits >= 0 && o.gemm2_splits >= 0, "gemm splits must be >= 0 (0: automatic), got ",
              o.gemm1_splits, " and ", o.gemm2_splits);
  for (const int rows : {o.gemm1_unit_rows, o.gemm2_unit_rows})
    K3MOE_CHECK(rows == 0 || rows == kernels::kGemmHalfUnitRows || rows == kernels::kGemmRowsPerCta,
                "gemm unit rows must be 0 (automatic), 128 or 256, got ", rows);
  choose_kernels(o.config, o.ep, 1, {1}, o.gemm_kernel, o.token_tile);  // a clear error for an unknown kernel or tile
  K3MOE_CHECK(c.hidden % kernels::kGemmKMultiple == 0 && c.intermediate % kernels::kGemmKMultiple == 0,
              "the expert GEMMs need H and I to be multiples of ", kernels::kGemmKMultiple, ", got H = ", c.hidden,
              ", I = ", c.intermediate);
  K3MOE_CHECK(c.top_k <= kernels::kRoutingMaxTopK, "top_k must be <= ", kernels::kRoutingMaxTopK, ", got ", c.top_k);
  K3MOE_CHECK(c.num_experts <= kernels::kRoutingMaxExperts, "routing supports up to ", kernels::kRoutingMaxExperts,
              " experts, got ", c.num_experts);
  const int num_local = o.ep.num_local(c.num_experts);
  K3MOE_CHECK(num_local <= kernels::kPermuteMaxLocalExperts, "a rank can hold up to ",
              kernels::kPermuteMaxLocalExperts, " experts, got ", num_local);

  check_device_exists(o.device, "MoePlan::create");
  cudaDeviceProp prop{};
  K3MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  K3MOE_CHECK(prop.major == 9 && prop.minor == 0, "k3moe's kernels need compute capability 9.0 (Hopper: H100, H200); ",
              "device ", o.device, " is ", prop.name, " (", prop.major, ".", prop.minor, ")");

  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->options.activation = activation;
  impl->options.activation_params = activation_params;
  impl->num_local = num_local;
  impl->first_expert = o.ep.first_expert(c.num_experts);
  impl->gpu = GpuTraits::of_device(o.device);
  DeviceGuard guard(o.device);
  kernels::configure_expert_gemm_kernels();
  kernels::configure_permute_kernel();
  if (o.max_tokens > 0) {
    size_t free_bytes = 0, total_bytes = 0;
    K3MOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const auto check_fits = [&](int64_t bytes) {
      K3MOE_CHECK(bytes <= int64_t(free_bytes), "the workspace for max_tokens ", o.max_tokens, " needs ", bytes,
                  " bytes; device ", o.device, " has ", free_bytes, " free of ", total_bytes,
                  " (lower max_tokens, or give each forward a workspace)");
    };
    // The K splits change with T: size the workspace for the largest need up to max_tokens.
    int64_t bytes = Workspace::carve(&impl->ws, nullptr, o, o.max_tokens, impl->gpu);
    check_fits(bytes);
    for (int t = 1; t < o.max_tokens; ++t)
      bytes = std::max(bytes, Workspace::carve(&impl->ws, nullptr, o, t, impl->gpu));
    check_fits(bytes);
    impl->workspace_buffer = DeviceBuffer(bytes);
  }
  return MoePlan(std::move(impl));
}

void MoePlan::forward(const DeviceExperts& experts, const ForwardArgs& args, cudaStream_t stream,
                      void* workspace) const {
  const Impl& p = *impl_;
  const PlanOptions& o = p.options;
  const MoeConfig& c = o.config;
  const DeviceExperts::Impl& w = experts.impl();
  K3MOE_CHECK(w.device == o.device, "experts live on cuda:", w.device, ", the plan on cuda:", o.device);
  K3MOE_CHECK(w.config.hidden == c.hidden && w.config.intermediate == c.intermediate &&
                  w.config.num_experts == c.num_experts && w.ep.size == o.ep.size && w.ep.rank == o.ep.rank,
              "experts (H ", w.config.hidden, ", I ", w.config.intermediate, ", E ", w.config.num_experts, ", EP ",
              w.ep.rank, "/", w.ep.size, ") do not match the plan (H ", c.hidden, ", I ", c.intermediate, ", E ",
              c.num_experts, ", EP ", o.ep.rank, "/", o.ep.size, ")");

  // ---- host-side checks of every tensor, before anything is enqueued
  K3MOE_CHECK(args.x != nullptr, "x must be given");
  K3MOE_CHECK(args.x->ndim == 2 && args.x->shape != nullptr, "x must be [T, ", c.hidden, "], got ",
              describe_tensor(*args.x));
  const int64_t T = args.x->shape[0], H = c.hidden, K = c.top_k, E = c.num_experts;
  check_token_count(c, T, "x has ");
  K3MOE_CHECK(workspace != nullptr || T <= o.max_tokens, "x has ", T, " tokens, the plan was created for at most ",
              o.max_tokens, " (pass a workspace of workspace_bytes(", T, ") bytes for more)");
  K3MOE_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace must be 256-byte aligned");
  const bool x_prequantized = same_dtype(args.x->dtype, kU8);
  K3MOE_CHECK(!x_prequantized || o.mode == Mode::Mxfp8,
              "x is uint8 (pre-quantized MXFP8) but the plan's mode is ", to_string(o.mode));
  check_tensor(args.x, "x", x_prequantized ? kU8 : kBf16, {T, H}, o.device);
  if (x_prequantized) check_tensor(args.x_scales, "x_scales", kI32, {T, H / 128}, o.device);
  K3MOE_CHECK(x_prequantized || args.x_scales == nullptr,
              "x_scales is given but x is bf16 (x_scales go with a pre-quantized uint8 x)");
  check_tensor(args.out, "out", kBf16, {T, H}, o.device);
  const bool from_logits = args.router_logits != nullptr;
  if (from_logits) {
    check_tensor(args.router_logits, "router_logits", kF32, {T, E}, o.device);
    check_tensor(args.router_bias, "router_bias", kF32, {E}, o.device);
  }
  K3MOE_CHECK(from_logits || (args.topk_ids && args.topk_weights),
              "give either topk_ids + topk_weights or router_logits + router_bias");
  K3MOE_CHECK(from_logits || args.router_bias == nullptr,
              "router_bias is given without router_logits (it is used only to route from logits)");
  if (args.topk_ids || !from_logits) check_tensor(args.topk_ids, "topk_ids", kI32, {T, K}, o.device);
  if (args.topk_weights || !from_logits) check_tensor(args.topk_weights, "topk_weights", kF32, {T, K}, o.device);
  // Asked of the driver outside a capture only (it refuses some queries during one): the stream's
  // device, the memory of stage_times and of a caller workspace.
  const bool capturing = stream_is_capturing(stream);
  if (!capturing) check_stream_device(stream, o.device, "the stream");
  if (args.stage_times && !capturing)
    check_device_memory(args.stage_times, kForwardStages * int64_t(sizeof(StageTimes)), o.device, 8, "stage_times");
  if (T == 0) return;
  const KernelChoice choice = kernel_choice(o, T, p.gpu);
  if (choice.gemm1_splits > 1) kernels::check_activation_rows(T * K, c.intermediate, p.gpu.sm_count);

  DeviceGuard guard(o.device);
  Workspace ws;
  const int64_t workspace_needed =
      Workspace::carve(&ws, workspace ? static_cast<char*>(workspace) : p.workspace_buffer.get<char>(), o, T, p.gpu);
  if (workspace && !capturing) check_device_memory(workspace, workspace_needed, o.device, 256, "workspace");
  int32_t* ids = args.topk_ids ? data_ptr<int32_t>(args.topk_ids) : ws.route_ids;
  float* weights = args.topk_weights ? data_ptr<float>(args.topk_weights) : ws.route_weights;
  const auto times = [&](ForwardStage s) { return args.stage_times ? args.stage_times + int(s) : nullptr; };
  if (from_logits) {
    kernels::launch_routing({data_ptr<float>(args.router_logits), data_ptr<float>(args.router_bias), ids, weights,
                             int(T), int(E), int(K), c.renormalize, c.routed_scaling_factor,
                             times(ForwardStage::Routing)},
                            stream);
  }

  // The activations' MXFP8 rounding rides in the permutation's launch (neither reads what the
  // other writes).
  const uint16_t* x_act = data_ptr<uint16_t>(args.x);
  kernels::PermuteArgs permute{ids, int(T), int(K), p.first_expert, p.num_local, ws.expert_offset, ws.row_token,
                               ws.slot_row, kernels::tile_tokens(choice.token_tile), ws.tile_info, ws.num_tiles,
                               ws.unit_counters};
  permute.block_rows = ws.permute_scratch;
  permute.times = times(ForwardStage::Permutation);
  if (o.mode == Mode::Mxfp8) {
    permute.rounding = x_prequantized ? kernels::dequantizing(data_ptr<uint8_t>(args.x),
                                                              data_ptr<uint8_t>(args.x_scales), int(T), int(H),
                                                              ws.x_dequant)
                                      : kernels::quantizing(x_act, int(T), int(H),
                                                            {ws.x_codes, ws.x_scales, ws.x_dequant});
    x_act = ws.x_dequant;
  }
  kernels::launch_permute(permute, stream);

  const int64_t rows = T * K;  // capacity of the row buffers
  kernels::ExpertGemmArgs g1{.codes = w.data.w13_codes,
                             .scales = w.data.w13_scales,
                             .act = x_act,
                             .row_token = ws.row_token,
                             .tile_info = ws.tile_info,
                             .num_tiles = ws.num_tiles,
                             .unit_counter = ws.unit_counters,
                             .num_local = p.num_local,
                             .N = 2 * c.intermediate,
                             .K = c.hidden,
                             .splits = choice.gemm1_splits,
                             .sm_count = p.gpu.sm_count,
                             .act_rows = T,
                             .unit_rows = choice.gemm1_unit_rows};
  g1.weights_once = choice.weights_once;
  g1.times = times(ForwardStage::Gemm1);
  kernels::GemmOutput out1{ws.inter, o.mode, *o.activation, *o.activation_params, ws.h, rows * 2 * c.intermediate};
  kernels::launch_expert_gemm1(g1, out1, choice.token_tile, choice.gemm1_warps, stream);
  if (choice.gemm1_splits > 1) {
    kernels::ActivationArgs act{ws.h, rows * 2 * c.intermediate, choice.gemm1_splits, ws.expert_offset, p.num_local,
                                int(rows), p.gpu.sm_count, c.intermediate, ws.inter, o.mode, *o.activation,
                                *o.activation_params};
    act.release_early = choice.activation_beside_gemm1;
    act.times = times(ForwardStage::Activation);
    kernels::launch_activation(act, stream);
  }
  kernels::ExpertGemmArgs g2 = g1;
  g2.codes = w.data.w2_codes;
  g2.scales = w.data.w2_scales;
  g2.act = ws.inter;
  g2.act_rows = rows;
  g2.row_token = nullptr;
  g2.unit_counter = ws.unit_counters + 1;
  if (kernels::tile_uses_wgmma(choice.token_tile))
    g2.gemm1_stores_per_tile = kernels::wgmma_units_per_tile(g1.N) * (choice.gemm1_warps / 4);
  g2.N = c.hidden;
  g2.K = c.intermediate;
  g2.splits = choice.gemm2_splits;
  g2.unit_rows = choice.gemm2_unit_rows;
  g2.times = times(ForwardStage::Gemm2);
  kernels::GemmOutput out2;
  out2.rows = ws.y;
  out2.split_stride = rows * c.hidden;
  kernels::launch_expert_gemm2(g2, out2, choice.token_tile, choice.gemm2_warps, stream);

  kernels::launch_combine({ws.y, rows * c.hidden, choice.gemm2_splits, ws.slot_row, weights,
                           data_ptr<uint16_t>(args.out), int(T), int(K), int(H), kernels::CombineMapping::Auto,
                           8 * p.num_local <= c.num_experts, times(ForwardStage::Combine)},
                          stream);
}

std::string_view to_string(ForwardStage stage) {
  constexpr std::string_view kNames[kForwardStages] = {"routing", "permutation", "GEMM1", "activation", "GEMM2",
                                                       "combine"};
  return kNames[int(stage)];
}

void MoePlan::route(const DLTensor& logits, const DLTensor& bias, DLTensor& ids, DLTensor& weights,
                    cudaStream_t stream) const {
  const PlanOptions& o = impl_->options;
  const MoeConfig& c = o.config;
  K3MOE_CHECK(logits.ndim == 2 && logits.shape != nullptr, "router_logits must be [T, ", c.num_experts, "], got ",
              describe_tensor(logits));
  const int64_t T = logits.shape[0];
  K3MOE_CHECK(T <= std::numeric_limits<int>::max(), "router_logits has ", T, " rows, at most 2^31 - 1");
  check_tensor(&logits, "router_logits", kF32, {T, c.num_experts}, o.device);
  check_tensor(&bias, "router_bias", kF32, {c.num_experts}, o.device);
  check_tensor(&ids, "topk_ids", kI32, {T, c.top_k}, o.device);
  check_tensor(&weights, "topk_weights", kF32, {T, c.top_k}, o.device);
  check_stream_device(stream, o.device, "the stream");
  DeviceGuard guard(o.device);
  kernels::launch_routing({data_ptr<float>(&logits), data_ptr<float>(&bias), data_ptr<int32_t>(&ids),
                           data_ptr<float>(&weights), int(T), c.num_experts, c.top_k, c.renormalize,
                           c.routed_scaling_factor},
                          stream);
}

void MoePlan::quantize_mxfp8(const DLTensor& x, DLTensor& codes, DLTensor& scales, cudaStream_t stream) const {
  const PlanOptions& o = impl_->options;
  const int64_t H = o.config.hidden;
  K3MOE_CHECK(x.ndim == 2 && x.shape != nullptr, "x must be [T, ", H, "], got ", describe_tensor(x));
  const int64_t T = x.shape[0];
  K3MOE_CHECK(T <= std::numeric_limits<int>::max(), "x has ", T, " rows, at most 2^31 - 1");
  check_tensor(&x, "x", kBf16, {T, H}, o.device);
  check_tensor(&codes, "codes", kU8, {T, H}, o.device);
  check_tensor(&scales, "scales", kI32, {T, H / 128}, o.device);
  check_stream_device(stream, o.device, "the stream");
  DeviceGuard guard(o.device);
  kernels::launch_quantize_mxfp8(data_ptr<uint16_t>(&x), int(T), int(H),
                                 {data_ptr<uint8_t>(&codes), data_ptr<uint8_t>(&scales), nullptr}, stream);
}

const PlanOptions& MoePlan::options() const { return impl_->options; }
int64_t MoePlan::max_forward_tokens() const {
  const MoeConfig& c = impl_->options.config;
  return kernels::max_gemm_tokens(c.top_k, c.hidden, c.intermediate);
}
int64_t MoePlan::workspace_bytes() const { return impl_->workspace_buffer.bytes(); }
int64_t MoePlan::workspace_bytes(int tokens) const {
  check_token_count(impl_->options.config, tokens, "workspace_bytes: ");
  Workspace unused;
  return Workspace::carve(&unused, nullptr, impl_->options, tokens, impl_->gpu);
}

std::string MoePlan::describe(int tokens) const {
  const PlanOptions& o = impl_->options;
  check_token_count(o.config, tokens, "describe: ");
  std::ostringstream out;
  out << "mode " << to_string(o.mode) << ", activation " << to_string(*o.activation) << ", EP rank " << o.ep.rank
      << "/" << o.ep.size << " (" << impl_->num_local << " local experts from " << impl_->first_expert << ")\n"
      << "GPU: " << impl_->gpu.sm_count << " SMs, memory " << impl_->gpu.memory_bytes_per_s / 1e12
      << " TB/s peak\n"
      << "routing: one CTA of 4 warps per token, top-" << o.config.top_k << " of " << o.config.num_experts << "\n"
      << (o.mode == Mode::Mxfp8 ? "MXFP8 quantization of x: once per token, on blocks of the permutation's launch\n"
                                : "")
      << "permutation: one CTA, deterministic (t, k) order\n"
      << kernel_choice(o, tokens, impl_->gpu).describe() << "\n"
      << "combine: "
      << (tokens >= kernels::kCombineThreadPerOutputsFrom ? "one thread per 4 outputs" : "a lane group per 4 outputs")
      << ", fp32, a fixed pairwise order over the slots\n"
      << "workspace: " << workspace_bytes() << " bytes for " << o.max_tokens << " tokens";
  return out.str();
}

MoePlan::MoePlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoePlan::MoePlan(MoePlan&&) noexcept = default;
MoePlan& MoePlan::operator=(MoePlan&&) noexcept = default;
MoePlan::~MoePlan() = default;

}  // namespace k3moe
