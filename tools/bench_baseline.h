// The in-run baseline of the benchmark (PERF.md): what a user has without an FP4 kernel. The
// experts are dequantized to bf16 once; each forward then gathers each expert's tokens, runs one
// cuBLASLt GEMM per active expert for W13, a separate activation kernel, one cuBLASLt GEMM per
// expert for W2 (bf16 out), and a combine kernel. The host knows the routing (it is given the
// per-expert counts for free), and the whole forward is captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/experts.h"

namespace k3moe::cli {

class BaselineForward {
 public:
  // experts: checkpoint layout; dequantized on the GPU once.
  BaselineForward(const RankExperts& experts, Activation activation, const ActivationParams& params);
  ~BaselineForward();

  // Prepares one input set: x [T, H] bf16 on the device, routing on the host (global ids, fp32
  // weights), out [T, H] bf16 on the device. Returns the set's index. Captures its graph.
  int add_input_set(const uint16_t* x, const std::vector<int32_t>& ids, const std::vector<float>& weights,
                    uint16_t* out, int tokens, cudaStream_t stream);
  void launch(int set, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3moe::cli
