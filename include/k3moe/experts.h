// One expert-parallel rank's routed experts of one layer, on the host, in the checkpoint's layout:
// W13 = [W1 (gate); W3 (up)] as contiguous halves, MXFP4 packed along K with one E8M0 scale per
// 32 values of a row. This is what the loader and the synthetic generator produce, what the
// reference computes on, and what the device upload turns into the kernel's layout.
#pragma once

#include <cstdint>
#include <vector>

#include "k3moe/config.h"
#include "k3moe/formats.h"

namespace k3moe {

struct RankExperts {
  MoeConfig config;
  int layer = 0;
  ExpertParallel ep;
  int num_local = 0;     // E / P
  int first_expert = 0;  // global id of local expert 0

  std::vector<uint8_t> w13_packed;  // [num_local, 2I, H/2]
  std::vector<uint8_t> w13_scale;   // [num_local, 2I, H/32]
  std::vector<uint8_t> w2_packed;   // [num_local, H, I/2]
  std::vector<uint8_t> w2_scale;    // [num_local, H, I/32]

  uint64_t bytes_read = 0;  // bytes the loader copied out of checkpoint files (0 if generated)

  // Allocates the four buffers for `config`, `ep` (zero-filled).
  static RankExperts allocate(const MoeConfig& config, int layer, ExpertParallel ep);
  // Throws k3moe::Error naming the buffer when a size does not match the config.
  void validate() const;

  int64_t w13_row_bytes() const { return config.hidden / 2; }
  int64_t w2_row_bytes() const { return config.intermediate / 2; }

  // Dequantized weights (exact in double): W13[e][n][k], n < 2I, k < H; W2[e][n][k], n < H, k < I.
  double w13(int local_expert, int n, int k) const {
    const int64_t row = int64_t(local_expert) * 2 * config.intermediate + n;
    const uint8_t byte = w13_packed[row * (config.hidden / 2) + k / 2];
    const uint8_t s = w13_scale[row * (config.hidden / 32) + k / 32];
    return double(e2m1_to_float(e2m1_nibble(byte, k))) * double(e8m0_to_float(s));
  }
  double w2(int local_expert, int n, int k) const {
    const int64_t row = int64_t(local_expert) * config.hidden + n;
    const uint8_t byte = w2_packed[row * (config.intermediate / 2) + k / 2];
    const uint8_t s = w2_scale[row * (config.intermediate / 32) + k / 32];
    return double(e2m1_to_float(e2m1_nibble(byte, k))) * double(e8m0_to_float(s));
  }
};

}  // namespace k3moe
