// The kernel layout of MXFP4 expert weights: what DeviceExperts::upload writes and expert_gemm.cu
// reads. Defined once here (host and device), tested by round trip.
//
// A weight matrix W [N, K] (N output rows, K the reduction) is cut into blocks of 16 rows x 64 k.
// Blocks are stored by groups of 16 row blocks (the 256 rows a GEMM unit owns; the last group may
// be smaller), then by chunk of 2 k-blocks (128 of K), then row block, then k-block: the blocks
// one unit needs for one chunk are one contiguous run, which a single bulk copy moves into a
// pipeline stage in the order the warps read it (block_index).
//
// Codes: 512 bytes per block, 16 per lane. They are exactly the lane's A fragments of the four
// m16n8k16 mma steps over the block's 64 k (bf16 A fragment of lane t: g = t/4, c = 2 (t%4);
// a0,a1 = (row g, k c, c+1); a2,a3 = (row g+8, k c, c+1); a4,a5 = (row g, k c+8, c+9);
// a6,a7 = (row g+8, k c+8, c+9)). Word kk (bytes 4kk..4kk+3) of the lane holds step kk's eight
// codes, i.e. the four register pairs p = (a_2p, a_2p+1), with the 32 code bits placed so that
// few instructions widen each pair to bf16x2 (value * 2^-126: magnitude bits m0, e0, e1 on bf16
// bits 6, 7, 8 and the sign on bit 15; the odd element 16 bits higher), M = 0x81C081C0:
//   pair 0: in place                    w & M
//   pair 1: 6 bits lower                (w << 6) & M
//   pair 2: rotated 4 bits higher       rotl(w, 28) & M
//   pair 3: the 8 bits left             ((w << 2) & 0x80C080C0) | ((w >> 6) & 0x01000100)
// (no placement widens all four pairs with one shift each: a search over shifts and rotations
// finds 1 + 2 + 2 + 4 instructions the fewest).
// Scales: 32 bytes per block, 4 per row-group g = t/4 at bytes 4g..4g+3:
// (row g, k-group 0), (row g+8, k-group 0), (row g, k-group 1), (row g+8, k-group 1).
// Each byte holds the bf16 biased exponent of 2^(s-1) (= s + 126), the multiplier that turns the
// widened code (value * 2^-126) into value * 2^(s-127). s = 255 (NaN) stays 255, which widens to
// +Inf; the upload stores such a group's codes as zeros, so its weights are 0 * Inf = NaN. That
// needs s <= 128 (group scales up to 2): upload rejects 129..254.
//
// W13 rows are reordered so that a row block holds 8 gate rows then the 8 up rows of the same
// outputs: kernel row r is gate row j (r%16 < 8) or up row I + j, with j = 8 (r/16) + r%8. An
// mma tile then has h_gate and h_up of one output in the same lane (c0 with c2, c1 with c3).
#pragma once

#include <cstdint>

#include "k3moe/formats.h"

namespace k3moe::layout {

inline constexpr int kBlockRows = 16;
inline constexpr int kBlockK = 64;
inline constexpr int kBlockCodeBytes = kBlockRows * kBlockK / 2;  // 512
inline constexpr int kBlockScaleBytes = kBlockRows * kBlockK / 32;  // 32
inline constexpr int kGroupRowBlocks = 16;  // 256 rows
inline constexpr int kChunkBlocks = 2;      // 128 of K; K must be a multiple of 128
inline constexpr int kChunkK = kBlockK * kChunkBlocks;  // K must be a multiple of this
inline constexpr uint8_t kMaxScale = 128;  // largest E8M0 byte the bf16 multiplier can hold
inline constexpr uint32_t kWidenMask = 0x81C081C0u;      // bf16 bits 6..8 and 15 of both halves
inline constexpr uint32_t kWidenMaskShl2 = 0x80C080C0u;  // pair 3: m0, e0 and sign from w << 2
inline constexpr uint32_t kWidenMaskShr6 = 0x01000100u;  // pair 3: e1 from w >> 6

// W13: kernel row -> checkpoint row (rows [0, I) = w1 gate, [I, 2I) = w3 up).
K3MOE_HD constexpr int w13_checkpoint_row(int kernel_row, int intermediate) {
  const int j = 8 * (kernel_row / 16) + kernel_row % 8;
  return (kernel_row % 16) < 8 ? j : intermediate + j;
}

// Row blocks in row group `group` of a matrix with N rows.
K3MOE_HD constexpr int group_row_blocks(int group, int N) {
  const int rest = N / kBlockRows - group * kGroupRowBlocks;
  return rest < kGroupRowBlocks ? rest : kGroupRowBlocks;
}

// Index of block (nb, kb) among the matrix's blocks.
K3MOE_HD constexpr int64_t block_index(int nb, int kb, int N, int K) {
  const int group = nb / kGroupRowBlocks;
  return int64_t(group) * kGroupRowBlocks * (K / kBlockK) +
         int64_t(kb / kChunkBlocks) * group_row_blocks(group, N) * kChunkBlocks + (nb % kGroupRowBlocks) * kChunkBlocks +
         kb % kChunkBlocks;
}

// Where the 4 bits of element (n, k)'s E2M1 code (bit 0 = m0, 1 = e0, 2 = e1, 3 = sign) are stored:
// the byte offset of its 32-bit word (little-endian) in the matrix's code bytes, and each bit's
// position in that word.
struct CodeBits {
  int64_t word_byte;
  int bit[4];
};

K3MOE_HD constexpr CodeBits code_bits(int n, int k, int N, int K) {
  const int64_t block = block_index(n / kBlockRows, k / kBlockK, N, K);
  const int r = n % kBlockRows, c = k % kBlockK;
  const int kk = c / 16, cc = c % 16;
  const int lane = (r % 8) * 4 + (cc % 8) / 2;
  const int pair = (cc / 8) * 2 + r / 8;
  const int half = cc % 2;  // the odd k of a pair sits 16 bits higher
  constexpr int kTarget[4] = {6, 7, 8, 15};
  // Left shift (or rotation, pair 2) of the stored word that lands each bit on its target.
  constexpr int kShift[4][4] = {{0, 0, 0, 0}, {6, 6, 6, 6}, {28, 28, 28, 28}, {2, 2, -6, 2}};
  CodeBits out{block * kBlockCodeBytes + lane * 16 + kk * 4, {0, 0, 0, 0}};
  for (int j = 0; j < 4; ++j) out.bit[j] = (kTarget[j] + 16 * half - kShift[pair][j] + 32) % 32;
  return out;
}

K3MOE_HD constexpr int64_t scale_position(int n, int k, int N, int K) {
  const int64_t block = block_index(n / kBlockRows, k / kBlockK, N, K);
  const int r = n % kBlockRows, group = (k % kBlockK) / 32;
  return block * kBlockScaleBytes + (r % 8) * 4 + group * 2 + r / 8;
}

// The four bf16x2 A registers of one 16-k step, widened from the step's code word by the placement
// above, each value * 2^-126. The same code on the host (tests) and in the kernels (the rotation
// compiles to one funnel shift).
K3MOE_HD constexpr void widen_codes(uint32_t w, uint32_t (&pairs)[4]) {
  pairs[0] = w & kWidenMask;
  pairs[1] = (w << 6) & kWidenMask;
  pairs[2] = ((w << 28) | (w >> 4)) & kWidenMask;
  pairs[3] = ((w << 2) & kWidenMaskShl2) | ((w >> 6) & kWidenMaskShr6);
}

// The bf16 multipliers 2^(s-1) of one lane's block, from its scale word (bytes s + 126 of (row g,
// k-group 0), (row g + 8, 0), (row g, 1), (row g + 8, 1)): each byte moved onto a bf16 exponent
// field, row g's two k-groups in the halves of `row_g`, row g + 8's in `row_g8` (4 operations; the
// multiplies pick their half). The NaN scale's byte 255 gives +Inf, and its group's codes are zero
// (upload), so every weight of the group is 0 * Inf = NaN.
struct BlockMultipliers {
  uint32_t row_g, row_g8;
};

K3MOE_HD constexpr BlockMultipliers scale_multipliers(uint32_t scale_word) {
  return {(scale_word & 0x00FF00FFu) << 7, (scale_word >> 1) & 0x7F807F80u};
}

// E8M0 byte -> stored multiplier exponent, and back.
K3MOE_HD constexpr uint8_t scale_to_kernel(uint8_t s) { return s == kE8M0NaN ? kE8M0NaN : uint8_t(s + 126); }
K3MOE_HD constexpr uint8_t scale_from_kernel(uint8_t e) { return e == kE8M0NaN ? kE8M0NaN : uint8_t(e - 126); }

}  // namespace k3moe::layout
