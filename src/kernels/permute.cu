// Two kernels of one computation, both one CTA. Up to kWarpSlots slots (decode), one warp keeps
// every slot's local expert in registers and replaces the block's barriers and scans with warp
// shuffles. Beyond, 4 warps (up to 4096 slots) or 32: warp w owns a contiguous range of slots.
// Pass 1 counts, per warp and local expert, the warp's slots (a round of 32 slots groups equal
// experts with match_any). The counts are turned into each (warp, expert)'s first row: a prefix
// over warps per expert, plus the expert's offset from a block-wide scan. Pass 2 walks the same
// slots again and hands out rows: base of (warp, expert) + rank among the round's lanes of that
// expert. Both give rows in slot order within each expert: the same outputs.
#include "kernels/permute.cuh"

#include <cub/block/block_scan.cuh>

#include "kernels/launch.cuh"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::kernels {
namespace {

constexpr int kSmallThreads = 128, kLargeThreads = 1024;
constexpr int kSmallSlots = 4096;  // up to here 4 warps beat 32 (fewer barriers and prefix steps)
static_assert(kPermuteMaxLocalExperts <= 32767, "local experts fit the small kernel's int16 copy");

__device__ __forceinline__ int local_of(const PermuteArgs& a, int id) {
  return (id >= a.first_expert && id < a.first_expert + a.num_local) ? id - a.first_expert : -1;
}

// The local expert of a slot: from `staged` (the small kernel's copy of every slot's local expert,
// loaded at once so the passes below do not wait on a global load per round) or from the ids.
template <bool kStaged>
__device__ __forceinline__ int local_expert(const PermuteArgs& a, const int16_t* staged, int64_t slot, int64_t end) {
  if (slot >= end) return -1;
  if constexpr (kStaged) return staged[slot];
  return local_of(a, a.ids[slot]);
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1) permute_kernel(PermuteArgs a) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kExpertsPerThread = kPermuteMaxLocalExperts / kThreads;
  constexpr bool kStaged = kThreads == kSmallThreads;
  extern __shared__ int32_t next_row[];  // [kWarps][num_local]
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int16_t s_local[kStaged ? kSmallSlots : 1];
  __shared__ uint32_t s_peers[kStaged ? kSmallSlots : 1];  // pass 1's match_any, reused by pass 2
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t slots = int64_t(a.tokens) * a.top_k;
  const int64_t per_warp = (slots + kWarps - 1) / kWarps;
  const int64_t begin = min(slots, warp * per_warp), end = min(slots, begin + per_warp);
  int32_t* my_rows = next_row + warp * a.num_local;
  if constexpr (kStaged) {
    for (int64_t i = threadIdx.x; i < slots; i += kThreads) s_local[i] = int16_t(local_of(a, a.ids[i]));
    __syncthreads();
  }

  for (int e = lane; e < a.num_local; e += 32) my_rows[e] = 0;
  __syncwarp();
  for (int64_t base = begin; base < end; base += 32) {
    const int le = local_expert<kStaged>(a, s_local, base + lane, end);
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, le);
    if (kStaged && base + lane < end) s_peers[base + lane] = peers;  // NOTE: past `end` is the next warp's
    if (le >= 0 && (peers & ptx::lanemask_lt()) == 0) my_rows[le] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  // Per expert: exclusive prefix over warps, then the experts' offsets (thread t owns experts
  // t * kExpertsPerThread + i, the blocked arrangement of the scan).
  int32_t total[kExpertsPerThread], offset[kExpertsPerThread];
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    total[i] = 0;
    if (e < a.num_local) {
      for (int w = 0; w < kWarps; ++w) {
        const int32_t c = next_row[w * a.num_local + e];
        next_row[w * a.num_local + e] = total[i];
        total[i] += c;
      }
    }
  }
  int32_t all_rows = 0;
  Scan(scan_storage).ExclusiveSum(total, offset, all_rows);
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    if (e < a.num_local) {
      a.expert_offset[e] = offset[i];
      for (int w = 0; w < kWarps; ++w) next_row[w * a.num_local + e] += offset[i];
    }
  }
  if (threadIdx.x == 0) a.expert_offset[a.num_local] = all_rows;

  // The GEMMs' schedule: each expert's token tiles, numbered by expert.
  int32_t tiles[kExpertsPerThread], tile_index[kExpertsPerThread];
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) tiles[i] = (total[i] + a.tile_rows - 1) / a.tile_rows;
  int32_t all_tiles = 0;
  __syncthreads();
  Scan(scan_storage).ExclusiveSum(tiles, tile_index, all_tiles);
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i)
    for (int t = 0; t < tiles[i]; ++t)
      a.tile_info[tile_index[i] + t] = make_int4(threadIdx.x * kExpertsPerThread + i, offset[i] + t * a.tile_rows,
                                                 min(a.tile_rows, total[i] - t * a.tile_rows), 0);
  if (threadIdx.x == 0) {
    *a.num_tiles = all_tiles;
    a.unit_counters[0] = a.unit_counters[1] = 0;
  }
  __syncthreads();

  for (int64_t base = begin; base < end; base += 32) {
    const int64_t slot = base + lane;
    const int le = local_expert<kStaged>(a, s_local, slot, end);
    // Lanes past `end` (le = -1) never use their peers.
    const uint32_t peers = kStaged ? (slot < end ? s_peers[slot] : 0u) : __match_any_sync(0xFFFFFFFFu, le);
    int32_t row = -1;
    if (le >= 0) row = my_rows[le] + __popc(peers & ptx::lanemask_lt());
    __syncwarp();
    if (le >= 0 && (peers & ptx::lanemask_lt()) == 0) my_rows[le] += __popc(peers);
    __syncwarp();
    if (slot < end) {
      a.slot_row[slot] = row;
      if (row >= 0) a.row_token[row] = int32_t(slot / a.top_k);
    }
  }
}

constexpr int kWarpSlots = 512;
constexpr int kWarpRounds = kWarpSlots / 32;

__global__ void __launch_bounds__(32, 1) permute_warp_kernel(PermuteArgs a) {
  extern __shared__ int32_t next_row[];  // [num_local]: counts, then each expert's next row
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  const int lane = threadIdx.x;
  const int slots = a.tokens * a.top_k;
  int local[kWarpRounds];  // slot 32 i + lane's local expert, -1 if none
#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i) local[i] = 32 * i + lane < slots ? local_of(a, a.ids[32 * i + lane]) : -1;
  for (int e = lane; e < a.num_local; e += 32) next_row[e] = 0;
  __syncwarp();
  uint32_t peers[kWarpRounds];  // the lanes of round i with slot 32 i + lane's expert (pass 2 reuses them)
#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i) {
    if (32 * i >= slots) break;
    peers[i] = __match_any_sync(0xFFFFFFFFu, local[i]);
    if (local[i] >= 0 && (peers[i] & ptx::lanemask_lt()) == 0) next_row[local[i]] += __popc(peers[i]);
    __syncwarp();
  }

  // Experts 32 at a time: inclusive scans of rows and tiles give each expert's first row and
  // first tile; its tiles go to the schedule.
  int rows_before = 0, tiles_before = 0;
  for (int e0 = 0; e0 < a.num_local; e0 += 32) {
    const int e = e0 + lane;
    const int count = e < a.num_local ? next_row[e] : 0;
    const int tiles = (count + a.tile_rows - 1) / a.tile_rows;
    int rows_incl = count, tiles_incl = tiles;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int r = __shfl_up_sync(0xFFFFFFFFu, rows_incl, offset), t = __shfl_up_sync(0xFFFFFFFFu, tiles_incl, offset);
      if (lane >= offset) {
        rows_incl += r;
        tiles_incl += t;
      }
    }
    const int first_row = rows_before + rows_incl - count, first_tile = tiles_before + tiles_incl - tiles;
    if (e < a.num_local) {
      a.expert_offset[e] = first_row;
      next_row[e] = first_row;
      for (int t = 0; t < tiles; ++t)
        a.tile_info[first_tile + t] =
            make_int4(e, first_row + t * a.tile_rows, min(a.tile_rows, count - t * a.tile_rows), 0);
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

#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i) {
    if (32 * i >= slots) break;
    const int slot = 32 * i + lane;
    const int32_t row = local[i] >= 0 ? next_row[local[i]] + __popc(peers[i] & ptx::lanemask_lt()) : -1;
    __syncwarp();
    if (local[i] >= 0 && (peers[i] & ptx::lanemask_lt()) == 0) next_row[local[i]] += __popc(peers[i]);
    __syncwarp();
    if (slot < slots) {
      a.slot_row[slot] = row;
      if (row >= 0) a.row_token[row] = slot / a.top_k;
    }
  }
}

int smem_bytes(int threads, int num_local) { return threads / 32 * num_local * int(sizeof(int32_t)); }

}  // namespace

void configure_permute_kernel() {
  K3MOE_CUDA_CHECK(cudaFuncSetAttribute(permute_kernel<kLargeThreads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_bytes(kLargeThreads, kPermuteMaxLocalExperts)));
}

void launch_permute(const PermuteArgs& args, cudaStream_t stream, PermuteKernel kernel) {
  const int64_t slots = int64_t(args.tokens) * args.top_k;
  K3MOE_CHECK(kernel != PermuteKernel::Warp || slots <= kWarpSlots, "the one-warp permutation takes up to ",
              kWarpSlots, " slots, got ", slots);
  if (kernel == PermuteKernel::Warp || (kernel == PermuteKernel::Auto && slots <= kWarpSlots)) {
    launch_dependent(permute_warp_kernel, 1, 32, smem_bytes(32, args.num_local), stream, args);
  } else if (slots <= kSmallSlots) {
    launch_dependent(permute_kernel<kSmallThreads>, 1, kSmallThreads, smem_bytes(kSmallThreads, args.num_local), stream,
                     args);
  } else {
    launch_dependent(permute_kernel<kLargeThreads>, 1, kLargeThreads, smem_bytes(kLargeThreads, args.num_local), stream,
                     args);
  }
}

}  // namespace k3moe::kernels
