// Host quantizers built on formats.h. Scale rules:
//   MXFP4 (weights): per 32 consecutive values of a row, E8M0 scale by the round-up rule
//     (mx_scale_round_up with elem_max 6: the smallest 2^e with amax <= 6 * 2^e), codes
//     float_to_e2m1(x / 2^e). A group holding NaN or Inf gets the NaN scale (255), codes 0.
//   MXFP8 (activations): the contract's rule, per token and 32 consecutive values: E8M0 by the
//     round-up rule with elem_max 448, codes float_to_e4m3(x / 2^e); a non-finite group gets the
//     NaN scale, and x / NaN makes every code of it the E4M3 NaN 0x7F.
//     Scales are bytes [rows, cols/32]; read as int32 on a little-endian machine they ARE the
//     packed [rows, cols/128] int32 form (group g at byte g mod 4).
//   NVFP4 (weights): per 16 values, UE4M3 block scale and one fp32 global scale per tensor:
//     global = amax(tensor) / (448 * 6) (1 when the tensor is all zeros; at least the smallest
//     float, which a tensor of values below ~4e-42 would otherwise underflow),
//     block = float_to_ue4m3(amax(block) / (6 * global)), codes float_to_e2m1(x / (block * global)).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace k3moe {

struct Mxfp4Matrix {
  int rows = 0, cols = 0;
  std::vector<uint8_t> packed;  // [rows, cols/2], low nibble = even column
  std::vector<uint8_t> scales;  // [rows, cols/32] E8M0
  double at(int r, int c) const;
};

struct Mxfp8Matrix {
  int rows = 0, cols = 0;
  std::vector<uint8_t> codes;   // [rows, cols] E4M3
  std::vector<uint8_t> scales;  // [rows, cols/32] E8M0 (== packed int32 [rows, cols/128])
  double at(int r, int c) const;
};

struct Nvfp4Matrix {
  int rows = 0, cols = 0;
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/16] UE4M3
  float global_scale = 1.0f;
  double at(int r, int c) const;
};

// cols must be a multiple of 32 (MX) or 16 (NVFP4); throws k3moe::Error otherwise.
Mxfp4Matrix quantize_mxfp4(std::span<const float> values, int rows, int cols);
Mxfp8Matrix quantize_mxfp8(std::span<const float> values, int rows, int cols);
Nvfp4Matrix quantize_nvfp4(std::span<const float> values, int rows, int cols);

// One MX group in place: writes `n` codes, returns the E8M0 scale. Used by the matrix quantizers
// and by the synthetic generator.
uint8_t quantize_mxfp4_group(const float* values, int n, uint8_t* codes);
uint8_t quantize_mxfp8_group(const float* values, int n, uint8_t* codes);

}  // namespace k3moe
