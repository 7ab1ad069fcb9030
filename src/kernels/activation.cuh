// The gated activation as its own stage, for GEMM1 split over K: sums the splits' fp32 partial
// h = [gate | up] rows in split order, applies the activation, and rounds to the mode's format
// (bf16, or MXFP8 per 32 outputs stored widened to bf16), exactly as GEMM1's fused epilogue does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/config.h"
#include "k3moe/stage_times.h"

namespace k3moe::kernels {

inline constexpr int kMaxActivationSplits = 16;

struct ActivationArgs {
  const float* h = nullptr;  // [splits][rows, 2I]
  int64_t split_stride = 0;  // elements between splits
  int splits = 1;
  const int32_t* expert_offset = nullptr;  // rows = expert_offset[num_local]
  int num_local = 0;
  int max_rows = 0;  // sizes the grid, with sm_count
  int sm_count = 0;
  int intermediate = 0;
  uint16_t* inter = nullptr;  // [rows, I] bf16
  Mode mode = Mode::A16;
  Activation activation = Activation::Situ;
  ActivationParams params;
  // Let GEMM2 launch before this stage waits for GEMM1, and run one CTA per SM. It pays only where
  // that CTA fits beside GEMM1's on every SM (KernelChoice::activation_beside_gemm1).
  bool release_early = false;
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

void launch_activation(const ActivationArgs& args, cudaStream_t stream);
// The kernel's resources (registers, shared memory), for the test that it fits beside GEMM1's CTAs.
cudaFuncAttributes activation_kernel_attributes();

}  // namespace k3moe::kernels
