// MXFP8 activations, once per token (not per expert): x [T, H] bf16 -> E4M3 codes [T, H] and E8M0
// scales [T, H/32] (bytes; the same memory is the packed [T, H/128] int32 form), by the contract's
// round-up rule (formats.h: mx_scale_round_up, float_to_e4m3). Both directions (quantizing bf16,
// or dequantizing pre-quantized input) also write x_dequant [T, H] bf16, the exact values the GEMM
// consumes (every E4M3 value times a power of two in range is a bf16 value).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3moe::kernels {

struct Mxfp8Buffers {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  uint16_t* x_dequant = nullptr;  // may be nullptr (quantize only)
};

// The rounding as a job for a kernel's threads: from bf16 x (codes, scales and x_dequant) or from
// pre-quantized codes + scales (x_dequant only). `items` threads each take 8 values to quantize or
// one group of 32 to dequantize (mxfp8_rounding.cuh). The forward runs it on extra blocks of the
// permutation's launch (permute.cuh): it then waits on nothing but what the permutation waits on,
// and the GEMMs wait for one kernel.
struct Mxfp8Rounding {
  const uint16_t* x = nullptr;          // bf16 [T, H]; nullptr: dequantize
  const uint8_t* in_codes = nullptr;    // pre-quantized [T, H]
  const uint8_t* in_scales = nullptr;   // [T, H / 32]
  Mxfp8Buffers out;
  int64_t items = 0;
};
Mxfp8Rounding quantizing(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out);
Mxfp8Rounding dequantizing(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden, uint16_t* x_dequant);

void launch_quantize_mxfp8(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out, cudaStream_t stream);
// Pre-quantized input: codes + scales -> x_dequant.
void launch_dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden,
                             uint16_t* x_dequant, cudaStream_t stream);

}  // namespace k3moe::kernels
