// The GPU forward of the routed experts: device weights in the kernel layout, and a plan that is
// created once and then runs forward() any number of times.
//
// Guarantees of MoePlan::forward (see docs/API.md):
//   - no device allocation, no host synchronisation, no device-to-host copy: it only enqueues
//     kernels on the given stream, so it can be captured in a CUDA graph and replayed with new
//     data in the same buffers;
//   - bitwise deterministic: the same inputs give the same output bits, run after run, eager or
//     replayed (no atomics in any floating-point reduction; token lists built in a fixed order);
//   - every element of `out` is written (a token with no local expert gets zeros);
//   - ids that are -1, belong to another EP rank, or are garbage (>= E, < -1, as CUDA-graph
//     padding rows may hold) contribute nothing and are never used to index memory. Ids are
//     validated on the host only where the host holds them (the reference, the CLI).
// One plan runs one forward at a time (its workspace is shared by its launches); use one plan per
// concurrently running stream.
#pragma once

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/experts.h"
#include "k3moe/stage_times.h"

namespace k3moe {

// A rank's experts in the kernel layout (src/kernels/expert_layout.cuh): four byte tensors.
// The codes of a group whose scale is NaN (255) are stored as zeros: the group decodes to NaN
// whatever its codes were.
struct KernelLayout {
  std::vector<uint8_t> w13_codes, w13_scales, w2_codes, w2_scales;
};
struct KernelLayoutSizes {
  int64_t w13_codes = 0, w13_scales = 0, w2_codes = 0, w2_scales = 0;  // bytes, all local experts
};
KernelLayoutSizes kernel_layout_sizes(const MoeConfig& config, ExpertParallel ep);
// Reorders on the host. Throws k3moe::Error for a scale byte the kernels cannot represent exactly
// (129..254, i.e. group scales above 2), naming tensor, expert, row and group.
KernelLayout to_kernel_layout(const RankExperts& experts);
RankExperts from_kernel_layout(const KernelLayout& layout, const MoeConfig& config, int layer, ExpertParallel ep);

// A rank's experts on one GPU, in the kernel layout.
class DeviceExperts {
 public:
  // Reorders (to_kernel_layout) and uploads, synchronously.
  static DeviceExperts upload(const RankExperts& experts, int device);
  // A view of kernel-layout bytes already on `device` (e.g. framework tensors made from
  // to_kernel_layout); the memory stays the caller's and must outlive the view. It checks each
  // pointer with the driver (device memory of `device`, 16-byte aligned, its kernel_layout_sizes
  // bytes before its allocation's end where the driver knows it): make a view once per set of
  // weights, not per forward.
  struct Pointers {
    const uint8_t *w13_codes = nullptr, *w13_scales = nullptr, *w2_codes = nullptr, *w2_scales = nullptr;
  };
  static DeviceExperts view(const MoeConfig& config, ExpertParallel ep, int layer, int device, Pointers pointers);

  DeviceExperts(DeviceExperts&&) noexcept;
  DeviceExperts& operator=(DeviceExperts&&) noexcept;
  ~DeviceExperts();

  // Copies back and undoes the layout (from_kernel_layout): the uploaded RankExperts' tensors.
  RankExperts download() const;

  const MoeConfig& config() const;
  ExpertParallel ep() const;
  int layer() const;
  int num_local() const;
  int first_expert() const;
  int device() const;
  int64_t bytes() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit DeviceExperts(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class GemmKernel { Auto, MmaSync, Wgmma };

struct PlanOptions {
  MoeConfig config;
  int max_tokens = 4096;  // at most 2^32 / (top_k max(H, I) / 8): 599,186 for Kimi-K3
  Mode mode = Mode::A16;
  // The gated activation and its parameters; unset, the config's (hidden_act, activation_*).
  std::optional<Activation> activation;
  std::optional<ActivationParams> activation_params;
  ExpertParallel ep;
  int device = 0;
  // Tuning overrides (0: the heuristic's choice, src/runtime/heuristics.h): how many ranges K of
  // GEMM1 / GEMM2 is split into, clamped to [1, min(K/128, 16)] (GEMM1) and [1, min(K/128, 8)]
  // (GEMM2).
  int gemm1_splits = 0;
  int gemm2_splits = 0;
  // Weight rows per work unit of GEMM1 / GEMM2 on the mma.sync kernel's 8- and 16-token tiles: 256,
  // or 128 (twice the units, K streamed in chunks of 256: needs K a multiple of 256, else 256 is
  // kept); other tiles always take 256. The split overrides' upper bound is then K/256.
  int gemm1_unit_rows = 0;
  int gemm2_unit_rows = 0;
  // The expert GEMMs' kernel and token tile (Auto / 0: the heuristic's). mma.sync takes tiles of
  // 8, 16, 24 or 32 tokens; wgmma 32, 64, 96 or 128 and keeps K whole (the split overrides do not
  // apply to it). A tile alone picks the kernel that has it (32: mma.sync).
  GemmKernel gemm_kernel = GemmKernel::Auto;
  int token_tile = 0;
};

// Tensors of one forward. Shapes: T tokens, H hidden, K top-k, E global experts.
struct ForwardArgs {
  // x: [T, H] bf16. In mode Mxfp8, x may instead be pre-quantized: [T, H] uint8 E4M3 codes (the
  // PyTorch binding hands float8_e4m3fn tensors over as such) with x_scales [T, H/128] int32 (four
  // E8M0 bytes per int32, group g at byte g mod 4); x_scales only then.
  const DLTensor* x = nullptr;
  const DLTensor* x_scales = nullptr;
  // Routing, either given: topk_ids [T, K] int32 global ids (-1 allowed) + topk_weights [T, K] fp32,
  const DLTensor* topk_ids = nullptr;
  const DLTensor* topk_weights = nullptr;
  // or computed here from router_logits [T, E] fp32 + router_bias [E] fp32 (then topk_ids and
  // topk_weights, if given, receive the routing).
  const DLTensor* router_logits = nullptr;
  const DLTensor* router_bias = nullptr;
  DLTensor* out = nullptr;  // [T, H] bf16
  // Optional: device memory of kForwardStages StageTimes, indexed by ForwardStage, zeroed before
  // the first forward that gets it; each forward's kernels raise the fields (stage_times.h).
  StageTimes* stage_times = nullptr;
};

class MoePlan {
 public:
  // Validates the options, checks the device (compute capability 9.0 needed), picks kernels and
  // allocates the workspace for max_tokens (none when max_tokens is 0: then every forward needs
  // a caller workspace). Throws k3moe::Error.
  static MoePlan create(const PlanOptions& options);

  MoePlan(MoePlan&&) noexcept;
  MoePlan& operator=(MoePlan&&) noexcept;
  ~MoePlan();

  // Enqueues the forward on `stream`. Throws k3moe::Error (before enqueueing anything) on a
  // tensor of the wrong dtype, shape, device or layout, naming it with expected and actual, or a
  // stream of another device. Tensors are taken at their word (DLPack holds no allocation size).
  // `workspace`: caller-provided device memory of at least workspace_bytes(T) bytes, 256-byte
  // aligned (e.g. from a framework's allocator; checked against its allocation's end where the
  // driver knows it); nullptr uses the plan's own (sized for max_tokens at creation).
  void forward(const DeviceExperts& experts, const ForwardArgs& args, cudaStream_t stream,
               void* workspace = nullptr) const;

  // The routing stage alone: logits [T, E] fp32, bias [E] fp32 -> ids [T, K] int32, weights fp32.
  void route(const DLTensor& logits, const DLTensor& bias, DLTensor& ids, DLTensor& weights,
             cudaStream_t stream) const;

  // MXFP8 quantization alone (the contract's rule): x [T, H] bf16 -> codes [T, H] uint8,
  // scales [T, H/128] int32.
  void quantize_mxfp8(const DLTensor& x, DLTensor& codes, DLTensor& scales, cudaStream_t stream) const;

  const PlanOptions& options() const;  // as given, with the activation and its parameters filled in
  // The most tokens one forward takes with a caller workspace (32-bit row offsets in the kernels).
  int64_t max_forward_tokens() const;
  int64_t workspace_bytes() const;  // the plan's own workspace (for max_tokens)
  int64_t workspace_bytes(int tokens) const;
  // The kernels this plan runs for T tokens, one line each (the heuristic's choice).
  std::string describe(int tokens) const;

 private:
  struct Impl;
  explicit MoePlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether a GPU this library can run on is present (for tests and tools that skip without one).
bool hopper_gpu_available(std::string* why_not = nullptr);

}  // namespace k3moe
