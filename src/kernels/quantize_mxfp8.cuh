// MXFP8 activations, once per token (not per expert): x [T, H] bf16 -> E4M3 codes [T, H] and E8M0
// scales [T, H/32] (bytes; the same memory is the packed [T, H/128] int32 form), by the contract's
// round-up rule (formats.h: mx_scale_round_up, float_to_e4m3). Both kernels also write x_dequant
// [T, H] bf16, the exact values the GEMM consumes (every E4M3 value times a power of two in range
// is a bf16 value).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3moe::kernels {

struct Mxfp8Buffers {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  uint16_t* x_dequant = nullptr;  // may be nullptr (quantize only)
};

// overlap_previous: the kernel runs beside the previous kernel in the stream (programmatic
// dependent launch) and waits for it only before exiting, so that its completion still implies the
// previous kernel's. Only for a previous kernel that neither writes what this one reads nor reads
// what it writes, and that itself waited for everything before it (the forward: the permutation).
void launch_quantize_mxfp8(const uint16_t* x, int tokens, int hidden, const Mxfp8Buffers& out, cudaStream_t stream,
                           bool overlap_previous = false);
// Pre-quantized input: codes + scales -> x_dequant.
void launch_dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int tokens, int hidden,
                             uint16_t* x_dequant, cudaStream_t stream, bool overlap_previous = false);

}  // namespace k3moe::kernels
