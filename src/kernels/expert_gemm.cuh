// Grouped expert GEMMs on MXFP4 weights (kernel layout: expert_layout.cuh), bf16 activations,
// fp32 accumulation. GEMM1 gathers token rows and applies the gated activation in its epilogue;
// GEMM2 reads the intermediate rows in place and writes fp32 rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3moe/config.h"

namespace k3moe::kernels {

// Token-tile widths a launch can use: 8, 16 or 32 tokens per CTA (1, 2 or 4 mma n-tiles).
enum class TokenTile { T8 = 1, T16 = 2, T32 = 4 };

struct ExpertGemmArgs {
  const uint8_t* codes = nullptr;   // [E_local, N/16, K/64, 512]
  const uint8_t* scales = nullptr;  // [E_local, N/16, K/64, 32]
  const uint16_t* act = nullptr;    // bf16 rows of K: GEMM1 x [T, K]; GEMM2 intermediate [rows, K]
  const int32_t* row_token = nullptr;      // GEMM1: row -> token of x; GEMM2: nullptr (row itself)
  const int32_t* expert_offset = nullptr;  // [E_local + 1] first row of each expert
  int num_local = 0;
  int N = 0;  // output rows of W (GEMM1: 2I, GEMM2: H)
  int K = 0;
  int max_rows_per_expert = 0;  // sizes the grid; more rows are handled by striding
};

struct Gemm1Epilogue {
  uint16_t* inter = nullptr;  // [rows, N/2] bf16
  Mode mode = Mode::A16;      // A16: bf16(act); Mxfp8: MXFP8(act) per 32 outputs, stored widened
  Activation activation = Activation::Situ;
  ActivationParams params;
};

// Raises the kernels' shared-memory limit on the current device; once per device, before launches.
void configure_expert_gemm_kernels();

void launch_expert_gemm1(const ExpertGemmArgs& args, const Gemm1Epilogue& epilogue, TokenTile tile,
                         cudaStream_t stream);
// y [rows, N] fp32.
void launch_expert_gemm2(const ExpertGemmArgs& args, float* y, TokenTile tile, cudaStream_t stream);

// The row-count granularity the kernels need: N a multiple of 16, K of 128.
inline constexpr int kGemmKMultiple = 128;
inline constexpr int kGemmNMultiple = 16;

}  // namespace k3moe::kernels
