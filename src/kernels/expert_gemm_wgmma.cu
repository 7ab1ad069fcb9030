// Grouped expert GEMMs from a few dozen rows per expert up: MXFP4 weights x bf16 activations on
// warpgroup MMA (wgmma m64nNk16, fp32 accumulate), for token tiles of N = 32, 64, 96 or 128 rows
// of one expert.
//
// The weights stay the A side, as in the mma.sync kernel: wgmma takes A from registers in the
// same per-warp fragment layout as mma.sync m16n8k16, so each lane widens the codes the layout
// already stores in fragment order (expert_layout.cuh) and folds the E8M0 scale in with one bf16
// multiply. The N token rows are the B side, read by the tensor cores from shared memory.
//
// A CTA (one per SM, persistent) is a producer warpgroup and two consumer warpgroups (GEMM1 mostly
// with an epilogue warpgroup beside them, the staged epilogue below). A unit is one token tile x
// one row group (256 weight rows, the layout's contiguous run per chunk of 128 k); CTA b takes
// units b, b + grid, ... in order, the row groups of a token tile consecutive, so the CTAs working
// at one time share a few token tiles and experts in L2. Per chunk, through a ring of full/empty
// mbarriers (3 to 8 stages, as many as shared memory holds beside any staging):
//   producer: thread 0 copies the chunk's weight codes and scales with two bulk copies; GEMM1's
//             128 threads gather the token rows' 256 bytes by token id with cp.async into the
//             128-byte-swizzled K-major layout wgmma reads, and arrive when they land; GEMM2's
//             thread 0 copies its tile's contiguous rows as two TMA boxes in that layout;
//   consumers: warpgroup c owns row blocks 8c .. 8c + 7 as two m64 tiles; per 16 k it widens its
//             A fragments, issues its wgmmas and waits for the previous step's (so the A registers
//             of one step are widened while the last step runs), releasing a stage once its last
//             wgmma completed.
// Small N streams weights (decode-like, more stages in flight); large N reuses each widened
// fragment over more tokens (prefill). A unit's wgmmas are only as wide as its tile's rows rounded
// up to 16 or 32 (an expert's last tile is often a fraction of N), so its tensor work shrinks with
// them; the producer still fills (zeros) the whole tile.
// Epilogues store from the accumulators, whose per-warp layout is mma.sync's (rows g and g + 8 of
// each 16 are gate and up of one output, by the W13 row order):
//   GEMM1: act(h_gate, h_up) as bf16 (A16) or MXFP8. Staged (N <= 96; N = 128 in MXFP8): the
//          consumers write the accumulators (N = 128: the activation values) to shared memory and
//          run the next unit while the epilogue warpgroup stores the activation (the two consumer
//          warpgroups' epilogues coincide, so the tensor pipe idled through them: ~21 % of their
//          samples at local28 T = 128; staged, GEMM1 ran 221 -> 208 us, bench/NOTES.md, Session
//          34). A16 at N = 128: the consumers store it from the accumulators;
//   GEMM2: fp32 rows.
#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "k3moe/activation.h"
#include "k3moe/formats.h"
#include "kernels/expert_gemm.cuh"
#include "kernels/expert_layout.cuh"
#include "kernels/fast_activation.cuh"
#include "kernels/launch.cuh"
#include "kernels/mxfp4_fragments.cuh"
#include "kernels/sm90/ptx.cuh"
#include "kernels/stage_marks.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

// What the consumers of GEMM1 on 2 warpgroups hand to a fourth, epilogue warpgroup through shared
// memory (drain_staging), which stores it while they run the next unit's chunks: nothing (they
// store the activation themselves), a unit's accumulators, or its activation values (where the
// accumulators' staging does not fit beside 3 stages).
enum class Staging { None, Accumulators, Activations };

// kTmaRows_: GEMM2, whose token tiles come by TMA (produce).
template <int kTokens_, Staging kStaging_ = Staging::None, bool kTmaRows_ = false>
struct WgTile {
  static constexpr int kTokens = kTokens_;  // the wgmma N
  static constexpr bool kTmaRows = kTmaRows_;
  static constexpr int kConsumers = 2;      // warpgroups
  static constexpr Staging kStaging = kStaging_;
  static constexpr bool kStaged = kStaging != Staging::None;
  static constexpr int kMTiles = 2;  // m64 tiles per consumer warpgroup
  static constexpr int kRowsPerCta = 64 * kMTiles * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers + kStaged);
  static constexpr int kChunkK = 128;
  static constexpr int kActHalfBytes = kTokens * 128;  // 64 k of every token row
  static constexpr int kActBytes = 2 * kActHalfBytes;
  static constexpr int kCodeBytes = layout::kGroupRowBlocks * layout::kChunkBlocks * layout::kBlockCodeBytes;
  static constexpr int kScaleBytes = layout::kGroupRowBlocks * layout::kChunkBlocks * layout::kBlockScaleBytes;
  static constexpr int kStageBytes = kActBytes + kCodeBytes + kScaleBytes;
  // Per token row 128 outputs x {gate, up} or their activation, in fp32 (staged_offset).
  static constexpr int kStagingRowBytes = kStaging == Staging::Accumulators ? 1024 : kStaged ? 512 : 0;
  static constexpr int kStagingBytes = kTokens * kStagingRowBytes;
  static constexpr int kStagesFit = (220 * 1024 - kStagingBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < 8 ? kStagesFit : 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + kStagingBytes + 1024;  // + the slack to align to 1024
  // The producer (and the staged epilogue) give their registers to the consumers, within the CTA's
  // allocation at launch (kThreads x the launch bound's 168 or 128): 128 x kProducerRegs + 128
  // kConsumers x kConsumerRegs (+ 128 x kEpilogueRegs) <= it, or setmaxnreg.inc waits forever.
  // GEMM2's one producing thread keeps a unit's copies and the next unit's look-ahead in registers:
  // at 40 it spilled.
  static constexpr int kProducerRegs = kTmaRows ? 56 : 40, kEpilogueRegs = 56;
  static constexpr int kConsumerRegs = kStaged ? 208 : kTmaRows ? 224 : 232;
  // The unit widths (wgmma N) the consumers run: the multiples of this up to kTokens. NOTE: more
  // variants of the chunk loop make ptxas serialize the wgmmas (at 232 registers, eight of N =
  // 128's activation kernel).
  static constexpr int kWidthStep = kTokens == 128 ? 32 : 16;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs + 128 * kStaged * kEpilogueRegs <=
                kThreads * (65536 / kThreads / 8 * 8));

  static_assert(kRowsPerCta == layout::kGroupRowBlocks * layout::kBlockRows && wgmma_units_per_tile(kRowsPerCta) == 1,
                "a unit is one row group");
  static_assert(kChunkK == layout::kChunkBlocks * layout::kBlockK, "a stage holds one chunk of the layout");
  static_assert(kTokens % 32 == 0 && kTokens <= 128,
                "whole swizzle atoms, MX groups of 4 n-tiles, at most one row per producer thread");
  static_assert(kStageBytes % 1024 == 0, "the swizzle atoms of every stage stay 1024-byte aligned");
  static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024, "shared memory budget of one SM");
};

// Where unit u's rows live: its token tile and its row group.
struct WgUnit {
  int4 tile;  // {local expert, first row, rows, 0}
  int group;
};

__device__ __forceinline__ WgUnit wg_unit(const ExpertGemmArgs& a, int u, int row_groups) {
  return {a.tile_info[u / row_groups], u % row_groups};
}

// The wgmma N of a unit: its tile's rows rounded up to T::kWidthStep (<= T::kTokens).
template <class T>
__device__ __forceinline__ int unit_width(const WgUnit& unit) {
  return (unit.tile.z + T::kWidthStep - 1) / T::kWidthStep * T::kWidthStep;
}

// f(std::integral_constant<int, n>) for the unit width n.
template <class T, int kN = T::kWidthStep, class F>
__device__ __forceinline__ void with_width(int n, F&& f) {
  if constexpr (kN >= T::kTokens) {
    f(std::integral_constant<int, T::kTokens>{});
  } else {
    if (n == kN) f(std::integral_constant<int, kN>{});
    else with_width<T, kN + T::kWidthStep>(n, f);
  }
}

// The producer warpgroup: fills stage after stage with the chunks of this CTA's units.
constexpr int kProducerBarrier = 5;  // named barriers 1 .. 4: the consumer warpgroups' epilogues

// GEMM1: the 128 threads gather the token rows (by token id) with cp.async; CTA b takes units b,
// b + grid, ... GEMM2 (kTakeUnits): one thread produces. Its token tiles are contiguous rows of the
// intermediate, copied per chunk as two TMA boxes of {64 k, T::kTokens rows} through `act_map`,
// whose 128-byte swizzle is the layout wgmma reads; rows past a tile are other tiles' rows (zeros
// past the buffer), in accumulator columns that are never stored. It takes each unit from the
// counter and reads its tile's count one unit ahead (their round trips hide behind a unit's
// copies), waits until GEMM1 has stored its token tile (ExpertGemmArgs::gemm1_stores_per_tile),
// and writes the unit ({local expert, first row, rows, row group}) beside the unit's first stage
// (s_units[stage]) for the consumers, who then need no global load between units; past the last
// unit, it fills one more stage with no copies and a unit of no rows.
template <class T, bool kTakeUnits>
__device__ __forceinline__ void produce(const ExpertGemmArgs& a, const CUtensorMap* act_map, uint8_t* smem,
                                        uint64_t* full, uint64_t* empty, uint32_t* s_rows, int4* s_units,
                                        int num_units, int row_groups) {
  if (kTakeUnits && threadIdx.x % 128 != 0) return;
  const int tid = kTakeUnits ? 0 : threadIdx.x % 128;
  const int chunks = a.K / T::kChunkK;
  const int n_blocks = a.N / layout::kBlockRows, k_blocks = a.K / layout::kBlockK;
  constexpr int kRowsPerThread = T::kTokens / 16;
  constexpr uint32_t kNoRow = 0xFFFFFFFFu;
  static_assert(kRowsPerThread % 2 == 0, "a thread's rows are read in pairs");
  if constexpr (kTakeUnits) ptx::prefetch_tensormap(act_map);
  // kTakeUnits: the unit after this one and its tile's count (-1: not read yet), both asked for
  // one unit ahead.
  int seq = 0, next = kTakeUnits ? atomicAdd(a.unit_counter, 1) : 0, next_stored = -1;
  for (int u = blockIdx.x;; u += gridDim.x) {
    if constexpr (kTakeUnits) {
      u = next;
      if (u < num_units) {
        for (int stored = next_stored; stored < a.gemm1_stores_per_tile;
             stored = ptx::ld_acquire_gpu(&a.tile_info[u / row_groups].w))
          if (stored >= 0) __nanosleep(256);
        ptx::fence_proxy_async_global();  // GEMM1's stores of the tile, before the TMA reads them
        next = atomicAdd(a.unit_counter, 1);
        next_stored = -1;
      }
    } else {
      // GEMM1's gathers read the row table after the last unit's copies have all been issued.
      ptx::named_barrier_sync(kProducerBarrier, 128);
    }
    if (u >= num_units) {
      if constexpr (kTakeUnits) {  // the end mark: one more stage, no copies
        const int stage = seq % T::kStages;
        if (seq >= T::kStages) ptx::mbarrier_wait_parity(&empty[stage], (seq / T::kStages - 1) & 1);
        s_units[stage].z = 0;  // no rows
        ptx::mbarrier_arrive(&full[stage]);
      }
      break;
    }
    const WgUnit unit = wg_unit(a, u, row_groups);
    const int64_t first_block =
        int64_t(unit.tile.x) * n_blocks * k_blocks + int64_t(unit.group) * layout::kGroupRowBlocks * k_blocks;
    const uint32_t blocks = layout::group_row_blocks(unit.group, a.N) * layout::kChunkBlocks;
    const uint32_t code_bytes = blocks * layout::kBlockCodeBytes, scale_bytes = blocks * layout::kBlockScaleBytes;
    const uint8_t* code_src = a.codes + first_block * layout::kBlockCodeBytes;
    const uint8_t* scale_src = a.scales + first_block * layout::kBlockScaleBytes;
    if constexpr (!kTakeUnits) {
      // The unit's token rows as offsets of their first k in 16-byte pieces (kNoRow: past the
      // tile). Row 16 i + r sits at r * kRowsPerThread + i, so that a thread's rows (16 i + tid / 8)
      // are adjacent: one vector load per chunk.
      if (tid < T::kTokens)
        s_rows[(tid % 16) * kRowsPerThread + tid / 16] =
            tid >= unit.tile.z ? kNoRow : uint32_t(a.row_token[unit.tile.y + tid] * int64_t(a.K / 8));
      ptx::named_barrier_sync(kProducerBarrier, 128);
    }
    for (int c = 0; c < chunks; ++c, ++seq) {
      const int stage = seq % T::kStages;
      if (kTakeUnits && c == chunks - 1 && next < num_units)  // read while the stage drains
        next_stored = ptx::ld_acquire_gpu(&a.tile_info[next / row_groups].w);
      if (seq >= T::kStages) ptx::mbarrier_wait_parity(&empty[stage], (seq / T::kStages - 1) & 1);
      uint8_t* st = smem + stage * T::kStageBytes;
      if (tid == 0) {
        if (kTakeUnits && c == 0) s_units[stage] = make_int4(unit.tile.x, unit.tile.y, unit.tile.z, unit.group);
        ptx::mbarrier_arrive_expect_tx(&full[stage], code_bytes + scale_bytes + (kTakeUnits ? T::kActBytes : 0));
        uint8_t* s_codes = st + T::kActBytes;
        const uint8_t* g_codes = code_src + int64_t(c) * code_bytes;
        const uint8_t* g_scales = scale_src + int64_t(c) * scale_bytes;
        if (a.weights_once) {
          const uint64_t policy = ptx::l2_policy_evict_first();
          ptx::cp_async_bulk_g2s(s_codes, g_codes, code_bytes, &full[stage], policy);
          ptx::cp_async_bulk_g2s(s_codes + T::kCodeBytes, g_scales, scale_bytes, &full[stage], policy);
        } else {
          ptx::cp_async_bulk_g2s(s_codes, g_codes, code_bytes, &full[stage]);
          ptx::cp_async_bulk_g2s(s_codes + T::kCodeBytes, g_scales, scale_bytes, &full[stage]);
        }
        if constexpr (kTakeUnits)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            ptx::cp_async_bulk_tensor_2d_g2s(st + half * T::kActHalfBytes, act_map, c * T::kChunkK + half * 64,
                                             unit.tile.y, &full[stage]);
      }
      if constexpr (kTakeUnits) continue;
      // Each warp instruction copies one k-half (128 bytes, full sectors) of four rows; a thread
      // copies two pieces of each of its rows 16 i + tid / 8 (one row offset read per two copies):
      // piece 8 half + p (16 bytes, p = tid % 8) goes to k-half `half`, 16-byte slot p ^ (row % 8)
      // of the row's 128 bytes, the 128-byte swizzle (row % 8 = (tid / 8) % 8 for every i). Rows
      // past the tile are zeros.
      const int p = tid % 8, row0 = tid / 8;
      const uint4* src = reinterpret_cast<const uint4*>(a.act + c * T::kChunkK) + p;
      uint8_t* dst = st + row0 * 128 + ((p ^ (row0 % 8)) * 16);
      uint32_t rows[kRowsPerThread];
#pragma unroll
      for (int v = 0; v < kRowsPerThread; v += 2) {
        const uint2 pair = *reinterpret_cast<const uint2*>(s_rows + row0 * kRowsPerThread + v);
        rows[v] = pair.x;
        rows[v + 1] = pair.y;
      }
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const bool valid = rows[i] != kNoRow;
        const uint4* row = valid ? src + rows[i] : reinterpret_cast<const uint4*>(a.act);
#pragma unroll
        for (int half = 0; half < 2; ++half)
          ptx::cp_async_16(dst + half * T::kActHalfBytes + i * 16 * 128, valid ? row + half * 8 : row, valid ? 16 : 0);
      }
      ptx::cp_async_mbarrier_arrive_noinc(&full[stage]);
    }
  }
  // NOTE: no wait for the copies here (they form no commit group): each lands in a stage whose
  // full barrier it arrives on, and the consumers wait for every stage before the CTA can end.
}

template <class T>
using WgAccumulators = float[T::kMTiles][T::kTokens / 2];

// One chunk's wgmmas for consumer warpgroup `cwg`; `release` is the stage to hand back once the
// wgmmas that read it have completed (-1: none), cleared when done.
template <class T, int kN>
__device__ __forceinline__ void consume_chunk(const uint8_t* st, int cwg, int warp, int lane, bool first,
                                              WgAccumulators<T>& acc, int& release, uint64_t* empty) {
  const uint8_t* s_codes = st + T::kActBytes;
  const uint8_t* s_scales = s_codes + T::kCodeBytes;
  // A step's descriptor is the chunk's plus its offset in 16-byte units (the start address field
  // does not carry: shared memory ends below 2^18 bytes), so the steps add a constant.
  const uint64_t chunk_desc = ptx::wgmma_desc_k_major_sw128(st);
#pragma unroll
  for (int kb = 0; kb < layout::kChunkBlocks; ++kb) {
    uint4 code[T::kMTiles];
    BlockMultipliers mult[T::kMTiles];
#pragma unroll
    for (int i = 0; i < T::kMTiles; ++i)
      load_block_fragments(s_codes, s_scales, (cwg * 4 * T::kMTiles + i * 4 + warp) * layout::kChunkBlocks + kb, lane,
                           code[i], mult[i]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t afrag[T::kMTiles][4];
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i) widen_step(code[i], mult[i], kk, afrag[i]);
      const uint64_t desc = chunk_desc + uint64_t((kb * T::kActHalfBytes + kk * 32) >> 4);
      ptx::wgmma_fence();
#pragma unroll
      for (int i = 0; i < T::kMTiles; ++i)
        ptx::wgmma_bf16_rs<kN>(*reinterpret_cast<float(*)[kN / 2]>(&acc[i][0]), afrag[i], desc,
                               first && kb == 0 && kk == 0);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();
      if (kb == 0 && kk == 0 && release >= 0) {  // the previous chunk's wgmmas are complete
        ptx::mbarrier_arrive(&empty[release]);
        release = -1;
      }
    }
  }
}

// The 16 accumulators of epilogue turn t (m64 tile t / kTurns, its n8 tiles 4 (t % kTurns) ..
// + 3), copied out by a chain of constant-index selections, so that one rolled loop serves every
// turn (kTurns = kTokens / 32 per tile).
template <class T, int kT = 0>
__device__ __forceinline__ void turn_accumulators(const WgAccumulators<T>& acc, int t, float (&x)[16]) {
  constexpr int kTurns = T::kTokens / 32;
  if constexpr (kT < T::kMTiles * kTurns) {
    if (t == kT) {
#pragma unroll
      for (int c = 0; c < 16; ++c) x[c] = acc[kT / kTurns][kT % kTurns * 16 + c];
    } else {
      turn_accumulators<T, kT + 1>(acc, t, x);
    }
  }
}

// f(t, q0, x) for each turn t of a unit `width` tokens wide, as one rolled loop: q0 is the turn's
// first n8 tile, x its 16 accumulators.
template <class T, class F>
__device__ __forceinline__ void for_each_turn(const WgAccumulators<T>& acc, int width, F&& f) {
  constexpr int kTurns = T::kTokens / 32;
#pragma unroll 1
  for (int t = 0; t < T::kMTiles * kTurns; ++t) {
    const int q0 = t % kTurns * 4;
    if (q0 * 8 >= width) continue;
    float x[16];
    turn_accumulators<T>(acc, t, x);
    f(t, q0, x);
  }
}

// GEMM1's unstaged epilogue (A16): act(h_gate, h_up) of 32 tokens x this warp's 8 outputs per turn,
// stored as bf16. NOTE: a rolled loop: unrolled over turns and m64 tiles, the epilogues' code
// missed the instruction cache at every unit (ncu, local28 T = 1024: "no instruction" stalls 1.62
// per issue in mxfp8 against 0.47); rolled, a16 local28 T = 128 and 512 and ep16 T = 8192 ran 4-6 %
// faster, T = 4096 1 % slower (bench/NOTES.md, Session 21).
template <class T>
__device__ __forceinline__ void store_activation(const ExpertGemmArgs& a, const GemmOutput& out, const WgUnit& unit,
                                                 int width, int cwg, int warp, int lane, WgAccumulators<T>& acc) {
  constexpr int kTurns = T::kTokens / 32;
  const int g = lane / 4, col0 = 2 * (lane % 4), out_cols = a.N / 2;
  for_each_turn<T>(acc, width, [&](int t, int q0, const float (&x)[16]) {
    const int j = (unit.group * layout::kGroupRowBlocks + cwg * 4 * T::kMTiles + t / kTurns * 4 + warp) * 8 + g;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (q0 + q) * 8 + col0 + h;
        if (r < unit.tile.z && j < out_cols)
          out.inter[int64_t(unit.tile.y + r) * out_cols + j] =
              float_to_bf16_bits(fast_activation(out.activation, out.params, x[4 * q + h], x[4 * q + 2 + h]));
      }
  });
}

// GEMM2's epilogue: the fp32 rows, by the same turns.
template <class T>
__device__ __forceinline__ void store_rows(const ExpertGemmArgs& a, const GemmOutput& out, const WgUnit& unit,
                                           int width, int cwg, int warp, int lane, WgAccumulators<T>& acc) {
  constexpr int kTurns = T::kTokens / 32;
  const int g = lane / 4, col0 = 2 * (lane % 4);
  for_each_turn<T>(acc, width, [&](int t, int q0, const float (&x)[16]) {
    const int row_block = unit.group * layout::kGroupRowBlocks + cwg * 4 * T::kMTiles + t / kTurns * 4 + warp;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = (q0 + q) * 8 + col0 + c % 2, n = row_block * 16 + g + 8 * (c / 2);
        if (r < unit.tile.z && n < a.N) out.rows[int64_t(unit.tile.y + r) * a.N + n] = x[4 * q + c];
      }
  });
}

// The staged epilogue (T::kStaged): the consumers write a unit's accumulators (or activation
// values) to shared memory and go on to the next unit; the epilogue warpgroup stores them. Token
// row r holds output j's {gate, up} at byte 8 j (its activation at byte 4 j), permuted in two ways
// that keep both sides at the wavefronts their bytes need: the pieces of each 128-byte bank window
// by r / 2, for the consumers' stores (a warp's rows r, r + 2, r + 4, r + 6: two wavefronts; one),
// and the 16-byte pieces inside each aligned 64- (32-) byte run by bits 7-8 (7) of the byte, for
// the epilogue warpgroup's loads (8 lanes of one row, 64 (32) contiguous bytes each: one wavefront
// per 16-byte load; the consumers' runs stay in place).
template <class T>
__device__ __forceinline__ int staged_offset(int r, int byte) {
  if constexpr (T::kStaging == Staging::Accumulators)
    return r * 1024 + (byte ^ (((r >> 1) & 1) << 6) ^ (((byte >> 7) & 3) << 4));
  else
    return r * 512 + (byte ^ (((r >> 1) & 3) << 5) ^ (((byte >> 7) & 1) << 4));
}

// What the epilogue warpgroup needs of a staged unit: its tile ({local expert, first row, rows,
// 0}; 0 rows: no more units), row group and tile index.
struct StagedUnit {
  int4 tile;
  int group, tile_index;
};

template <class T>
__device__ __forceinline__ void stage_accumulators(uint8_t* staging, int width, int cwg, int warp, int lane,
                                                   const WgAccumulators<T>& acc) {
  const int g = lane / 4, col0 = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < T::kMTiles; ++i) {
    const int j = (cwg * 4 * T::kMTiles + i * 4 + warp) * 8 + g;
#pragma unroll
    for (int q = 0; q < T::kTokens / 8; ++q)
      if (q * 8 < width)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(staging + staged_offset<T>(q * 8 + col0 + h, j * 8)) =
              make_float2(acc[i][4 * q + h], acc[i][4 * q + 2 + h]);
  }
}

// Staging::Activations: act(h_gate, h_up) by the epilogue's turns.
template <class T>
__device__ __forceinline__ void stage_activations(uint8_t* staging, const GemmOutput& out, int width, int cwg,
                                                  int warp, int lane, const WgAccumulators<T>& acc) {
  constexpr int kTurns = T::kTokens / 32;
  const int g = lane / 4, col0 = 2 * (lane % 4);
  for_each_turn<T>(acc, width, [&](int t, int q0, const float (&x)[16]) {
    const int j = (cwg * 4 * T::kMTiles + t / kTurns * 4 + warp) * 8 + g;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float*>(staging + staged_offset<T>((q0 + q) * 8 + col0 + h, j * 4)) =
            fast_activation(out.activation, out.params, x[4 * q + h], x[4 * q + 2 + h]);
  });
}

// The epilogue warpgroup: per staged unit, act(h_gate, h_up) of 8 consecutive outputs of a token
// row per thread and step as bf16 (A16) or MXFP8 (a group of 32 outputs = 4 lanes: two shuffles and
// one scale per 8 values), 16 lanes storing a row's 256 contiguous bytes; then it frees the
// staging, and counts the unit's stores for GEMM2 as its consumer warpgroups would have. NOTE: with
// 2 outputs per thread (a group over 16 lanes, four shuffles and a scale per 2 values) the MXFP8
// rounding kept this warpgroup busy longer than the consumers' next unit: GEMM1 at local28 T = 128
// ran 246 us against 207 without the rounding (bench/NOTES.md, Session 35).
constexpr int kEpilogueBarrier = 6;
constexpr int kDrainOutputs = 8;  // per thread and step
template <class T>
__device__ __forceinline__ void drain_staging(const ExpertGemmArgs& a, const GemmOutput& out, const uint8_t* staging,
                                              const StagedUnit* s_unit, uint64_t* full, uint64_t* empty) {
  constexpr int kRowThreads = 128 / kDrainOutputs;  // a row group's 128 outputs
  constexpr int kGroupThreads = 32 / kDrainOutputs;  // an MX group's 32
  const int tid = threadIdx.x % 128, out_cols = a.N / 2;
  const bool mx = out.mode == Mode::Mxfp8;
  for (int n = 0;; ++n) {
    ptx::mbarrier_wait_parity(full, n & 1);
    const StagedUnit unit = *s_unit;
    if (unit.tile.z == 0) break;
    const int j0 = unit.group * layout::kGroupRowBlocks * 8;
    // Whole warps take every step (the shuffles).
    const int steps = (unit.tile.z * kRowThreads + 31) / 32 * 32;
#pragma unroll 1
    for (int idx = tid; idx < steps; idx += 128) {
      const int r = idx / kRowThreads, p = idx % kRowThreads, j = j0 + kDrainOutputs * p;
      const int row = min(r, unit.tile.z - 1);  // past the tile (whole warps): a row of it, not stored
      float v[kDrainOutputs];
      if constexpr (T::kStaging == Staging::Accumulators) {
#pragma unroll
        for (int i = 0; i < kDrainOutputs / 2; ++i) {
          const float4 x = *reinterpret_cast<const float4*>(staging + staged_offset<T>(row, (4 * p + i) * 16));
          v[2 * i] = fast_activation(out.activation, out.params, x.x, x.y);
          v[2 * i + 1] = fast_activation(out.activation, out.params, x.z, x.w);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kDrainOutputs / 4; ++i) {
          const float4 x = *reinterpret_cast<const float4*>(staging + staged_offset<T>(row, (2 * p + i) * 16));
          v[4 * i] = x.x;
          v[4 * i + 1] = x.y;
          v[4 * i + 2] = x.z;
          v[4 * i + 3] = x.w;
        }
      }
      if (mx) round_group_to_mxfp8<kDrainOutputs, kGroupThreads>(v);
      uint32_t packed[kDrainOutputs / 2];
#pragma unroll
      for (int i = 0; i < kDrainOutputs / 2; ++i)
        packed[i] = uint32_t(float_to_bf16_bits(v[2 * i])) | uint32_t(float_to_bf16_bits(v[2 * i + 1])) << 16;
      if (r < unit.tile.z && j < out_cols)
        *reinterpret_cast<uint4*>(out.inter + int64_t(unit.tile.y + r) * out_cols + j) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    ptx::mbarrier_arrive(empty);
    ptx::named_barrier_sync(kEpilogueBarrier, 128);
    if (tid == 0) ptx::red_release_gpu_add(&a.tile_info[unit.tile_index].w, T::kConsumers);
    if (tid % 32 == 0) mark_end(a.times);
  }
}

template <class T, Epilogue kEpi>
__global__ void __launch_bounds__(T::kThreads, 1)
    expert_gemm_wgmma_kernel(ExpertGemmArgs a, GemmOutput out, const __grid_constant__ CUtensorMap act_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  __shared__ __align__(8) uint64_t s_full[T::kStages], s_empty[T::kStages];
  __shared__ __align__(16) uint32_t s_rows[T::kTokens];
  __shared__ int4 s_units[T::kStages];
  __shared__ __align__(8) uint64_t s_staged_full, s_staged_empty;
  __shared__ StagedUnit s_staged_unit;
  uint8_t* staging = smem + T::kStages * T::kStageBytes;
  mark_start(a.times);
  // NOTE: GEMM2 reads GEMM1's rows after their tile's count (acquire), and the schedule, written
  // before GEMM1's CTAs released this grid, without waiting for GEMM1's end.
  static_assert(kEpi != Epilogue::GateUpRows, "K is never split on this path");
  constexpr bool kTakeUnits = kEpi == Epilogue::Rows;
  static_assert(T::kTmaRows == kTakeUnits, "GEMM2 (only) reads its token tiles by TMA");
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      // The bulk copies' arrival (GEMM1: + 128 cp.async threads).
      ptx::mbarrier_init(&s_full[s], kTakeUnits ? 1 : 1 + 128);
      // NOTE: every consumer thread arrives, after its own reads of the stage. One arrival per warp
      // (lane 0's) left the other lanes' code-word loads unordered before the producer's next bulk
      // copy into the stage (the wgmmas that consumed them converge the warp but order no memory):
      // racecheck reported write-after-read hazards (N = 96 tiles, MXFP8, H 512), and a __syncwarp
      // before lane 0's arrival makes ptxas serialize the wgmmas (bench/NOTES.md, Session 52).
      ptx::mbarrier_init(&s_empty[s], 128 * T::kConsumers);
    }
    if constexpr (T::kStaged) {
      ptx::mbarrier_init(&s_staged_full, 128 * T::kConsumers);
      ptx::mbarrier_init(&s_staged_empty, 128);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (!kTakeUnits || a.gemm1_stores_per_tile == 0) {
    ptx::griddepcontrol_wait();
    if (threadIdx.x == 0) mark_wait(a.times);
  }
  ptx::griddepcontrol_launch_dependents();
  const int row_groups = (a.N + T::kRowsPerCta - 1) / T::kRowsPerCta;
  const int num_units = *a.num_tiles * row_groups;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    produce<T, kTakeUnits>(a, &act_map, smem, s_full, s_empty, s_rows, s_units, num_units, row_groups);
    // GEMM2's end must imply GEMM1's (the combine and the next forward wait on GEMM2 alone), also
    // where it read GEMM1's rows through the tiles' counts and never waited above.
    if constexpr (kTakeUnits) ptx::griddepcontrol_wait();
    return;
  }
  if (T::kStaged && wg == 1 + T::kConsumers) {
    ptx::setmaxnreg_dec<T::kEpilogueRegs>();
    drain_staging<T>(a, out, staging, &s_staged_unit, &s_staged_full, &s_staged_empty);
    return;
  }
  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  const int cwg = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int chunks = a.K / T::kChunkK;
  WgAccumulators<T> acc;
  int seq = 0, release = -1, staged = 0;
  // T::kStaged: hands the staging (after its previous unit was drained) to the epilogue warpgroup.
  auto stage_unit = [&](const int4& tile, int group, int tile_index, auto&& write) {
    if (staged > 0) ptx::mbarrier_wait_parity(&s_staged_empty, (staged - 1) & 1);
    write();
    if (threadIdx.x == 128) s_staged_unit = {tile, group, tile_index};
    ptx::mbarrier_arrive(&s_staged_full);
    ++staged;
  };
  // The unit whose first stage is stage seq: the producer's (kTakeUnits: `taken`, and 0, or
  // num_units past the last), else the next of this CTA's.
  WgUnit taken;
  auto next_unit = [&](int u) {
    if constexpr (!kTakeUnits) return u + int(gridDim.x);
    ptx::mbarrier_wait_parity(&s_full[seq % T::kStages], (seq / T::kStages) & 1);
    const int4 s = s_units[seq % T::kStages];
    taken = {make_int4(s.x, s.y, s.z, 0), s.w};
    return s.z > 0 ? 0 : num_units;
  };
  for (int u = next_unit(int(blockIdx.x) - int(gridDim.x)); u < num_units; u = next_unit(u)) {
    const WgUnit unit = kTakeUnits ? taken : wg_unit(a, u, row_groups);
    const int width = unit_width<T>(unit);
    with_width<T>(width, [&](auto n) {
      for (int c = 0; c < chunks; ++c, ++seq) {
        const int stage = seq % T::kStages;
        ptx::mbarrier_wait_parity(&s_full[stage], (seq / T::kStages) & 1);
        if constexpr (!kTakeUnits) ptx::fence_proxy_async_shared();  // the cp.async rows, seen by the tensor cores
        consume_chunk<T, n()>(smem + stage * T::kStageBytes, cwg, warp, lane, c == 0, acc, release, s_empty);
        release = stage;
      }
    });
    ptx::wgmma_wait<0>();
    ptx::mbarrier_arrive(&s_empty[release]);
    release = -1;
    if constexpr (T::kStaged) {
      stage_unit(unit.tile, unit.group, u / row_groups,
                 [&] {
                   if constexpr (T::kStaging == Staging::Accumulators)
                     stage_accumulators<T>(staging, width, cwg, warp, lane, acc);
                   else
                     stage_activations<T>(staging, out, width, cwg, warp, lane, acc);
                 });
      continue;
    }
    if constexpr (kEpi == Epilogue::Activation)
      store_activation<T>(a, out, unit, width, cwg, warp, lane, acc);
    else
      store_rows<T>(a, out, unit, width, cwg, warp, lane, acc);
    if (lane == 0) mark_end(a.times);  // per unit: after the loop, the mark made ptxas spill
    if constexpr (kEpi == Epilogue::Activation) {  // this warpgroup's rows of the unit stored, for GEMM2
      ptx::named_barrier_sync(1 + cwg, 128);
      if (threadIdx.x % 128 == 0) {
        ptx::red_release_gpu_add(&a.tile_info[u / row_groups].w, 1);
      }
    }
  }
  if constexpr (T::kStaged) stage_unit(make_int4(0, 0, 0, 0), 0, 0, [] {});
}

template <class T, Epilogue kEpi>
void configure_kernels() {
  K3MOE_CUDA_CHECK(cudaFuncSetAttribute(expert_gemm_wgmma_kernel<T, kEpi>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        T::kSmemBytes));
}

// GEMM1 staged: the accumulators where they fit beside 3 stages; at N = 128 the activation values
// in MXFP8 (the rounding is what the staging saves the consumers: against 4 consumer warpgroups
// that rounded themselves, local28 T = 512 / 4096 ran 4 / 6 % faster, bench/NOTES.md, Sessions 34
// and 35), none in A16 (there the stage the staging takes cost as much as the epilogue it moved
// or more: local28 T = 512 / 4096 +1.6 / +1.3 % in Session 34, within +-0.5 % in Session 35).
template <int kTokens>
using Gemm2Tile = WgTile<kTokens, Staging::None, true>;

template <int kTokens>
using Gemm1Staged = WgTile<kTokens, kTokens <= 96 ? Staging::Accumulators : Staging::Activations>;

template <int kTokens>
void configure_tiles() {
  configure_kernels<Gemm1Staged<kTokens>, Epilogue::Activation>();
  if constexpr (kTokens == 128) configure_kernels<WgTile<kTokens>, Epilogue::Activation>();
  configure_kernels<Gemm2Tile<kTokens>, Epilogue::Rows>();
}

using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's encoder, reached through the runtime so that the library does not link libcuda.
// Looked up first by configure_expert_gemm_wgmma_kernels (at plan creation), so that a forward
// cannot fail on it after its first kernels are enqueued.
TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    K3MOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    K3MOE_CHECK(found == cudaDriverEntryPointSuccess && fn, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<TensorMapEncoder>(fn);
  }();
  return encode;
}

// GEMM2's token rows as a TMA tensor map: act_rows rows of K bf16, read in boxes of {64 k, `box_rows`
// rows} with the 128-byte swizzle. The map holds the rows' address and goes to the kernel as a
// parameter, so each launch (and a captured graph) carries its own.
CUtensorMap rows_tensor_map(const ExpertGemmArgs& args, int box_rows) {
  const TensorMapEncoder encode = tensor_map_encoder();
  K3MOE_CHECK(args.act_rows > 0 && reinterpret_cast<uintptr_t>(args.act) % 16 == 0,
              "GEMM2's intermediate rows must be 16-byte aligned and hold >= 1 row, got ", args.act_rows, " rows at ",
              static_cast<const void*>(args.act));
  const cuuint64_t dims[2] = {cuuint64_t(args.K), cuuint64_t(args.act_rows)};
  const cuuint64_t strides[1] = {cuuint64_t(args.K) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  CUtensorMap map{};
  const CUresult status = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(args.act), dims,
                                 strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  K3MOE_CHECK(status == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(status), ") for GEMM2's rows [",
              args.act_rows, ", ", args.K, "]");
  return map;
}

template <class T, Epilogue kEpi>
void launch_kernel(const ExpertGemmArgs& args, const GemmOutput& out, cudaStream_t stream) {
  const CUtensorMap act_map = kEpi == Epilogue::Rows ? rows_tensor_map(args, T::kTokens) : CUtensorMap{};
  launch_dependent(expert_gemm_wgmma_kernel<T, kEpi>, args.sm_count, T::kThreads, T::kSmemBytes, stream, args, out,
                   act_map);
}

template <int kTokens>
void launch_tiles(const ExpertGemmArgs& args, const GemmOutput& out, bool gemm1, cudaStream_t stream) {
  if (!gemm1) return launch_kernel<Gemm2Tile<kTokens>, Epilogue::Rows>(args, out, stream);
  if constexpr (kTokens == 128)
    if (out.mode == Mode::A16) return launch_kernel<WgTile<kTokens>, Epilogue::Activation>(args, out, stream);
  return launch_kernel<Gemm1Staged<kTokens>, Epilogue::Activation>(args, out, stream);
}

}  // namespace

void configure_expert_gemm_wgmma_kernels() {
  tensor_map_encoder();
  configure_tiles<32>();
  configure_tiles<64>();
  configure_tiles<96>();
  configure_tiles<128>();
}

void launch_expert_gemm_wgmma(const ExpertGemmArgs& args, const GemmOutput& out, int tokens, int consumer_warps,
                              bool gemm1, cudaStream_t stream) {
  K3MOE_CHECK(args.splits == 1, "the wgmma expert GEMMs keep K whole, got ", args.splits, " splits");
  K3MOE_CHECK(consumer_warps == 8, "the wgmma expert GEMMs run 8 consumer warps (2 warpgroups), got ", consumer_warps);
  switch (tokens) {
    case 32: return launch_tiles<32>(args, out, gemm1, stream);
    case 64: return launch_tiles<64>(args, out, gemm1, stream);
    case 96: return launch_tiles<96>(args, out, gemm1, stream);
    case 128: return launch_tiles<128>(args, out, gemm1, stream);
    default: K3MOE_CHECK(false, "the wgmma expert GEMMs take tiles of 32, 64, 96 or 128 tokens, got ", tokens);
  }
}

}  // namespace k3moe::kernels
