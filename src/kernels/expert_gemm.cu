// Grouped expert GEMMs: MXFP4 weights x bf16 activations on mma.sync (m16n8k16, fp32 accumulate).
//
// Operands are swapped: the weights are the mma's A side (16 rows per m-tile), the tokens its
// 8-wide B side, so one token does not waste a 64-row tile. A unit of work is 256 weight rows
// (4 warps x 4 m-tiles, or 8 x 2) of one expert, one tile of 8/16/24/32 of that expert's token rows
// and one range of K; persistent CTAs take units from a counter and stream K in chunks of 128
// through one pipeline of 2 to 8 stages that runs across units. With 8- and 16-token tiles a
// unit can also be 128 rows (4 warps x 2 m-tiles, half a layout row group) streamed in chunks of
// 256 of K: the same weight bytes per stage, twice the units of half the length, so the end of the
// stream balances over finer pieces. A producer warp fills each stage:
// the weight blocks (already in fragment order, expert_layout.cuh) and their scales by bulk
// copies (two per layout run), the token rows (gathered by token id for GEMM1) by cp.async, all completing on the
// stage's full barrier; the consumer warps release it on its empty barrier, each at its own pace.
// Each consumer lane widens its own codes to bf16 in registers with the E8M0 scale folded in by
// one bf16 multiply (exact: a power of two times an E2M1 value), then issues the mma.
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
#include "kernels/stage_marks.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

template <int kNT_, int kWarps_, int kMTiles_ = 16 / kWarps_>
struct Tile {
  static constexpr int kNT = kNT_;  // mma n-tiles (8 tokens each) per warp
  static constexpr int kTokens = 8 * kNT;
  static constexpr int kWarps = kWarps_;  // consumer warps; one producer warp follows them
  static constexpr int kConsumerThreads = 32 * kWarps;
  static constexpr int kThreads = kConsumerThreads + 32;
  static constexpr int kMTiles = kMTiles_;  // m16 tiles per warp
  static constexpr int kRowBlocks = kWarps * kMTiles;
  static constexpr int kRowsPerCta = 16 * kRowBlocks;  // 256, or 128 (half a layout row group)
  // Every stage holds a row group's weight bytes of 128 of K: 128 rows stream 256 of K per stage,
  // as two runs of the layout.
  static constexpr int kRuns = layout::kGroupRowBlocks / kRowBlocks;
  static constexpr int kChunkK = layout::kChunkK * kRuns;
  static constexpr int kChunkBlocks = kChunkK / layout::kBlockK;
  // NOTE: three stages (~60-72 KB) let three CTAs share an SM at 8 to 24 tokens, where latency
  // hiding needs warps; at 32 tokens the tile is larger and two CTAs with four stages fit, or one
  // CTA of 8 consumer warps (two would leave them 96 registers, and GEMM2 spills).
  // 128-row units of 16 tokens hold twice the tokens per stage: two stages fit three CTAs (four of
  // half the K ran slower: bench/NOTES.md, Session 54).
  static constexpr int kStages = kNT == 4 ? (kWarps == 8 ? 8 : 4) : kRuns == 2 && kNT == 2 ? 2 : 3;
  static constexpr int kMinBlocksPerSm = kNT == 4 ? (kWarps == 8 ? 1 : 2) : 3;
  // NOTE: 16 bytes of padding per row keep the 8 rows an ldmatrix reads in distinct banks.
  static constexpr int kActStride = kChunkK + 8;  // bf16 elements
  static constexpr int kCodeBytes = kRowBlocks * kChunkBlocks * layout::kBlockCodeBytes;
  static constexpr int kScaleBytes = kRowBlocks * kChunkBlocks * layout::kBlockScaleBytes;
  static constexpr int kActBytes = kTokens * kActStride * 2;
  static constexpr int kStageBytes = kCodeBytes + kScaleBytes + kActBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;

  static_assert(kRowBlocks * kRuns == layout::kGroupRowBlocks, "a unit is a layout row group or half of one");
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

// What the producer warp copies into a pipeline stage for the chunks of one unit: lane 0 the
// unit's weight blocks and scales of the chunk (per layout run of 128 of K, one contiguous run
// each, expert_layout.cuh) by bulk copies, every lane its token-row pieces by cp.async (lane l:
// 16-byte column l % P of rows l / P + (32 / P) i, P pieces per row; rows past the tile are
// zeros). All complete on the stage's full barrier. The sources are resolved once per unit.
template <class T>
struct ChunkCopier {
  static constexpr int kPiecesPerRow = T::kChunkK / 8;  // 16 bytes each
  static constexpr int kRowStep = 32 / kPiecesPerRow;
  static constexpr int kRowsPerLane = T::kTokens / kRowStep;
  static_assert(32 % kPiecesPerRow == 0 && T::kTokens % kRowStep == 0);
  static_assert(T::kChunkBlocks == layout::kChunkBlocks * T::kRuns, "a chunk is kRuns runs of the layout");
  static constexpr uint32_t kRunCodeBytes = T::kRowBlocks * layout::kChunkBlocks * layout::kBlockCodeBytes;
  static constexpr uint32_t kRunScaleBytes = T::kRowBlocks * layout::kChunkBlocks * layout::kBlockScaleBytes;

  const uint8_t* code_src;  // the unit's run of layout chunk 0 (its row blocks of the row group)
  const uint8_t* scale_src;
  uint32_t code_bytes, scale_bytes;  // per run: the unit's row blocks x 2 k-blocks
  uint32_t code_stride, scale_stride;  // per layout chunk: the row group's row blocks x 2 k-blocks
  // The lane's rows as offsets of their first piece in 16-byte pieces of the activations (32 bits:
  // max_gemm_tokens bounds them); bit i of act_valid: the lane's row i exists.
  uint32_t act_piece[kRowsPerLane];
  uint32_t act_valid;

  __device__ __forceinline__ void init(const ExpertGemmArgs& a, const Unit& unit, int lane) {
    const int n_blocks = a.N / layout::kBlockRows, k_blocks = a.K / layout::kBlockK;
    const int group = unit.row0 / (layout::kGroupRowBlocks * layout::kBlockRows);
    const int first_row_block = unit.row0 / layout::kBlockRows - group * layout::kGroupRowBlocks;
    const int group_blocks = layout::group_row_blocks(group, a.N);
    const int64_t first_block = int64_t(unit.expert) * n_blocks * k_blocks +
                                int64_t(group) * layout::kGroupRowBlocks * k_blocks +
                                first_row_block * layout::kChunkBlocks;
    const int blocks = min(T::kRowBlocks, group_blocks - first_row_block) * layout::kChunkBlocks;
    code_src = a.codes + first_block * layout::kBlockCodeBytes;
    scale_src = a.scales + first_block * layout::kBlockScaleBytes;
    code_bytes = blocks * layout::kBlockCodeBytes;
    scale_bytes = blocks * layout::kBlockScaleBytes;
    code_stride = group_blocks * layout::kChunkBlocks * layout::kBlockCodeBytes;
    scale_stride = group_blocks * layout::kChunkBlocks * layout::kBlockScaleBytes;
    act_valid = 0;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int r = lane / kPiecesPerRow + kRowStep * i;
      const bool valid = r < unit.tile_count;
      const int src_row = !valid ? 0 : a.row_token ? a.row_token[unit.tile_row0 + r] : unit.tile_row0 + r;
      act_piece[i] = uint32_t(src_row) * uint32_t(a.K / 8) + lane % kPiecesPerRow;
      act_valid |= uint32_t(valid) << i;
    }
  }

  // Lane 0. NOTE: row blocks past a partial group keep stale bytes: they only feed weight rows
  // that are never stored. The weights are read once per forward: evict-first in L2, so that their
  // stream (~4 MB per us) does not push out what the forward re-reads (gathered token rows, split
  // partials; measured in bench/NOTES.md, Session 11).
  __device__ __forceinline__ void weights(uint8_t* stage, int chunk, uint64_t* full) const {
    const uint64_t policy = ptx::l2_policy_evict_first();
    ptx::mbarrier_arrive_expect_tx(full, T::kRuns * (code_bytes + scale_bytes));
#pragma unroll
    for (int r = 0; r < T::kRuns; ++r) {
      const int64_t run = int64_t(chunk) * T::kRuns + r;
      ptx::cp_async_bulk_g2s(stage + r * kRunCodeBytes, code_src + run * code_stride, code_bytes, full, policy);
      ptx::cp_async_bulk_g2s(stage + T::kCodeBytes + r * kRunScaleBytes, scale_src + run * scale_stride, scale_bytes,
                             full, policy);
    }
  }

  // Every lane; its arrival on `full` comes when its copies have landed.
  __device__ __forceinline__ void activations(const ExpertGemmArgs& a, uint8_t* stage, int chunk, int lane,
                                              uint64_t* full) const {
    uint16_t* s_act = reinterpret_cast<uint16_t*>(stage + T::kCodeBytes + T::kScaleBytes) +
                      (lane / kPiecesPerRow) * T::kActStride + (lane % kPiecesPerRow) * 8;
    const uint4* src = reinterpret_cast<const uint4*>(a.act) + chunk * kPiecesPerRow;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i)
      ptx::cp_async_16(s_act + kRowStep * i * T::kActStride, src + act_piece[i], (act_valid >> i & 1) ? 16 : 0);
    ptx::cp_async_mbarrier_arrive_noinc(full);
  }
};

template <class T>
using Accumulators = float[T::kMTiles][T::kNT][4];

// Stage index of the block of CTA row block rb and chunk k-block kb: runs of the layout, each
// [row block][2 k-blocks].
template <class T>
__device__ __forceinline__ int stage_block(int rb, int kb) {
  return (kb / layout::kChunkBlocks) * T::kRowBlocks * layout::kChunkBlocks + rb * layout::kChunkBlocks +
         kb % layout::kChunkBlocks;
}

// One chunk's MMAs from a landed stage: every warp its m-tiles x all token n-tiles.
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
      load_block_fragments(s_codes, s_scales, stage_block<T>(warp * T::kMTiles + i, kb), lane, code[i], mult[i]);
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
__device__ __forceinline__ void store_unit(const ExpertGemmArgs& a, const GemmOutput& out, const Unit& unit, int slot,
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
      // m-tiles per warp, the pair of warps 2w, 2w + 1 (through shared memory, one buffer per unit
      // parity: a warp can run a whole unit ahead of its partner, not two).
      constexpr int kWarpOutputs = T::kMTiles * 8;
      static_assert(kWarpOutputs == 32 || kWarpOutputs == 16);
      __shared__ uint32_t s_amax_units[2][T::kWarps][T::kTokens];
      uint32_t (*s_amax)[T::kTokens] = s_amax_units[slot % 2];
      uint32_t amax_bits[T::kNT][2];  // |v| as bits: orders like the values, and NaN above Inf
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          amax_bits[q][h] = 0;
#pragma unroll
          for (int i = 0; i < T::kMTiles; ++i)
            amax_bits[q][h] = max(amax_bits[q][h], magnitude_bits(v[i][q][h]));
#pragma unroll
          for (int offset = 4; offset < 32; offset *= 2)
            amax_bits[q][h] = max(amax_bits[q][h], __shfl_xor_sync(0xFFFFFFFFu, amax_bits[q][h], offset));
          if (kWarpOutputs == 16 && g == 0) s_amax[warp][q * 8 + col0 + h] = amax_bits[q][h];
        }
      if constexpr (kWarpOutputs == 16) {
        ptx::named_barrier_sync(1, T::kConsumerThreads);
#pragma unroll
        for (int q = 0; q < T::kNT; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h) amax_bits[q][h] = max(amax_bits[q][h], s_amax[warp ^ 1][q * 8 + col0 + h]);
      }
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Mxfp8Scale scale(mx_scale_round_up(bits_float(amax_bits[q][h]), kE4M3Max));
          static_assert(T::kMTiles % 2 == 0);
#pragma unroll
          for (int i = 0; i < T::kMTiles; i += 2) scale.round2(v[i][q][h], v[i + 1][q][h]);
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

// The shared state of a CTA's pipeline: per stage a full barrier (the producer lane 0's arrival
// with the weights' bytes + one arrival per producer lane when its cp.async rows have landed) and an
// empty barrier (every consumer thread, done reading it); the units in a ring, written by the
// producer before the full barrier of their first chunk.
struct Pipeline {
  static constexpr int kRing = 16;  // > the units the producer can run ahead (kStages + 1)
  static constexpr int kFullArrivals = 1 + 32;
  Unit ring[kRing];
  int first_unit;
};

// Stage index and barrier phase of a position in the pipeline.
template <class T>
struct StageCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == T::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The producer warp: takes units from the counter (the next unit's index one unit ahead, so the
// atomic's round trip overlaps the copies) and fills the stages. It ends by handing the consumers
// a unit with expert -1.
template <class T, Epilogue kEpi>
__device__ __forceinline__ void produce(const ExpertGemmArgs& a, uint8_t* smem, Pipeline& p, uint64_t* full,
                                        uint64_t* empty, int num_units, int total_tiles) {
  static_assert(Pipeline::kRing > T::kStages + 1);
  const int lane = threadIdx.x % 32;
  ChunkCopier<T> copier;
  StageCursor<T> at;
  // GEMM2 streams its first unit's weights before waiting for GEMM1 (its tokens are GEMM1's output).
  bool inputs_pending = kEpi == Epilogue::Rows;
  int u = p.first_unit;
  for (int slot = 0;; ++slot) {
    if (u >= num_units) {
      ptx::mbarrier_wait_parity(&empty[at.stage], at.phase ^ 1);
      if (lane == 0) {
        p.ring[slot % Pipeline::kRing].expert = -1;
        ptx::mbarrier_arrive(&full[at.stage]);
      }
      ptx::mbarrier_arrive(&full[at.stage]);
      break;
    }
    int next = 0;
    if (lane == 0) next = atomicAdd(a.unit_counter, 1);
    const Unit unit = decode_unit<T>(a, u, total_tiles, a.tile_info[u % total_tiles]);
    copier.init(a, unit, lane);
    int chunk = unit.chunk_begin;
    if (inputs_pending) {
      const int early = min(T::kStages, unit.chunk_end - unit.chunk_begin);  // stages 0 .. early - 1, free
      if (lane == 0) {
        p.ring[slot % Pipeline::kRing] = unit;
        for (int s = 0; s < early; ++s) copier.weights(smem + s * T::kStageBytes, chunk + s, &full[s]);
      }
      ptx::griddepcontrol_wait();
      if (lane == 0) mark_wait(a.times);
      for (int s = 0; s < early; ++s, ++chunk, at.advance())
        copier.activations(a, smem + s * T::kStageBytes, chunk, lane, &full[s]);
      inputs_pending = false;
    }
    for (; chunk < unit.chunk_end; ++chunk, at.advance()) {
      ptx::mbarrier_wait_parity(&empty[at.stage], at.phase ^ 1);
      uint8_t* stage = smem + at.stage * T::kStageBytes;
      if (lane == 0) {
        if (chunk == unit.chunk_begin) p.ring[slot % Pipeline::kRing] = unit;
        copier.weights(stage, chunk, &full[at.stage]);
      }
      copier.activations(a, stage, chunk, lane, &full[at.stage]);
    }
    u = __shfl_sync(0xFFFFFFFFu, next, 0);
  }
  // NOTE: no wait for the copies here (they form no commit group): each lands in a stage whose
  // full barrier it arrives on, and the consumers wait for every stage before the CTA can end.
}

// Persistent CTAs take units from a counter (so a CTA that starts late, behind the previous
// kernel's tail, takes fewer). One producer warp streams the chunks of all the CTA's units through
// one pipeline, so while the consumers compute the last chunks of a unit the stages already fill
// with the next unit's first ones; each consumer warp waits only for the stage it reads, and a
// finished unit is stored straight from registers.
template <class T, Epilogue kEpi>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSm)
    expert_gemm_kernel(ExpertGemmArgs a, GemmOutput out) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ Pipeline p;
  __shared__ __align__(8) uint64_t s_full[T::kStages], s_empty[T::kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  mark_start(a.times);
  // NOTE: the schedule comes from the permutation, which completed before the previous kernel
  // (GEMM1 or the activation) passed its own wait. GEMM2's weights do not depend on GEMM1 either:
  // GEMM2's producer waits for GEMM1's output only after it started streaming its first unit's
  // weights.
  if (kEpi != Epilogue::Rows) {
    ptx::griddepcontrol_wait();
    if (threadIdx.x == 0) mark_wait(a.times);
  }
  ptx::griddepcontrol_launch_dependents();
  const int total_tiles = *a.num_tiles;
  const int row_blocks = (a.N + T::kRowsPerCta - 1) / T::kRowsPerCta;
  const int num_units = total_tiles * row_blocks * a.splits;
  if (threadIdx.x == 0) {
    p.first_unit = atomicAdd(a.unit_counter, 1);
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&s_full[s], Pipeline::kFullArrivals);
      ptx::mbarrier_init(&s_empty[s], T::kConsumerThreads);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (p.first_unit >= num_units) {
    // Every CTA of GEMM2 waits for the grid before it (in a CTA with units, the producer does), so
    // that GEMM2's end implies GEMM1's: the combine's and the next forward's waits rely on it (the
    // next permutation resets the counters GEMM1's CTAs add to after releasing this grid).
    if (kEpi == Epilogue::Rows) ptx::griddepcontrol_wait();
    return;
  }
  if (warp == T::kWarps) return produce<T, kEpi>(a, smem, p, s_full, s_empty, num_units, total_tiles);

  StageCursor<T> at;
  Accumulators<T> acc;
  for (int slot = 0;; ++slot) {
    ptx::mbarrier_wait_parity(&s_full[at.stage], at.phase);
    const Unit unit = p.ring[slot % Pipeline::kRing];
    if (unit.expert < 0) break;
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
#pragma unroll
      for (int q = 0; q < T::kNT; ++q)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][q][c] = 0.0f;
    for (int chunk = unit.chunk_begin;;) {
      compute_chunk<T>(smem + at.stage * T::kStageBytes, warp, lane, acc);
      ptx::mbarrier_arrive(&s_empty[at.stage]);
      at.advance();
      if (++chunk == unit.chunk_end) break;
      ptx::mbarrier_wait_parity(&s_full[at.stage], at.phase);
    }
    store_unit<T, kEpi>(a, out, unit, slot, warp, lane, acc);
  }
  if (lane == 0) mark_end(a.times);
}

template <class T, Epilogue kEpi>
void launch(const ExpertGemmArgs& a, const GemmOutput& out, cudaStream_t stream) {
  const int ctas = a.sm_count * T::kMinBlocksPerSm;  // persistent: one wave of resident CTAs
  launch_dependent(expert_gemm_kernel<T, kEpi>, ctas, T::kThreads, T::kSmemBytes, stream, a, out);
}

// NOTE: the largest shared-memory carveout, so that the activation stage's CTAs fit beside three
// 8-token CTAs (KernelChoice::activation_beside_gemm1). Left to the driver, three 128-row CTAs
// (199,296 bytes) got 196 KB and room for one of its CTAs, not two, on an H100 (bench/NOTES.md,
// Session 65; timing within -0.4..+0.1 %).
template <class T>
void configure() {
  for (auto kernel : {expert_gemm_kernel<T, Epilogue::Activation>, expert_gemm_kernel<T, Epilogue::GateUpRows>,
                      expert_gemm_kernel<T, Epilogue::Rows>}) {
    K3MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    K3MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  }
}

// The CTA shapes launched: 4 warps x 4 m-tiles for every token tile, 8 warps x 2 m-tiles for
// 32-token tiles at prefill (the same weight rows and shared memory per CTA, twice the warps), and
// 4 warps x 2 m-tiles (128-row units) for 8- and 16-token tiles.
using Tile8 = Tile<1, 4>;
using Tile8Half = Tile<1, 4, 2>;
using Tile16 = Tile<2, 4>;
using Tile16Half = Tile<2, 4, 2>;
using Tile24 = Tile<3, 4>;
using Tile32 = Tile<4, 4>;
using Tile32Wide = Tile<4, 8>;

// Calls `f.template operator()<T>()` with the CTA shape T that runs an mma.sync token tile at
// `warps` and `unit_rows`; false for the wgmma tiles.
template <class F>
bool with_mma_tile(TokenTile tile, int warps, int unit_rows, F&& f) {
  const bool half = unit_rows == kGemmHalfUnitRows;
  switch (tile) {
    case TokenTile::T8: half ? f.template operator()<Tile8Half>() : f.template operator()<Tile8>(); return true;
    case TokenTile::T16: half ? f.template operator()<Tile16Half>() : f.template operator()<Tile16>(); return true;
    case TokenTile::T24: f.template operator()<Tile24>(); return true;
    case TokenTile::T32: warps == 8 ? f.template operator()<Tile32Wide>() : f.template operator()<Tile32>(); return true;
    default: return false;
  }
}

template <Epilogue kEpi>
void launch_tile(TokenTile tile, int warps, const ExpertGemmArgs& a, const GemmOutput& out, cudaStream_t stream) {
  const bool mma = with_mma_tile(tile, warps, a.unit_rows, [&]<class T>() { launch<T, kEpi>(a, out, stream); });
  if (!mma) launch_expert_gemm_wgmma(a, out, tile_tokens(tile), warps, kEpi != Epilogue::Rows, stream);
}

}  // namespace

void configure_expert_gemm_kernels() {
  configure<Tile8>();
  configure<Tile8Half>();
  configure<Tile16>();
  configure<Tile16Half>();
  configure<Tile24>();
  configure<Tile32>();
  configure<Tile32Wide>();
  configure_expert_gemm_wgmma_kernels();
}

// Every unit must stream >= 1 chunk of its K range; 128-row units run 8- and 16-token tiles over
// chunks of 256 of K.
void check_units(const ExpertGemmArgs& args, TokenTile tile, const char* gemm) {
  K3MOE_CHECK(args.unit_rows == kGemmRowsPerCta || (args.unit_rows == kGemmHalfUnitRows && tile_takes_half_units(tile)),
              gemm, ": units of ", args.unit_rows, " rows; 256 rows take every token tile, 128 only 8 or 16 tokens");
  const int chunk_k = unit_chunk_k(args.unit_rows);
  K3MOE_CHECK(args.K % chunk_k == 0, gemm, ": units of ", args.unit_rows, " rows stream K in chunks of ", chunk_k,
              ", K = ", args.K, " is not a multiple");
  K3MOE_CHECK(args.splits >= 1 && args.splits <= args.K / chunk_k, gemm, ": K = ", args.K, " splits into 1..",
              args.K / chunk_k, " ranges of ", chunk_k, ", got ", args.splits);
}

void launch_expert_gemm1(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream) {
  check_units(args, tile, "GEMM1");
  if (args.num_local == 0) return;
  if (args.splits == 1) launch_tile<Epilogue::Activation>(tile, warps, args, out, stream);
  else launch_tile<Epilogue::GateUpRows>(tile, warps, args, out, stream);
}

void launch_expert_gemm2(const ExpertGemmArgs& args, const GemmOutput& out, TokenTile tile, int warps,
                         cudaStream_t stream) {
  check_units(args, tile, "GEMM2");
  if (args.num_local == 0) return;
  launch_tile<Epilogue::Rows>(tile, warps, args, out, stream);
}

int gemm_ctas_per_sm(TokenTile tile) {
  int ctas = 1;  // the wgmma kernels
  with_mma_tile(tile, 4, kGemmRowsPerCta, [&]<class T>() { ctas = T::kMinBlocksPerSm; });
  return ctas;
}

cudaFuncAttributes expert_gemm1_split_attributes(TokenTile tile, int unit_rows, size_t* dynamic_smem) {
  cudaFuncAttributes attributes{};
  const bool mma = with_mma_tile(tile, 4, unit_rows, [&]<class T>() {
    K3MOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, expert_gemm_kernel<T, Epilogue::GateUpRows>));
    *dynamic_smem = size_t(T::kSmemBytes);
  });
  K3MOE_CHECK(mma, "expert_gemm1_split_attributes: mma.sync tiles only");
  return attributes;
}

}  // namespace k3moe::kernels
