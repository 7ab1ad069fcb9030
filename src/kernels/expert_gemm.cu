// Grouped expert GEMMs: MXFP4 weights x bf16 activations on mma.sync (m16n8k16, fp32 accumulate).
//
// Operands are swapped: the weights are the mma's A side (16 rows per m-tile), the tokens its
// 8-wide B side, so one token does not waste a 64-row tile. A unit of work is 256 weight rows
// (4 warps x 4 m-tiles, or 8 x 2) of one expert, one tile of 8/16/32 of that expert's token rows
// and one range of K; persistent CTAs take units from a counter and stream K in chunks of 128
// through one 3- or 4-stage pipeline that runs across units: per stage the weight blocks (already
// in fragment order, expert_layout.cuh) and their scales by two bulk copies, and the token rows
// (gathered by token id for GEMM1) by cp.async. Each lane widens its own codes to bf16 in
// registers with the E8M0 scale folded in by one bf16 multiply (exact: a power of two times an
// E2M1 value), then issues the mma.
//
// Epilogues store from the accumulators:
//   GEMM1: out j = act(h_gate, h_up) (gate and up of one j sit in one lane by the W13 row order),
//          rounded to bf16 (A16) or to MXFP8 with the group amax taken over 32 outputs (one warp,
//          or a warp pair) (Mxfp8; the dequantized value is stored as bf16, which holds it exactly);
//   GEMM2 (and GEMM1 with K split): fp32 rows of the unit's split.
#include "kernels/expert_gemm.cuh"

#include <algorithm>

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/expert_layout.cuh"
#include "kernels/fast_activation.cuh"
#include "kernels/launch.cuh"
#include "kernels/mxfp4_fragments.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

template <int kNT_, int kWarps_>
struct Tile {
  static constexpr int kNT = kNT_;  // mma n-tiles (8 tokens each) per warp
  static constexpr int kTokens = 8 * kNT;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = 16 / kWarps;  // m16 tiles per warp: 256 rows per CTA
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
  static constexpr int kSmemBytes = kStages * kStageBytes;

  static_assert(kChunkK % layout::kBlockK == 0);
  static_assert(kStageBytes % 128 == 0, "stages must stay 16-byte (cp.async) aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one SM");
};

// The unit a CTA works on, decoded from its index and its token tile (see ExpertGemmArgs).
struct Unit {
  int expert, row0, tile_row0, tile_count, chunk_begin, chunk_end, split;
};

template <class T>
__device__ __forceinline__ Unit decode_unit(const ExpertGemmArgs& a, int u, int total_tiles, int4 tile) {
  const int rest = u / total_tiles;
  Unit unit;
  unit.split = rest % a.splits;
  unit.row0 = (rest / a.splits) * T::kRowsPerCta;
  unit.expert = tile.x;
  unit.tile_row0 = tile.y;
  unit.tile_count = tile.z;
  const int chunks = a.K / T::kChunkK;
  unit.chunk_begin = unit.split * chunks / a.splits;
  unit.chunk_end = (unit.split + 1) * chunks / a.splits;
  return unit;
}

// What one thread copies into a pipeline stage for the chunks of one unit: thread 0 the unit's
// weight blocks and scales of the chunk (one contiguous run each, expert_layout.cuh) by two bulk
// copies that complete on the stage's mbarrier; every thread the same token-row pieces by
// cp.async. The sources are resolved once per unit.
template <class T>
struct ChunkCopier {
  static constexpr int kAllActPieces = T::kTokens * (T::kChunkK / 8);
  static constexpr int kActPieces = (kAllActPieces + T::kThreads - 1) / T::kThreads;
  static_assert(kAllActPieces % T::kThreads == 0 || kAllActPieces < T::kThreads);
  static_assert(T::kChunkBlocks == layout::kChunkBlocks && T::kRowBlocks == layout::kGroupRowBlocks,
                "a unit's chunk is one run of the layout");

  const uint8_t* code_src;  // chunk 0 of the unit's row group
  const uint8_t* scale_src;
  uint32_t code_bytes, scale_bytes;  // per chunk: the group's row blocks x 2 k-blocks
  const uint16_t* act_src[kActPieces];
  uint32_t act_valid;  // bit i: token row of piece i exists

  __device__ __forceinline__ void init(const ExpertGemmArgs& a, const Unit& unit) {
    const int n_blocks = a.N / layout::kBlockRows, k_blocks = a.K / layout::kBlockK;
    const int group = unit.row0 / T::kRowsPerCta;
    const int64_t first_block = int64_t(unit.expert) * n_blocks * k_blocks +
                                int64_t(group) * layout::kGroupRowBlocks * k_blocks;
    const int blocks = layout::group_row_blocks(group, a.N) * T::kChunkBlocks;
    code_src = a.codes + first_block * layout::kBlockCodeBytes;
    scale_src = a.scales + first_block * layout::kBlockScaleBytes;
    code_bytes = blocks * layout::kBlockCodeBytes;
    scale_bytes = blocks * layout::kBlockScaleBytes;
    act_valid = 0;
#pragma unroll
    for (int i = 0; i < kActPieces; ++i) {
      const int piece = threadIdx.x + i * T::kThreads;
      const int r = piece / (T::kChunkK / 8), col = (piece % (T::kChunkK / 8)) * 8;
      const bool valid = piece < kAllActPieces && r < unit.tile_count;
      const int64_t src_row = !valid ? 0 : a.row_token ? a.row_token[unit.tile_row0 + r] : unit.tile_row0 + r;
      act_src[i] = a.act + src_row * a.K + col;
      act_valid |= uint32_t(valid) << i;
    }
  }

  // NOTE: row blocks past a partial group keep stale bytes: they only feed weight rows that are
  // never stored.
  __device__ __forceinline__ void weights(uint8_t* stage, int chunk, uint64_t* full) const {
    if (threadIdx.x != 0) return;
    ptx::mbarrier_arrive_expect_tx(full, code_bytes + scale_bytes);
    ptx::cp_async_bulk_g2s(stage, code_src + int64_t(chunk) * code_bytes, code_bytes, full);
    ptx::cp_async_bulk_g2s(stage + T::kCodeBytes, scale_src + int64_t(chunk) * scale_bytes, scale_bytes, full);
  }

  __device__ __forceinline__ void activations(uint8_t* stage, int chunk) const {
    uint16_t* s_act = reinterpret_cast<uint16_t*>(stage + T::kCodeBytes + T::kScaleBytes);
#pragma unroll
    for (int i = 0; i < kActPieces; ++i) {
      const int piece = threadIdx.x + i * T::kThreads;
      if (kAllActPieces % T::kThreads != 0 && piece >= kAllActPieces) break;
      const int r = piece / (T::kChunkK / 8), col = (piece % (T::kChunkK / 8)) * 8;
      ptx::cp_async_16(s_act + r * T::kActStride + col, act_src[i] + chunk * T::kChunkK, (act_valid >> i & 1) ? 16 : 0);
    }
  }
};

template <class T>
using Accumulators = float[T::kMTiles][T::kNT][4];

// One chunk's MMAs from a landed stage: every warp its 4 m-tiles x all token n-tiles.
template <class T>
__device__ __forceinline__ void compute_chunk(const uint8_t* stage, int warp, int lane, Accumulators<T>& acc) {
  const uint8_t* s_codes = stage;
  const uint8_t* s_scales = s_codes + T::kCodeBytes;
  const uint16_t* s_act = reinterpret_cast<const uint16_t*>(s_scales + T::kScaleBytes);
#pragma unroll
  for (int kb = 0; kb < T::kChunkBlocks; ++kb) {
    uint4 code[T::kMTiles];
    BlockMultipliers mult[T::kMTiles];
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
      load_block_fragments(s_codes, s_scales, (warp * T::kMTiles + i) * T::kChunkBlocks + kb, lane, code[i], mult[i]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t bfrag[T::kNT][2];
#pragma unroll
      for (int q = 0; q < T::kNT; ++q) {
        const uint16_t* row =
            s_act + (q * 8 + lane % 8) * T::kActStride + kb * layout::kBlockK + kk * 16 + ((lane / 8) % 2) * 8;
        ptx::ldmatrix_x2(bfrag[q][0], bfrag[q][1], row);
      }
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i) {
        uint32_t afrag[4];
        widen_step(code[i], mult[i], kk, afrag);
#pragma unroll
        for (int q = 0; q < T::kNT; ++q) ptx::mma_bf16_16816(acc[i][q], afrag, bfrag[q][0], bfrag[q][1]);
      }
    }
  }
}

// A unit's result, stored from the accumulators (lane: weight rows g, g + 8 of each m-tile,
// tokens col0, col0 + 1 of each n-tile).
template <class T, Epilogue kEpi>
__device__ __forceinline__ void store_unit(const ExpertGemmArgs& a, const GemmOutput& out, const Unit& unit,
                                           int warp, int lane, Accumulators<T>& acc) {
  const int g = lane / 4, col0 = 2 * (lane % 4);
  if constexpr (kEpi == Epilogue::Activation) {
    // kernel rows g and g + 8 of an m-tile are gate and up of one output (W13 row order).
    float v[T::kMTiles][T::kNT][2];
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          v[i][q][h] = fast_activation(out.activation, out.params, acc[i][q][h], acc[i][q][2 + h]);
    if (out.mode == Mode::Mxfp8) {
      // One MX group = 32 outputs of one token: the m-tiles in the lane x 8 lanes (g), and with two
      // m-tiles per warp, the pair of warps 2w, 2w + 1 (through shared memory).
      constexpr int kWarpOutputs = T::kMTiles * 8;
      static_assert(kWarpOutputs == 32 || kWarpOutputs == 16);
      __shared__ uint32_t s_amax[T::kWarps][T::kTokens];
      uint32_t amax_bits[T::kNT][2];  // |v| as bits: orders like the values, and NaN above Inf
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          amax_bits[q][h] = 0;
#pragma unroll
          for (int i = 0; i < T::kMTiles; ++i)
            amax_bits[q][h] = max(amax_bits[q][h], float_bits(v[i][q][h]) & 0x7FFFFFFFu);
#pragma unroll
          for (int offset = 4; offset < 32; offset *= 2)
            amax_bits[q][h] = max(amax_bits[q][h], __shfl_xor_sync(0xFFFFFFFFu, amax_bits[q][h], offset));
          if (kWarpOutputs == 16 && g == 0) s_amax[warp][q * 8 + col0 + h] = amax_bits[q][h];
        }
      if constexpr (kWarpOutputs == 16) {
        __syncthreads();  // NOTE: every warp stores a unit together; the next unit's store is chunks away
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h) amax_bits[q][h] = max(amax_bits[q][h], s_amax[warp ^ 1][q * 8 + col0 + h]);
      }
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t s = mx_scale_round_up(bits_float(amax_bits[q][h]), kE4M3Max);
#pragma unroll
          for (int i = 0; i < T::kMTiles; ++i)
            v[i][q][h] = round_to_mxfp8(v[i][q][h], s);
        }
    }
    const int out_cols = a.N / 2, j0 = unit.row0 / 2 + warp * T::kMTiles * 8 + g;
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = q * 8 + col0 + h, j = j0 + i * 8;
          if (r < unit.tile_count && j < out_cols)
            out.inter[int64_t(unit.tile_row0 + r) * out_cols + j] = float_to_bf16_bits(v[i][q][h]);
        }
  } else {
    // fp32 rows of this split. GateUpRows: [gate j | up j] in checkpoint order.
    float* dst = out.rows + int64_t(unit.split) * out.split_stride;
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = q * 8 + col0 + c % 2;
          int64_t col = unit.row0 + warp * T::kMTiles * 16 + i * 16 + g + 8 * (c / 2);
          bool inside = col < a.N;
          if constexpr (kEpi == Epilogue::GateUpRows) {
            const int j = unit.row0 / 2 + warp * T::kMTiles * 8 + i * 8 + g;
            col = int64_t(c / 2) * (a.N / 2) + j;
            inside = j < a.N / 2;
          }
          if (r < unit.tile_count && inside) dst[int64_t(unit.tile_row0 + r) * a.N + col] = acc[i][q][c];
        }
  }
}

// Persistent CTAs take units from a counter (so a CTA that starts late, behind the previous
// kernel's tail, takes fewer) and run one cp.async pipeline across all of them: while a CTA
// computes the last chunks of a unit, the stages already fill with the next unit's first chunks,
// and the finished unit is stored straight from registers. Thread 0 takes the next unit's index
// when the copies enter a unit and publishes it one copy step later, so the atomic's round trip
// overlaps a chunk; the copies decode each unit and hand it to the compute through a ring in
// shared memory, at least one barrier ahead.
template <class T, Epilogue kEpi>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSm)
    expert_gemm_kernel(ExpertGemmArgs a, GemmOutput out) {
  static_assert(T::kStages >= 3, "the ring hand-over needs the copies two chunks ahead");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kRing = 8;  // > units between the copy and compute positions
  __shared__ int s_index[kRing];
  __shared__ Unit s_ring[kRing];
  __shared__ __align__(8) uint64_t s_full[T::kStages];  // stage's weights landed (phase per use)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // NOTE: the schedule comes from the permutation, which completed before the previous kernel
  // (GEMM1 or the activation) passed its own wait. GEMM2's weights do not depend on GEMM1 either:
  // GEMM2 waits for GEMM1's output only after it started streaming its first unit's weights.
  if (kEpi != Epilogue::Rows) ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int total_tiles = *a.num_tiles;
  const int row_blocks = (a.N + T::kRowsPerCta - 1) / T::kRowsPerCta;
  const int num_units = total_tiles * row_blocks * a.splits;
  if (threadIdx.x == 0) {
    s_index[0] = atomicAdd(a.unit_counter, 1);
    for (int s = 0; s < T::kStages; ++s) ptx::mbarrier_init(&s_full[s], 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (s_index[0] >= num_units) return;

  // The copy position: this CTA's unit ordinal (ring slot), unit, chunk and stage sequence number.
  int copy_slot = 0, copy_chunk = 0, copy_seq = 0;
  int pending = 0;  // thread 0: the index of unit copy_slot + 1, not yet published
  bool publish = false;
  Unit copy_unit;
  ChunkCopier<T> copier;
  bool copy_done = false;
  // defer: the unit's index after this one is needed no earlier than two copy steps later.
  auto enter_copy_unit = [&](bool defer) {
    const int u = s_index[copy_slot % kRing];
    copy_done = u >= num_units;
    if (copy_done) return;
    copy_unit = decode_unit<T>(a, u, total_tiles, a.tile_info[u % total_tiles]);
    copier.init(a, copy_unit);
    copy_chunk = copy_unit.chunk_begin;
    if (threadIdx.x == 0) {
      s_ring[copy_slot % kRing] = copy_unit;
      pending = atomicAdd(a.unit_counter, 1);
      publish = defer && copy_unit.chunk_end - copy_unit.chunk_begin >= 2;
      if (!publish) s_index[(copy_slot + 1) % kRing] = pending;
    }
  };
  // One chunk into the next stage (after a barrier: the stage is free, earlier writes visible).
  auto copy_step = [&]() {
    if (publish) {  // thread 0 only
      s_index[(copy_slot + 1) % kRing] = pending;
      publish = false;
    }
    if (!copy_done && copy_chunk == copy_unit.chunk_end) {
      ++copy_slot;
      enter_copy_unit(true);  // this step copies the first chunk, the next one publishes
    }
    if (copy_done) return;
    uint8_t* stage = smem + (copy_seq % T::kStages) * T::kStageBytes;
    copier.weights(stage, copy_chunk, &s_full[copy_seq % T::kStages]);
    copier.activations(stage, copy_chunk);
    ++copy_chunk;
    ++copy_seq;
  };

  // NOTE: GEMM2 copies up to kStages - 1 chunks of the first unit before any copy step, so its
  // successor's index is written at once.
  enter_copy_unit(false);
  // The prologue: stages 0 .. kStages - 2. GEMM2 issues its first unit's weights before waiting for
  // GEMM1 (its tokens are GEMM1's output).
  int early = 0;
  if (kEpi == Epilogue::Rows) {
    early = min(T::kStages - 1, copy_unit.chunk_end - copy_unit.chunk_begin);
    for (int s = 0; s < early; ++s) copier.weights(smem + s * T::kStageBytes, copy_unit.chunk_begin + s, &s_full[s]);
    ptx::griddepcontrol_wait();
    for (int s = 0; s < early; ++s) {
      copier.activations(smem + s * T::kStageBytes, copy_unit.chunk_begin + s);
      ptx::cp_async_commit();
    }
    copy_chunk += early;
    copy_seq += early;
  }
  for (int s = early; s < T::kStages - 1; ++s) {
    __syncthreads();
    copy_step();
    ptx::cp_async_commit();
  }
  __syncthreads();  // s_ring[0] visible

  int compute_slot = 0, compute_seq = 0;
  Accumulators<T> acc;
  for (;;) {
    const Unit unit = s_ring[compute_slot % kRing];
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][q][c] = 0.0f;
    for (int chunk = unit.chunk_begin; chunk < unit.chunk_end; ++chunk) {
      ptx::cp_async_wait<T::kStages - 2>();
      ptx::mbarrier_wait_parity(&s_full[compute_seq % T::kStages], (compute_seq / T::kStages) & 1);
      __syncthreads();  // this chunk's stage landed for every thread; the stage refilled below is idle
      copy_step();
      ptx::cp_async_commit();
      compute_chunk<T>(smem + (compute_seq % T::kStages) * T::kStageBytes, warp, lane, acc);
      ++compute_seq;
    }
    store_unit<T, kEpi>(a, out, unit, warp, lane, acc);
    ++compute_slot;
    // The copies entered (or ended at) this slot at least one barrier ago.
    if (s_index[compute_slot % kRing] >= num_units) break;
  }
  ptx::cp_async_wait<0>();
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

// The CTA shapes launched: 4 warps x 4 m-tiles for every token tile, and 8 warps x 2 m-tiles for
// 32-token tiles at prefill (the same weight rows and shared memory per CTA, twice the warps).
using Tile8 = Tile<1, 4>;
using Tile16 = Tile<2, 4>;
using Tile32 = Tile<4, 4>;
using Tile32Wide = Tile<4, 8>;

template <Epilogue kEpi>
void launch_tile(TokenTile tile, int warps, const ExpertGemmArgs& a, const GemmOutput& out, cudaStream_t stream) {
  switch (tile) {
    case TokenTile::T8: return launch<Tile8, kEpi>(a, out, stream);
    case TokenTile::T16: return launch<Tile16, kEpi>(a, out, stream);
    case TokenTile::T32:
      if (warps == 8) return launch<Tile32Wide, kEpi>(a, out, stream);
      return launch<Tile32, kEpi>(a, out, stream);
    default:
      return launch_expert_gemm_wgmma(a, out, tile_tokens(tile), warps, kEpi != Epilogue::Rows, stream);
  }
}

}  // namespace

void configure_expert_gemm_kernels() {
  configure<Tile8>();
  configure<Tile16>();
  configure<Tile32>();
  configure<Tile32Wide>();
  configure_expert_gemm_wgmma_kernels();
}

// Every unit must stream >= 1 chunk of its K range.
void check_splits(const ExpertGemmArgs& args, const char* gemm) {
  K3MOE_CHECK(args.splits >= 1 && args.splits <= args.K / kGemmChunkK, gemm, ": K = ", args.K, " splits into 1..",
              args.K / kGemmChunkK, " ranges of ", kGemmChunkK, ", got ", args.splits);
}

void launch_expert_gemm1(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream) {
  check_splits(args, "GEMM1");
  if (args.num_local == 0) return;
  if (args.splits == 1) launch_tile<Epilogue::Activation>(tile, warps, args, out, stream);
  else launch_tile<Epilogue::GateUpRows>(tile, warps, args, out, stream);
}

void launch_expert_gemm2(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream) {
  check_splits(args, "GEMM2");
  if (args.num_local == 0) return;
  launch_tile<Epilogue::Rows>(tile, warps, args, out, stream);
}

int gemm_ctas_per_sm(TokenTile tile) {
  switch (tile) {
    case TokenTile::T8: return Tile8::kMinBlocksPerSm;
    case TokenTile::T16: return Tile16::kMinBlocksPerSm;
    case TokenTile::T32: return Tile32::kMinBlocksPerSm;
    default: return 1;  // the wgmma kernels
  }
}

}  // namespace k3moe::kernels
