// Three kernels of one computation, each one CTA; all give rows in slot order within each expert
// (no atomics). Pass 1 ranks every slot among the earlier slots of its local expert that its warp
// holds (a round of 32 slots groups equal experts with match_any) and counts them per (warp,
// expert); the counts become each (warp, expert)'s first row: a prefix over warps per expert plus
// the expert's offset from a scan over experts. Pass 2 hands out rows: that first row + the rank.
//   warp:  up to 512 slots (chosen up to 128), one warp: shuffles instead of barriers and scans;
//   block: up to 8192 slots, 32 warps of contiguous slot ranges;
//   large: any count (prefill), kPermuteLargeBlocks blocks of 32 warps over contiguous slot ranges
//          in three launches: counts per (block, expert); one block's scan of them into each
//          block's first rows (the other kernels' per-warp prefix, one level up); each block counts
//          again per warp and hands out its rows (pass 2 walks the slots again).
// NOTE: the warp and block kernels keep their loops rolled: the ids land in shared memory by
// cp.async (all in flight at once) and each slot keeps its rank there between the passes. Unrolled
// (the ranks in registers; 2,600 instructions per kernel), the one-warp kernel ended 0.3-0.7 us
// later; four rounds at a time helped only where a warp has exactly four (bench/NOTES.md,
// Session 24).
// Blocks past the permutation's in the (first) launch run PermuteArgs::rounding instead, one item
// per thread.
#include "kernels/permute.cuh"

#include "kernels/launch.cuh"
#include "kernels/mxfp8_rounding.cuh"
#include "kernels/stage_marks.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
static_assert(kPermuteMaxLocalExperts <= kThreads, "one expert per thread in the scans over experts");
constexpr int kBlockSlots = 8192;

// Every kernel's start: wait for the previous kernel and let the next one launch; blocks from
// `blocks` on then run their items of the rounding job. True for blocks 0 .. blocks - 1, the
// permutation's.
__device__ __forceinline__ bool start_permutation_block(const PermuteArgs& a, int blocks = 1) {
  mark_start(a.times);
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if (threadIdx.x == 0) mark_wait(a.times);
  if (int(blockIdx.x) < blocks) return true;
  run_mxfp8_rounding(a.rounding, int64_t(blockIdx.x - blocks) * blockDim.x + threadIdx.x);
  if (threadIdx.x == 0) mark_end(a.times);
  return false;
}

// A permutation block's end: each warp's last write.
__device__ __forceinline__ void end_permutation_warp(const PermuteArgs& a) {
  if (threadIdx.x % 32 == 0) mark_end(a.times);
}

__device__ __forceinline__ int local_of(const PermuteArgs& a, int id) {
  return (id >= a.first_expert && id < a.first_expert + a.num_local) ? id - a.first_expert : -1;
}

// A slot between the passes of the decode kernels: -1 (not local), else its rank among the earlier
// slots of its expert that its warp holds, above the local expert's bits.
constexpr int kExpertBits = 10;
static_assert(kPermuteMaxLocalExperts == 1 << kExpertBits);
__device__ __forceinline__ int32_t slot_entry(int local, int rank) {
  return local < 0 ? -1 : (rank << kExpertBits) | local;
}
__device__ __forceinline__ int entry_expert(int32_t entry) { return entry & ((1 << kExpertBits) - 1); }
__device__ __forceinline__ int entry_rank(int32_t entry) { return entry >> kExpertBits; }

// This lane's ids of slots [begin, end) into s_entry, all in flight at once; the warp's counts
// ([num_local]) zeroed meanwhile. The warp's lanes see every id after it.
__device__ __forceinline__ void load_warp_ids(const PermuteArgs& a, int32_t* s_entry, int begin, int end,
                                              int32_t* counts) {
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int s = begin + lane; s < end; s += 32) ptx::cp_async_4(s_entry + s, a.ids + s);
#pragma unroll 1
  for (int e = lane; e < a.num_local; e += 32) counts[e] = 0;
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncwarp();
}

// Pass 1 over a warp's slots [begin, end), whose ids s_entry holds: each becomes its entry, and
// counts[e] the warp's rows of expert e.
__device__ __forceinline__ void rank_warp_slots(const PermuteArgs& a, int32_t* s_entry, int begin, int end,
                                                int32_t* counts) {
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int base = begin; base < end; base += 32) {
    const int s = base + lane;
    const int local = s < end ? local_of(a, s_entry[s]) : -1;
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, local), before = peers & ptx::lanemask_lt();
    const int rank = local >= 0 ? counts[local] + __popc(before) : 0;
    __syncwarp();
    if (local >= 0 && before == 0) counts[local] += __popc(peers);
    __syncwarp();
    if (s < end) s_entry[s] = slot_entry(local, rank);
  }
}

// The block kernel's scans shuffle one value where one is needed, and only in the warps that hold
// one (with all 32 warps shuffling two, the stage ended 0.3 us later at ep16 T = 256; bench/NOTES.md,
// Sessions 24-25).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll 1
  for (int offset = 1; offset < 32; offset *= 2) {
    const int x = __shfl_up_sync(0xFFFFFFFFu, v, offset);
    if (lane >= offset) v += x;
  }
  return v;
}
__device__ __forceinline__ int2 warp_inclusive_sum(int2 v, int lane) {
#pragma unroll 1
  for (int offset = 1; offset < 32; offset *= 2) {
    const int x = __shfl_up_sync(0xFFFFFFFFu, v.x, offset), y = __shfl_up_sync(0xFFFFFFFFu, v.y, offset);
    if (lane >= offset) v = make_int2(v.x + x, v.y + y);
  }
  return v;
}

// Expert e's token tiles in the schedule, from `first_tile`.
__device__ __forceinline__ void write_tiles(const PermuteArgs& a, int e, int32_t first_row, int32_t rows,
                                            int32_t first_tile) {
  for (int t = 0; t * a.tile_rows < rows; ++t)
    a.tile_info[first_tile + t] =
        make_int4(e, first_row + t * a.tile_rows, min(a.tile_rows, rows - t * a.tile_rows), 0);
}

// Turns the per-(warp, expert) counts in `warp_rows` ([kWarps][num_local]) into each one's first
// row, writes the experts' offsets and the GEMMs' tile schedule, and zeroes the unit counters.
// `expert_rows` ([num_local]) ends as each expert's first row. Every thread of the block calls it.
__device__ __forceinline__ void assign_first_rows(const PermuteArgs& a, int32_t* warp_rows, int32_t* expert_rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  // Per expert, lane w holds warp w's count: an exclusive prefix over the warps.
  for (int e = warp; e < a.num_local; e += kWarps) {
    const int32_t count = warp_rows[lane * a.num_local + e];
    const int32_t upto = warp_inclusive_sum(count, lane);
    warp_rows[lane * a.num_local + e] = upto - count;
    if (lane == 31) expert_rows[e] = upto;
  }
  __syncthreads();
  // Thread e: expert e's rows and tiles, an exclusive scan over the warps that hold experts, then
  // over their sums (the other warps only meet the barriers).
  __shared__ int2 s_warp_sums[kWarps];
  const int e = threadIdx.x, expert_warps = (a.num_local + 31) / 32;
  const int32_t rows = e < a.num_local ? expert_rows[e] : 0;
  const int32_t tiles = (rows + a.tile_rows - 1) / a.tile_rows;
  int2 incl = make_int2(0, 0);
  if (warp < expert_warps) {
    incl = warp_inclusive_sum(make_int2(rows, tiles), lane);
    if (lane == 31) s_warp_sums[warp] = incl;
  }
  __syncthreads();
  if (warp == 0)
    s_warp_sums[lane] = warp_inclusive_sum(lane < expert_warps ? s_warp_sums[lane] : make_int2(0, 0), lane);
  __syncthreads();
  if (warp > 0) incl = make_int2(incl.x + s_warp_sums[warp - 1].x, incl.y + s_warp_sums[warp - 1].y);
  const int32_t first_row = incl.x - rows, first_tile = incl.y - tiles;
  if (e < a.num_local) {
    a.expert_offset[e] = first_row;
    expert_rows[e] = first_row;
    write_tiles(a, e, first_row, rows, first_tile);
  }
  if (threadIdx.x == 0) {
    a.expert_offset[a.num_local] = s_warp_sums[kWarps - 1].x;
    *a.num_tiles = s_warp_sums[kWarps - 1].y;
    a.unit_counters[0] = a.unit_counters[1] = 0;
  }
  __syncthreads();
}

// The 32-warp kernels' shared memory: counts per (warp, expert) [kWarps][num_local], then one row
// per expert [num_local], then (block kernel) one entry per slot.
struct BlockCounts {
  int32_t* warp_rows;
  int32_t* expert_rows;
};
__device__ __forceinline__ BlockCounts block_counts(const PermuteArgs& a) {
  extern __shared__ int32_t smem[];
  return {smem, smem + kWarps * a.num_local};
}

// Slot: int (decode kernels, a 32-bit division) or int64_t.
template <class Slot>
__device__ __forceinline__ void write_row(const PermuteArgs& a, Slot slot, int32_t row) {
  a.slot_row[slot] = row;
  if (row >= 0) a.row_token[row] = int32_t(slot / a.top_k);
}

// Warp w holds slots [w rounds, (w + 1) rounds) x 32, their entries in shared memory between the
// passes.
__global__ void __launch_bounds__(kThreads, 1) permute_block_kernel(PermuteArgs a) {
  const auto [warp_rows, expert_rows] = block_counts(a);
  int32_t* s_entry = expert_rows + a.num_local;  // [slots]: ids, then entries
  if (!start_permutation_block(a)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slots = a.tokens * a.top_k;
  const int per_warp = (slots + kThreads - 1) / kThreads * 32;
  const int begin = min(slots, warp * per_warp), end = min(slots, begin + per_warp);
  int32_t* counts = warp_rows + warp * a.num_local;
  load_warp_ids(a, s_entry, begin, end, counts);
  rank_warp_slots(a, s_entry, begin, end, counts);
  assign_first_rows(a, warp_rows, expert_rows);
#pragma unroll 1
  for (int s = begin + lane; s < end; s += 32) {
    const int32_t entry = s_entry[s];
    const int local = entry_expert(entry);
    write_row(a, s, entry < 0 ? -1 : expert_rows[local] + counts[local] + entry_rank(entry));
  }
  end_permutation_warp(a);
}

// The large permutation's slots of this block's warp: block b of gridDim.x owns a contiguous
// range, each of its warps a contiguous piece of it.
struct SlotRange {
  int64_t begin, end;
};
__device__ __forceinline__ SlotRange warp_slots(const PermuteArgs& a) {
  const int64_t slots = int64_t(a.tokens) * a.top_k;
  const int64_t per_block = (slots + kPermuteLargeBlocks - 1) / kPermuteLargeBlocks;
  const int64_t block_begin = min(slots, blockIdx.x * per_block), block_end = min(slots, block_begin + per_block);
  const int64_t per_warp = (block_end - block_begin + kWarps - 1) / kWarps;
  const int64_t begin = min(block_end, block_begin + (threadIdx.x / 32) * per_warp);
  return {begin, min(block_end, begin + per_warp)};
}

// Pass 1: this warp's rows per expert into counts ([num_local], the warp's own), from zero.
__device__ __forceinline__ void count_warp_slots(const PermuteArgs& a, SlotRange range, int32_t* counts) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < a.num_local; e += 32) counts[e] = 0;
  __syncwarp();
  for (int64_t base = range.begin; base < range.end; base += 32) {
    const int le = base + lane < range.end ? local_of(a, a.ids[base + lane]) : -1;
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, le);
    if (le >= 0 && (peers & ptx::lanemask_lt()) == 0) counts[le] += __popc(peers);
    __syncwarp();
  }
}

// Launch 1 of 3: block b's rows per expert into block_rows[b].
__global__ void __launch_bounds__(kThreads, 1) permute_large_count_kernel(PermuteArgs a) {
  const auto [warp_rows, expert_rows] = block_counts(a);
  if (!start_permutation_block(a, kPermuteLargeBlocks)) return;
  count_warp_slots(a, warp_slots(a), warp_rows + (threadIdx.x / 32) * a.num_local);
  __syncthreads();
  for (int e = threadIdx.x; e < a.num_local; e += kThreads) {
    int32_t rows = 0;
    for (int w = 0; w < kWarps; ++w) rows += warp_rows[w * a.num_local + e];
    a.block_rows[int64_t(blockIdx.x) * a.num_local + e] = rows;
  }
  end_permutation_warp(a);
}

// Launch 2 of 3 (one block): the blocks' counts become their first rows, as the other kernels
// turn their warps' counts into the warps' first rows; the offsets and schedule are written.
__global__ void __launch_bounds__(kThreads, 1) permute_large_scan_kernel(PermuteArgs a) {
  static_assert(kPermuteLargeBlocks == kWarps, "assign_first_rows scans one count per warp");
  const auto [warp_rows, expert_rows] = block_counts(a);
  if (!start_permutation_block(a)) return;
  for (int i = threadIdx.x; i < kWarps * a.num_local; i += kThreads) warp_rows[i] = a.block_rows[i];
  assign_first_rows(a, warp_rows, expert_rows);
  for (int i = threadIdx.x; i < kWarps * a.num_local; i += kThreads)
    a.block_rows[i] = expert_rows[i % a.num_local] + warp_rows[i];
  end_permutation_warp(a);
}

// Launch 3 of 3: block b counts per warp again, offsets the counts from its first rows (a prefix
// over its warps) and hands out each slot's row.
__global__ void __launch_bounds__(kThreads, 1) permute_large_write_kernel(PermuteArgs a) {
  const auto [warp_rows, expert_rows] = block_counts(a);
  if (!start_permutation_block(a, kPermuteLargeBlocks)) return;
  const int lane = threadIdx.x % 32;
  const SlotRange range = warp_slots(a);
  int32_t* counts = warp_rows + (threadIdx.x / 32) * a.num_local;
  count_warp_slots(a, range, counts);
  __syncthreads();
  for (int e = threadIdx.x; e < a.num_local; e += kThreads) {
    int32_t next = a.block_rows[int64_t(blockIdx.x) * a.num_local + e];
    for (int w = 0; w < kWarps; ++w) {
      const int32_t rows = warp_rows[w * a.num_local + e];
      warp_rows[w * a.num_local + e] = next;
      next += rows;
    }
  }
  __syncthreads();
  for (int64_t base = range.begin; base < range.end; base += 32) {
    const int64_t slot = base + lane;
    const int le = slot < range.end ? local_of(a, a.ids[slot]) : -1;
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, le), before = peers & ptx::lanemask_lt();
    const int32_t row = le >= 0 ? counts[le] + __popc(before) : -1;
    __syncwarp();
    if (le >= 0 && before == 0) counts[le] += __popc(peers);
    __syncwarp();
    if (slot < range.end) write_row(a, slot, row);
  }
  end_permutation_warp(a);
}

constexpr int kWarpSlots = 512;
constexpr int kWarpAutoSlots = 128;  // beyond, the block kernel is faster (Session 10)
// Beyond, the large permutation's three launches over 32 blocks are faster than one block (on the
// H200: 8192 slots 16.8 us in one block, 65,536 in 8.9 us over 32; bench/NOTES.md, Session 19).
constexpr int kBlockAutoSlots = 4096;

__global__ void __launch_bounds__(32, 1) permute_warp_kernel(PermuteArgs a) {
  extern __shared__ int32_t expert_rows[];  // [num_local]: rows per expert, then each one's first row
  int32_t* s_entry = expert_rows + a.num_local;  // [slots]: ids, then entries
  if (!start_permutation_block(a)) return;
  const int lane = threadIdx.x;
  const int slots = a.tokens * a.top_k;
  load_warp_ids(a, s_entry, 0, slots, expert_rows);
  rank_warp_slots(a, s_entry, 0, slots, expert_rows);

  // Experts 32 at a time: inclusive scans of rows and tiles give each expert's first row and
  // first tile; its tiles go to the schedule.
  int rows_before = 0, tiles_before = 0;
  for (int e0 = 0; e0 < a.num_local; e0 += 32) {
    const int e = e0 + lane;
    const int count = e < a.num_local ? expert_rows[e] : 0;
    const int tiles = (count + a.tile_rows - 1) / a.tile_rows;
    const int2 incl = warp_inclusive_sum(make_int2(count, tiles), lane);
    const int rows_incl = incl.x, tiles_incl = incl.y;
    const int first_row = rows_before + rows_incl - count, first_tile = tiles_before + tiles_incl - tiles;
    if (e < a.num_local) {
      a.expert_offset[e] = first_row;
      expert_rows[e] = first_row;
      write_tiles(a, e, first_row, count, first_tile);
    }
    rows_before += __shfl_sync(0xFFFFFFFFu, rows_incl, 31);
    tiles_before += __shfl_sync(0xFFFFFFFFu, tiles_incl, 31);
  }
  if (lane == 0) {
    a.expert_offset[a.num_local] = rows_before;
    *a.num_tiles = tiles_before;
    a.unit_counters[0] = a.unit_counters[1] = 0;
  }
  __syncwarp();

#pragma unroll 1
  for (int s = lane; s < slots; s += 32) {
    const int32_t entry = s_entry[s];
    write_row(a, s, entry < 0 ? -1 : expert_rows[entry_expert(entry)] + entry_rank(entry));
  }
  end_permutation_warp(a);
}

// Counts per (warp, expert) and one row per expert, then (decode kernels) one entry per slot.
int smem_bytes(int warps, int num_local, int slots = 0) {
  return ((warps + 1) * num_local + slots) * int(sizeof(int32_t));
}

}  // namespace

void configure_permute_kernel() {
  for (auto kernel : {permute_large_count_kernel, permute_large_scan_kernel, permute_large_write_kernel})
    K3MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          smem_bytes(kWarps, kPermuteMaxLocalExperts)));
  K3MOE_CUDA_CHECK(cudaFuncSetAttribute(permute_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_bytes(kWarps, kPermuteMaxLocalExperts, kBlockSlots)));
}

void launch_permute(const PermuteArgs& args, cudaStream_t stream, PermuteKernel kernel) {
  const int64_t slots = int64_t(args.tokens) * args.top_k;
  K3MOE_CHECK(args.num_local >= 0 && args.num_local <= kPermuteMaxLocalExperts, "the permutation takes up to ",
              kPermuteMaxLocalExperts, " local experts, got ", args.num_local);
  K3MOE_CHECK(kernel != PermuteKernel::Warp || slots <= kWarpSlots, "the one-warp permutation takes up to ",
              kWarpSlots, " slots, got ", slots);
  K3MOE_CHECK(kernel != PermuteKernel::Block || slots <= kBlockSlots, "the block permutation takes up to ",
              kBlockSlots, " slots, got ", slots);
  if (kernel == PermuteKernel::Auto)
    kernel = slots <= kWarpAutoSlots ? PermuteKernel::Warp
             : slots <= kBlockAutoSlots ? PermuteKernel::Block
                                    : PermuteKernel::Large;
  const int threads = kernel == PermuteKernel::Warp ? 32 : kThreads;
  const int64_t rounding_blocks = (args.rounding.items + threads - 1) / threads;
  K3MOE_CHECK(rounding_blocks < (int64_t(1) << 31), "the MXFP8 rounding takes ", args.rounding.items,
              " items, more than one launch's blocks of ", threads);
  if (kernel == PermuteKernel::Warp)
    return launch_dependent(permute_warp_kernel, dim3(unsigned(1 + rounding_blocks)), threads,
                            smem_bytes(0, args.num_local, int(slots)), stream, args);
  if (kernel == PermuteKernel::Block)
    return launch_dependent(permute_block_kernel, dim3(unsigned(1 + rounding_blocks)), threads,
                            smem_bytes(kWarps, args.num_local, int(slots)), stream, args);
  const int smem = smem_bytes(kWarps, args.num_local);
  K3MOE_CHECK(args.block_rows != nullptr, "the large permutation needs its scratch (PermuteArgs::block_rows)");
  launch_dependent(permute_large_count_kernel, dim3(unsigned(kPermuteLargeBlocks + rounding_blocks)), threads, smem,
                   stream, args);
  launch_dependent(permute_large_scan_kernel, dim3(1), threads, smem, stream, args);
  launch_dependent(permute_large_write_kernel, dim3(unsigned(kPermuteLargeBlocks)), threads, smem, stream, args);
}

}  // namespace k3moe::kernels
