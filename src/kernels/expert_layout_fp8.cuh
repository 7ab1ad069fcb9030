// The code layout an fp8 (E4M3) expert GEMM will read: MXFP4 weights placed so that each lane
// widens its wgmma m64nNk32 A registers to E4M3 with the group's E8M0 scale folded in, exactly.
// No kernel on main reads it: the fp8 GEMM1 built on it (branch fp8-gemm1-draft) was slower than
// the bf16 path and Hopper's fp8 MMA is not fp32-exact per k32 (bench/NOTES.md, Session 5); the
// layout stays here, specified and tested, for a later fp8 path.
//
// Blocks, row groups and chunks are those of expert_layout.cuh (16 rows x 64 k, 512 code bytes,
// 16 per lane, block_index); only the bits inside a lane's 16 bytes differ. The E4M3 A fragment
// of a warp (mma.m16n8k32's for 8-bit types) gives lane t (g = t/4, j = t%4), per 32-k step:
//   r0 = row g,     k 4j .. 4j+3;   r1 = row g + 8, k 4j .. 4j+3;
//   r2 = row g,     k 16+4j .. +3;  r3 = row g + 8, k 16+4j .. +3   (byte i = k + i).
// Word 2s + h of the lane (32-k step s of the block, h = 0: r0 and r1, h = 1: r2 and r3) holds
// two registers' codes: byte i of the low register (r0 / r2) as magnitude bits (m, e0, e1) at
// 4i .. 4i+2 and its sign at 8i + 7; of the high register (r1 / r3) the magnitude at 16 + 4i ..
// 16 + 4i + 2 and the sign at 8i + 3. The magnitude bits are the E2M1 code's low three bits, so
// they select byte `code & 7` of a table of E4M3 magnitudes (PRMT), and the signs land on
// 0x80808080 as stored (low register) or shifted left by 4 (high register).
//
// The table of a row and MX group holds the E4M3 codes of the eight E2M1 magnitudes times 2^d,
// d = the group's scale exponent minus the matrix's base exponent, which the kernel applies in
// fp32 (pack_matrix below).
// Every such product is exact in E4M3 for d in [kFoldMin, kFoldMax] (tests/formats: E4M3 holds
// E2M1 x 2^d exactly for d in [-8, 6]); outside, the weights cannot take this path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "k3moe/formats.h"
#include "kernels/expert_layout.cuh"

namespace k3moe::layout_fp8 {

inline constexpr int kFoldMin = -8, kFoldMax = 6;
inline constexpr int kTables = kFoldMax - kFoldMin + 2;  // one per d, then the NaN group's
inline constexpr uint8_t kNaNTable = kTables - 1;
inline constexpr uint32_t kMagnitudeMask = 0x7777u;  // PRMT selectors: bit 3 of each must be 0
inline constexpr uint32_t kSignMask = 0x80808080u;

// Where element (n, k)'s code bits (0 = m, 1 = e0, 2 = e1, 3 = sign) are stored.
K3MOE_HD constexpr layout::CodeBits code_bits(int n, int k, int N, int K) {
  const int64_t block = layout::block_index(n / layout::kBlockRows, k / layout::kBlockK, N, K);
  const int r = n % layout::kBlockRows, c = k % layout::kBlockK;
  const int step = c / 32, cc = c % 32;
  const int lane = (r % 8) * 4 + (cc % 16) / 4, byte = cc % 4, h = cc / 16;
  const bool high = r >= 8;  // r1 / r3
  layout::CodeBits out{block * layout::kBlockCodeBytes + lane * 16 + (2 * step + h) * 4, {0, 0, 0, 0}};
  for (int j = 0; j < 3; ++j) out.bit[j] = (high ? 16 : 0) + 4 * byte + j;
  out.bit[3] = 8 * byte + (high ? 3 : 7);
  return out;
}

// Byte i: the E4M3 code of E2M1 magnitude i (0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^d; exact for d in
// [kFoldMin, kFoldMax].
K3MOE_HD constexpr uint64_t magnitude_table(int d) {
  uint64_t table = 0;
  for (int i = 0; i < 8; ++i) {
    float v = e2m1_to_float(uint8_t(i));
    for (int s = 0; s < d; ++s) v *= 2.0f;
    for (int s = 0; s > d; --s) v *= 0.5f;
    table |= uint64_t(float_to_e4m3(v)) << (8 * i);
  }
  return table;
}

// The table of index `t` (d = t + kFoldMin; kNaNTable: every byte the E4M3 NaN, so that the
// group's weights are NaN like its E8M0 scale, whatever the codes).
K3MOE_HD constexpr uint64_t table_of_index(int t) {
  return t == kNaNTable ? 0x7F7F7F7F7F7F7F7Full : magnitude_table(t + kFoldMin);
}

// Byte selection as PRMT does it in its default mode for selectors 0..7 (bit 3 clear).
K3MOE_HD constexpr uint32_t select_bytes(uint64_t table, uint32_t selectors) {
#ifdef __CUDA_ARCH__
  return __byte_perm(uint32_t(table), uint32_t(table >> 32), selectors);
#else
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= uint32_t((table >> (8 * ((selectors >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return out;
#endif
}

// The E4M3 A registers of a stored word: the low (r0 / r2) and the high (r1 / r3) register, with the
// tables of their rows.
K3MOE_HD constexpr uint32_t widen_low(uint32_t word, uint64_t table) {
  return select_bytes(table, word & kMagnitudeMask) | (word & kSignMask);
}
K3MOE_HD constexpr uint32_t widen_high(uint32_t word, uint64_t table) {
  return select_bytes(table, (word >> 16) & kMagnitudeMask) | ((word << 4) & kSignMask);
}

// One weight matrix [N, K] in this layout (host side, for the upload): the codes, per (row, MX
// group) the index of its table at layout::scale_position, and the matrix's base exponent: weight
// (n, k) = table value x 2^base exactly. `code(n, k)` gives the E2M1 code, `scale(n, group)` the
// E8M0 byte, both in kernel row order. The base puts the largest scale of a group with a non-zero
// code at d = kFoldMax; `foldable` is false when another such group then falls below kFoldMin
// (more than 14 binades apart): those weights cannot take this path. All-zero groups take d = 0.
struct Fp8Matrix {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> tables;
  int base = 0;
  bool foldable = true;
};

template <class Code, class Scale>
Fp8Matrix pack_matrix(int N, int K, Code code, Scale scale) {
  Fp8Matrix m;
  m.codes.assign(size_t(N) * K / 2, 0);
  m.tables.assign(size_t(N) * K / 32, 0);
  auto has_value = [&](int n, int group) {
    for (int k = group * 32; k < group * 32 + 32; ++k)
      if ((code(n, k) & 7) != 0) return true;
    return false;
  };
  int top = -1000, bottom = 1000;  // unbiased exponents of the groups with a non-zero code
  for (int n = 0; n < N; ++n)
    for (int group = 0; group < K / 32; ++group) {
      const uint8_t s = scale(n, group);
      if (s == kE8M0NaN || !has_value(n, group)) continue;
      top = std::max(top, int(s) - 127);
      bottom = std::min(bottom, int(s) - 127);
    }
  m.base = top == -1000 ? 0 : top - kFoldMax;
  m.foldable = top == -1000 || bottom - m.base >= kFoldMin;
  for (int n = 0; n < N; ++n)
    for (int group = 0; group < K / 32; ++group) {
      const uint8_t s = scale(n, group);
      const int d = int(s) - 127 - m.base;
      uint8_t t = uint8_t(-kFoldMin);  // d = 0
      if (s == kE8M0NaN) t = kNaNTable;
      else if (has_value(n, group) && d >= kFoldMin && d <= kFoldMax) t = uint8_t(d - kFoldMin);
      m.tables[layout::scale_position(n, group * 32, N, K)] = t;
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const layout::CodeBits p = code_bits(n, k, N, K);
      const uint8_t c = code(n, k);
      for (int j = 0; j < 4; ++j)
        if (c >> j & 1) m.codes[size_t(p.word_byte) + p.bit[j] / 8] |= uint8_t(1u << (p.bit[j] % 8));
    }
  return m;
}

}  // namespace k3moe::layout_fp8
