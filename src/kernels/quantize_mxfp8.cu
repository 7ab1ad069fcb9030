// The MXFP8 rounding of x as a kernel of its own (the per-thread work: mxfp8_rounding.cuh).
#include "kernels/quantize_mxfp8.cuh"

#include "kernels/launch.cuh"
#include "kernels/mxfp8_rounding.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) mxfp8_rounding_kernel(Mxfp8Rounding job) {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  run_mxfp8_rounding(job, int64_t(blockIdx.x) * kThreads + threadIdx.x);
}

void launch(const Mxfp8Rounding& job, cudaStream_t stream) {
  if (job.items == 0) return;
  launch_dependent(mxfp8_rounding_kernel, dim3(unsigned((job.items + kThreads - 1) / kThreads)), kThreads, 0, stream,
                   job);
}

}  // namespace

Mxfp8Rounding quantizing(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out) {
  Mxfp8Rounding job;
  job.x = x;
  job.out = out;
  job.items = int64_t(tokens) * hidden / kMxPiece;
  return job;
}

Mxfp8Rounding dequantizing(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden, uint16_t* x_dequant) {
  Mxfp8Rounding job;
  job.in_codes = codes;
  job.in_scales = scales;
  job.out.x_dequant = x_dequant;
  job.items = int64_t(tokens) * hidden / kMxGroup;
  return job;
}

void launch_quantize_mxfp8(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out, cudaStream_t stream) {
  launch(quantizing(x, tokens, hidden, out), stream);
}

void launch_dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden,
                             uint16_t* x_dequant, cudaStream_t stream) {
  launch(dequantizing(codes, scales, tokens, hidden, x_dequant), stream);
}

}  // namespace k3moe::kernels
