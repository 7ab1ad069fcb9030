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
  // Let GEMM2 launch before this stage waits for GEMM1, and run activation_ctas_beside_gemm1(splits)
  // CTAs per SM. It pays only where they fit beside GEMM1's on every SM
  // (KernelChoice::activation_beside_gemm1).
  bool release_early = false;
  StageTimes* times = nullptr;  // optional record of this launch (stage_marks.cuh)
};

void launch_activation(const ActivationArgs& args, cudaStream_t stream);
// Throws unless the stage's 32-bit indices hold max_rows x I / 4 items (what launch_activation
// checks; MoePlan::forward checks it before it enqueues anything).
void check_activation_rows(int64_t max_rows, int intermediate, int sm_count);
// Released early: the CTAs per SM the stage runs for `splits` (2 of the 2-split kernel's 40
// registers, 1 of the other's 71).
int activation_ctas_beside_gemm1(int splits);
// The resources (registers, shared memory) of the kernel that runs `splits` released early (beside
// GEMM1: the one that keeps its input in L2), for the test that activation_ctas_beside_gemm1(splits)
// of its CTAs fit beside GEMM1's.
cudaFuncAttributes activation_kernel_attributes(int splits);

}  // namespace k3moe::kernels
