// Grouped expert GEMMs: MXFP4 weights x bf16 activations on mma.sync (m16n8k16, fp32 accumulate).
//
// Operands are swapped: the weights are the mma's A side (16 rows per m-tile), the tokens its
// 8-wide B side, so one token does not waste a 64-row tile. A CTA owns 256 weight rows (4 warps x
// 4 m-tiles) of one expert and one tile of 8/16/32 of that expert's token rows, and streams K in
// chunks of 128 through a 4-stage cp.async pipeline: per stage the weight blocks (already in
// fragment order, expert_layout.cuh), their scales, and the token rows (gathered by token id for
// GEMM1). Each lane widens its own codes to bf16 in registers with the E8M0 scale folded in by one
// bf16 multiply (exact: a power of two times an E2M1 value), then issues the mma.
//
// Epilogues stage the tile through shared memory and store 16-byte vectors:
//   GEMM1: out j = act(h_gate, h_up) (gate and up of one j sit in one lane by the W13 row order),
//          rounded to bf16 (A16) or to MXFP8 with the group amax taken over the warp's 32 outputs
//          (Mxfp8; the dequantized value is stored as bf16, which holds it exactly);
//   GEMM2: fp32 rows.
#include "kernels/expert_gemm.cuh"

#include <algorithm>

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/expert_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

template <int kNT_>
struct Tile {
  static constexpr int kNT = kNT_;  // mma n-tiles (8 tokens each) per warp
  static constexpr int kTokens = 8 * kNT;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = 4;  // m16 tiles per warp
  static constexpr int kRowBlocks = kWarps * kMTiles;
  static constexpr int kRowsPerCta = 16 * kRowBlocks;  // 256
  static constexpr int kChunkK = 128;
  static constexpr int kChunkBlocks = kChunkK / layout::kBlockK;
  // NOTE: three stages (~60 KB) let three CTAs share an SM at 8 and 16 tokens, where latency
  // hiding needs warps; at 32 tokens the tile is larger and two CTAs with four stages fit.
  static constexpr int kStages = kNT == 4 ? 4 : 3;
  static constexpr int kMinBlocksPerSm = kNT == 4 ? 2 : 3;
  // NOTE: 16 bytes of padding per row keep the 8 rows an ldmatrix reads in distinct banks.
  static constexpr int kActStride = kChunkK + 8;  // bf16 elements
  static constexpr int kCodeBytes = kRowBlocks * kChunkBlocks * layout::kBlockCodeBytes;
  static constexpr int kScaleBytes = kRowBlocks * kChunkBlocks * layout::kBlockScaleBytes;
  static constexpr int kActBytes = kTokens * kActStride * 2;
  static constexpr int kStageBytes = kCodeBytes + kScaleBytes + kActBytes;
  static constexpr int kOutStride1 = kRowsPerCta / 2 + 8;  // GEMM1 staging, bf16 elements
  static constexpr int kOutStride2 = kRowsPerCta + 4;      // GEMM2 staging, fp32 elements
  static constexpr int kSmemBytes = std::max({kStages * kStageBytes, kTokens * kOutStride1 * 2,
                                              kTokens * kOutStride2 * 4});

  static_assert(kChunkK % layout::kBlockK == 0);
  static_assert(kStageBytes % 128 == 0, "stages must stay 16-byte (cp.async) aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one SM");
};

enum class Epilogue { Activation, GateUpRows, Rows };

// The four bf16x2 A registers of one 16-k step, widened from the step's code word (bit placement:
// expert_layout.cuh), each value * 2^-126.
__device__ __forceinline__ void widen_codes(uint32_t w, uint32_t (&pairs)[4]) {
  constexpr uint32_t kMask = 0x81C081C0u;  // bf16 bits 6..8 and 15 of both halves
  pairs[0] = w & kMask;
  pairs[1] = (w << 3) & kMask;
  pairs[2] = (w << 6) & kMask;
  pairs[3] = ((w >> 4) & 0x00400040u) | ((w >> 6) & 0x01800180u) | ((w << 4) & 0x80008000u);
}

// bf16x2 {2^(s-1), 2^(s-1)} from byte `byte` (= s + 126) of a scale word: the byte copied into
// both halves, then moved onto the exponent field. The NaN scale's byte 255 gives +Inf, and its
// group's codes are zero (upload), so every weight of the group is 0 * Inf = NaN.
__device__ __forceinline__ uint32_t scale_multiplier(uint32_t scale_word, int byte) {
  return __byte_perm(scale_word, 0u, 0x4040u | uint32_t(byte) | (uint32_t(byte) << 8)) << 7;
}

// The unit a CTA works on, decoded from its index (see ExpertGemmArgs).
struct Unit {
  int expert, row0, tile_row0, tile_count, chunk_begin, chunk_end, split;
};

template <class T>
__device__ __forceinline__ Unit decode_unit(const ExpertGemmArgs& a, int u, int total_tiles, int num_active) {
  const int tile_g = u % total_tiles, rest = u / total_tiles;
  Unit unit;
  unit.split = rest % a.splits;
  unit.row0 = (rest / a.splits) * T::kRowsPerCta;
  int lo = 0, hi = num_active - 1;  // the active expert whose tiles hold tile_g
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.tile_offset[mid] <= tile_g) lo = mid;
    else hi = mid - 1;
  }
  unit.expert = a.active_experts[lo];
  const int tile = tile_g - a.tile_offset[lo];
  const int begin = a.expert_offset[unit.expert], count = a.expert_offset[unit.expert + 1] - begin;
  unit.tile_row0 = begin + tile * T::kTokens;
  unit.tile_count = min(T::kTokens, count - tile * T::kTokens);
  const int chunks = a.K / T::kChunkK;
  unit.chunk_begin = unit.split * chunks / a.splits;
  unit.chunk_end = (unit.split + 1) * chunks / a.splits;
  return unit;
}

template <class T, Epilogue kEpi>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSm)
    expert_gemm_kernel(ExpertGemmArgs a, GemmOutput out) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_unit;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_blocks = a.N / layout::kBlockRows, k_blocks = a.K / layout::kBlockK;
  // NOTE: the schedule comes from the permutation, which completed before the previous kernel
  // (GEMM1 or the activation) passed its own wait. GEMM2's weights do not depend on GEMM1 either:
  // GEMM2 waits for GEMM1's output only after it started streaming its first unit's weights.
  bool waited = kEpi != Epilogue::Rows;
  if (waited) ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int num_active = *a.num_active;
  const int total_tiles = num_active > 0 ? a.tile_offset[num_active] : 0;
  const int row_blocks = (a.N + T::kRowsPerCta - 1) / T::kRowsPerCta;
  const int num_units = total_tiles * row_blocks * a.splits;

  for (;;) {
    __syncthreads();  // the previous unit is done with s_unit and the staging area
    if (threadIdx.x == 0) s_unit = atomicAdd(a.unit_counter, 1);
    __syncthreads();
    const int u = s_unit;
    if (u >= num_units) break;
    const Unit unit = decode_unit<T>(a, u, total_tiles, num_active);
    const int row0 = unit.row0, nb0 = row0 / layout::kBlockRows;
    const int tile_row0 = unit.tile_row0, tile_count = unit.tile_count;
    const uint8_t* codes = a.codes + int64_t(unit.expert) * n_blocks * k_blocks * layout::kBlockCodeBytes;
    const uint8_t* scales = a.scales + int64_t(unit.expert) * n_blocks * k_blocks * layout::kBlockScaleBytes;

    // Each thread copies the same weight pieces in every chunk, kThreads / kPiecesPerBlockRow row
    // blocks apart: resolve their sources once.
    constexpr int kCodePieces = T::kCodeBytes / 16, kPiecesPerBlockRow = kCodePieces / T::kRowBlocks;
    constexpr int kCodeIters = kCodePieces / T::kThreads;
    static_assert(kCodeIters * T::kThreads == kCodePieces && T::kThreads % kPiecesPerBlockRow == 0);
    const int my_block_row = threadIdx.x / kPiecesPerBlockRow;
    const uint8_t* code_src = codes + int64_t(nb0 + my_block_row) * k_blocks * layout::kBlockCodeBytes +
                              (threadIdx.x % kPiecesPerBlockRow) * 16;
    const int64_t code_step = int64_t(T::kThreads / kPiecesPerBlockRow) * k_blocks * layout::kBlockCodeBytes;
    uint32_t code_valid = 0;
#pragma unroll
    for (int it = 0; it < kCodeIters; ++it)
      code_valid |= uint32_t(nb0 + my_block_row + it * (T::kThreads / kPiecesPerBlockRow) < n_blocks) << it;
    constexpr int kScalePieces = T::kScaleBytes / 16, kScalePiecesPerBlockRow = kScalePieces / T::kRowBlocks;
    static_assert(kScalePieces <= T::kThreads);
    const int scale_block_row = nb0 + int(threadIdx.x) / kScalePiecesPerBlockRow;
    const bool scale_valid = threadIdx.x < kScalePieces && scale_block_row < n_blocks;
    const uint8_t* scale_src = scales + int64_t(scale_block_row) * k_blocks * layout::kBlockScaleBytes +
                               (threadIdx.x % kScalePiecesPerBlockRow) * 16;

    // Each thread copies the same token-row pieces in every chunk: resolve their sources once.
    constexpr int kActPieces = T::kTokens * (T::kChunkK / 8) / T::kThreads;
    static_assert(kActPieces * T::kThreads == T::kTokens * (T::kChunkK / 8));
    const uint16_t* act_src[kActPieces];
    int act_bytes[kActPieces];
#pragma unroll
    for (int i = 0; i < kActPieces; ++i) {
      const int piece = threadIdx.x + i * T::kThreads;
      const int r = piece / (T::kChunkK / 8), col = (piece % (T::kChunkK / 8)) * 8;
      const bool valid = r < tile_count;
      const int64_t src_row = !valid ? 0 : a.row_token ? a.row_token[tile_row0 + r] : tile_row0 + r;
      act_src[i] = a.act + src_row * a.K + col;
      act_bytes[i] = valid ? 16 : 0;
    }

    auto load_weights = [&](int chunk, int stage) {
      uint8_t* s_codes = smem + stage * T::kStageBytes;
      uint8_t* s_scales = s_codes + T::kCodeBytes;
      const int64_t chunk_codes = int64_t(chunk) * T::kChunkBlocks * layout::kBlockCodeBytes;
#pragma unroll
      for (int it = 0; it < kCodeIters; ++it) {
        const bool valid = (code_valid >> it) & 1;
        ptx::cp_async_16(s_codes + (threadIdx.x + it * T::kThreads) * 16,
                         valid ? code_src + it * code_step + chunk_codes : codes, valid ? 16 : 0);
      }
      if (threadIdx.x < kScalePieces)
        ptx::cp_async_16(s_scales + threadIdx.x * 16,
                         scale_valid ? scale_src + int64_t(chunk) * T::kChunkBlocks * layout::kBlockScaleBytes : scales,
                         scale_valid ? 16 : 0);
    };
    auto load_act = [&](int chunk, int stage) {
      uint16_t* s_act = reinterpret_cast<uint16_t*>(smem + stage * T::kStageBytes + T::kCodeBytes + T::kScaleBytes);
#pragma unroll
      for (int i = 0; i < kActPieces; ++i) {
        const int piece = threadIdx.x + i * T::kThreads;
        const int r = piece / (T::kChunkK / 8), col = (piece % (T::kChunkK / 8)) * 8;
        ptx::cp_async_16(s_act + r * T::kActStride + col, act_src[i] + chunk * T::kChunkK, act_bytes[i]);
      }
    };

    float acc[T::kMTiles][T::kNT][4];
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][q][c] = 0.0f;

    auto compute_chunk = [&](int stage) {
      const uint8_t* s_codes = smem + stage * T::kStageBytes;
      const uint8_t* s_scales = s_codes + T::kCodeBytes;
      const uint16_t* s_act = reinterpret_cast<const uint16_t*>(s_scales + T::kScaleBytes);
#pragma unroll
      for (int kb = 0; kb < T::kChunkBlocks; ++kb) {
        uint4 code[T::kMTiles];
        uint32_t mult[T::kMTiles][4];
#pragma unroll
        for (int i = 0; i < T::kMTiles; ++i) {
          const int block = (warp * T::kMTiles + i) * T::kChunkBlocks + kb;
          code[i] = ptx::ld_shared_v4(s_codes + block * layout::kBlockCodeBytes + lane * 16);
          const uint32_t sw = ptx::ld_shared_u32(s_scales + block * layout::kBlockScaleBytes + (lane / 4) * 4);
#pragma unroll
          for (int b = 0; b < 4; ++b) mult[i][b] = scale_multiplier(sw, b);
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t bfrag[T::kNT][2];
#pragma unroll
          for (int q = 0; q < T::kNT; ++q) {
            const uint16_t* row = s_act + (q * 8 + lane % 8) * T::kActStride + kb * layout::kBlockK + kk * 16 +
                                  ((lane / 8) % 2) * 8;
            ptx::ldmatrix_x2(bfrag[q][0], bfrag[q][1], row);
          }
#pragma unroll
          for (int i = 0; i < T::kMTiles; ++i) {
            const uint32_t word = kk == 0 ? code[i].x : kk == 1 ? code[i].y : kk == 2 ? code[i].z : code[i].w;
            const uint32_t m_row = mult[i][(kk / 2) * 2], m_row8 = mult[i][(kk / 2) * 2 + 1];
            uint32_t pairs[4];
            widen_codes(word, pairs);
            const uint32_t afrag[4] = {ptx::mul_bf16x2(pairs[0], m_row), ptx::mul_bf16x2(pairs[1], m_row8),
                                       ptx::mul_bf16x2(pairs[2], m_row), ptx::mul_bf16x2(pairs[3], m_row8)};
#pragma unroll
            for (int q = 0; q < T::kNT; ++q) ptx::mma_bf16_16816(acc[i][q], afrag, bfrag[q][0], bfrag[q][1]);
          }
        }
      }
    };

    const int num_chunks = unit.chunk_end - unit.chunk_begin;
    // The prologue: stage s holds chunk s (one cp.async group each; a group may also carry later
    // stages' weights when they were issued before the wait, which only completes them earlier).
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s)
      if (s < num_chunks) load_weights(unit.chunk_begin + s, s);
    if (!waited) {
      ptx::griddepcontrol_wait();
      waited = true;
    }
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
      if (s < num_chunks) load_act(unit.chunk_begin + s, s);
      ptx::cp_async_commit();
    }
    for (int c = 0; c < num_chunks; ++c) {
      ptx::cp_async_wait<T::kStages - 2>();
      __syncthreads();  // chunk c's stage landed for every thread; the stage refilled below is idle
      const int next = c + T::kStages - 1;
      if (next < num_chunks) {
        load_weights(unit.chunk_begin + next, next % T::kStages);
        load_act(unit.chunk_begin + next, next % T::kStages);
      }
      ptx::cp_async_commit();
      compute_chunk(c % T::kStages);
    }
    ptx::cp_async_wait<0>();
    __syncthreads();  // the epilogue reuses the pipeline's shared memory

    const int g = lane / 4, col0 = 2 * (lane % 4);
    if constexpr (kEpi == Epilogue::Activation) {
      uint16_t* s_out = reinterpret_cast<uint16_t*>(smem);
      float v[T::kMTiles][T::kNT][2];
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            v[i][q][h] = apply_activation<float>(out.activation, out.params, acc[i][q][h], acc[i][q][2 + h]);
      if (out.mode == Mode::Mxfp8) {
        // One MX group = the warp's 32 outputs of one token: 4 m-tiles in the lane x 8 lanes (g).
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t amax_bits = 0;  // |v| as bits: orders like the values, and NaN above Inf
#pragma unroll
            for (int i = 0; i < T::kMTiles; ++i) amax_bits = max(amax_bits, float_bits(v[i][q][h]) & 0x7FFFFFFFu);
#pragma unroll
            for (int offset = 4; offset < 32; offset *= 2)
              amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
            const uint8_t s = mx_scale_round_up(bits_float(amax_bits), kE4M3Max);
#pragma unroll
            for (int i = 0; i < T::kMTiles; ++i)
              v[i][q][h] = e4m3_to_float(float_to_e4m3(scale_down_by_e8m0(v[i][q][h], s))) * e8m0_to_float(s);
          }
      }
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            s_out[(q * 8 + col0 + h) * T::kOutStride1 + warp * 32 + i * 8 + g] = float_to_bf16_bits(v[i][q][h]);
      __syncthreads();
      const int out_cols = a.N / 2, j0 = row0 / 2;
      constexpr int kPiecesPerRow = T::kRowsPerCta / 2 / 8;
      for (int piece = threadIdx.x; piece < T::kTokens * kPiecesPerRow; piece += T::kThreads) {
        const int r = piece / kPiecesPerRow, j = (piece % kPiecesPerRow) * 8;
        if (r < tile_count && j0 + j < out_cols) {
          const uint4 val = *reinterpret_cast<const uint4*>(s_out + r * T::kOutStride1 + j);
          *reinterpret_cast<uint4*>(out.inter + int64_t(tile_row0 + r) * out_cols + j0 + j) = val;
        }
      }
    } else {
      // fp32 rows of this split. GateUpRows: kernel row r of W13 is gate or up of output j
      // (expert_layout.cuh); the staged row holds the CTA's 128 gates, then its 128 ups.
      float* s_out = reinterpret_cast<float*>(smem);
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int n_local = warp * 64 + i * 16 + g + 8 * (c / 2);
            const int column = kEpi == Epilogue::Rows
                                   ? n_local
                                   : (n_local % 16 < 8 ? 0 : T::kRowsPerCta / 2) + (n_local / 16) * 8 + n_local % 8;
            s_out[(q * 8 + col0 + c % 2) * T::kOutStride2 + column] = acc[i][q][c];
          }
      __syncthreads();
      float* dst = out.rows + int64_t(unit.split) * out.split_stride;
      constexpr int kPiecesPerRow = T::kRowsPerCta / 4;
      for (int piece = threadIdx.x; piece < T::kTokens * kPiecesPerRow; piece += T::kThreads) {
        const int r = piece / kPiecesPerRow, n = (piece % kPiecesPerRow) * 4;
        int64_t col = row0 + n;  // Rows: output n of this CTA
        bool inside = row0 + n < a.N;
        if (kEpi == Epilogue::GateUpRows) {  // [gate j | up j], j = row0 / 2 + position in its half
          const int half = n / (T::kRowsPerCta / 2), j = row0 / 2 + n % (T::kRowsPerCta / 2);
          col = int64_t(half) * (a.N / 2) + j;
          inside = j < a.N / 2;
        }
        if (r < tile_count && inside) {
          const float4 val = *reinterpret_cast<const float4*>(s_out + r * T::kOutStride2 + n);
          *reinterpret_cast<float4*>(dst + int64_t(tile_row0 + r) * a.N + col) = val;
        }
      }
    }
  }
}

template <class T, Epilogue kEpi>
void launch(const ExpertGemmArgs& a, const GemmOutput& out, cudaStream_t stream) {
  const int ctas = a.sm_count * T::kMinBlocksPerSm;  // persistent: one wave of resident CTAs
  launch_dependent(expert_gemm_kernel<T, kEpi>, ctas, T::kThreads, T::kSmemBytes, stream, a, out);
}

template <class T>
void configure() {
  for (auto kernel : {expert_gemm_kernel<T, Epilogue::Activation>, expert_gemm_kernel<T, Epilogue::GateUpRows>,
                      expert_gemm_kernel<T, Epilogue::Rows>})
    K3MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
}

template <Epilogue kEpi>
void launch_tile(TokenTile tile, const ExpertGemmArgs& a, const GemmOutput& out, cudaStream_t stream) {
  switch (tile) {
    case TokenTile::T8: return launch<Tile<1>, kEpi>(a, out, stream);
    case TokenTile::T16: return launch<Tile<2>, kEpi>(a, out, stream);
    case TokenTile::T32: return launch<Tile<4>, kEpi>(a, out, stream);
  }
}

}  // namespace

void configure_expert_gemm_kernels() {
  configure<Tile<1>>();
  configure<Tile<2>>();
  configure<Tile<4>>();
}

void launch_expert_gemm1(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, cudaStream_t stream) {
  if (args.num_local == 0) return;
  if (args.splits == 1) launch_tile<Epilogue::Activation>(tile, args, out, stream);
  else launch_tile<Epilogue::GateUpRows>(tile, args, out, stream);
}

void launch_expert_gemm2(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, cudaStream_t stream) {
  if (args.num_local == 0) return;
  launch_tile<Epilogue::Rows>(tile, args, out, stream);
}

int gemm_ctas_per_sm(TokenTile tile) {
  switch (tile) {
    case TokenTile::T8: return Tile<1>::kMinBlocksPerSm;
    case TokenTile::T16: return Tile<2>::kMinBlocksPerSm;
    default: return Tile<4>::kMinBlocksPerSm;
  }
}

}  // namespace k3moe::kernels
