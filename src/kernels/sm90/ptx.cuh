// Thin wrappers over the PTX instructions the kernels use, one per instruction, named after it.
#pragma once

#include <cstdint>

namespace k3moe::ptx {

// Shared-memory address as the 32-bit value PTX's .shared state space takes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes 16 zero bytes
// (the tail of a token tile) without reading global memory.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}
// cp.async.ca 4 bytes global -> shared.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint4 ld_shared_v4(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p)));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)));
  return v;
}

// Two 8x8 b16 matrices from shared memory: lanes 0-7 address matrix 0's rows, 8-15 matrix 1's.
// Thread t receives row t/4, columns 2(t%4) and 2(t%4)+1 of each: an mma B fragment.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(row_ptr)));
}

// D = A B + D, bf16 inputs, fp32 accumulators; A 16x16 row-major, B 16x8 column-major.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Both bf16 halves of a times half kHalf of b (0: the low 16 bits), round-to-nearest-even. The
// broadcast is a PTX pack, which ptxas folds into the multiply's operand (.H0_H0 / .H1_H1); one
// asm string over a C++ `b >> 16` does not fold (an SHF per multiply), hence two strings.
template <int kHalf>
__device__ __forceinline__ uint32_t mul_bf16x2_by_half(uint32_t a, uint32_t b) {
  static_assert(kHalf == 0 || kHalf == 1);
  uint32_t d;
  if constexpr (kHalf == 0)
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 both;\nmov.b32 {lo, hi}, %2;\nmov.b32 both, {lo, lo};\n"
        "mul.rn.bf16x2 %0, %1, both;\n}\n" : "=r"(d) : "r"(a), "r"(b));
  else
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 both;\nmov.b32 {lo, hi}, %2;\nmov.b32 both, {hi, hi};\n"
        "mul.rn.bf16x2 %0, %1, both;\n}\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two E4M3 codes, round to nearest even, saturating to +-448, NaN kept; lo's in the low byte.
__device__ __forceinline__ uint16_t cvt_e4m3x2(float lo, float hi) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}

// The two E4M3 codes of `pair` as floats (exact: E4M3 widens through f16); x from the low byte.
__device__ __forceinline__ float2 widen_e4m3x2(uint16_t pair) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(pair));
  float2 v;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(v.x) : "h"(uint16_t(halves & 0xFFFFu)));
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(v.y) : "h"(uint16_t(halves >> 16)));
  return v;
}

// Lanes below this one, as a mask (for ranking within a warp).
__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;\n" : "=r"(m));
  return m;
}

}  // namespace k3moe::ptx

namespace k3moe::ptx {

// The GPU's global nanosecond timer (one clock for every SM).
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Programmatic dependent launch (sm_90): block until the grids this one depends on have finished
// and their memory is visible; a no-op when launched without the attribute.
__device__ __forceinline__ void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Ask L1 for the line of `p` (no register, no wait).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}
// Drop the 128-byte line at `p` (128-byte aligned) from L2 without writing it back to HBM; the
// memory then holds indeterminate values until it is written again. For data read for the last
// time: a weak write, so every reader of the line must have read it first.
__device__ __forceinline__ void discard_l2_line(const void* p) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p));
}
// Let the next kernel in the stream start its CTAs (they wait in griddepcontrol_wait for ours).
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// A counter other grids raise: read with acquire semantics (what their releases ordered before is
// then visible), and raised with release semantics (this thread's earlier writes, and what it
// synchronised with, become visible to such a reader first).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace k3moe::ptx

namespace k3moe::ptx {

// mbarriers and bulk (TMA, non-tensor) copies (sm_90).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes initialized mbarriers visible to the async proxy (the bulk copies' completions).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` more from bulk copies before the phase completes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Blocks until the phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16, 16-byte aligned ends) global -> shared; completes on `bar`.
__device__ __forceinline__ void cp_async_bulk_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                                  uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem_dst)),
               "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// An L2 policy for data read once: its lines are evicted first, so that a stream of them does not
// push out of L2 what later loads still need (gathered activations, partial rows, the schedule).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_bulk_g2s with an L2 cache policy for the source's lines.
__device__ __forceinline__ void cp_async_bulk_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar,
                                                  uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(smem_addr(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// A 2D tile of a tensor map (TMA) global -> shared at element coordinates {x, y} (x fastest),
// laid out as the map's swizzle says; completes on `bar` with the box's full bytes (elements
// outside the tensor are zero-filled).
__device__ __forceinline__ void cp_async_bulk_tensor_2d_g2s(void* smem_dst, const void* tensor_map, int x, int y,
                                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(smem_addr(smem_dst)),
      "l"(tensor_map), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

}  // namespace k3moe::ptx

namespace k3moe::ptx {

// Warpgroup MMA (sm_90a). A wgmma reads its register operands and shared memory asynchronously:
// wgmma_fence before it (orders earlier register writes), wgmma_commit after a batch, and
// wgmma_wait<N> before the registers or the shared memory it read are touched again.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor of a K-major operand in 128-byte-swizzle atoms (8 rows of 128
// bytes, 1024-byte aligned, stacked every 1024 bytes); `smem` is where the wgmma's 16 k start.
__device__ __forceinline__ uint64_t wgmma_desc_k_major_sw128(const void* smem) {
  const uint64_t start = (smem_addr(smem) & 0x3FFFFu) >> 4;
  constexpr uint64_t kLeading = 1, kStride = 1024 >> 4, kSwizzle128 = 1;
  return start | (kLeading << 16) | (kStride << 32) | (kSwizzle128 << 62);
}

// The operands of an m64nNk16 wgmma, in the order the asm below numbers them: the N / 2
// accumulators (%0 ..), 8 at a time, then the four A registers, the B descriptor and !zero_d.
#define K3MOE_WGMMA_R8_0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define K3MOE_WGMMA_R8_1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define K3MOE_WGMMA_R8_2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define K3MOE_WGMMA_R8_3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define K3MOE_WGMMA_R8_4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define K3MOE_WGMMA_R8_5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define K3MOE_WGMMA_R8_6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define K3MOE_WGMMA_R8_7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define K3MOE_WGMMA_REGS_16 K3MOE_WGMMA_R8_0
#define K3MOE_WGMMA_REGS_32 K3MOE_WGMMA_REGS_16 ", " K3MOE_WGMMA_R8_1
#define K3MOE_WGMMA_REGS_48 K3MOE_WGMMA_REGS_32 ", " K3MOE_WGMMA_R8_2
#define K3MOE_WGMMA_REGS_64 K3MOE_WGMMA_REGS_48 ", " K3MOE_WGMMA_R8_3
#define K3MOE_WGMMA_REGS_80 K3MOE_WGMMA_REGS_64 ", " K3MOE_WGMMA_R8_4
#define K3MOE_WGMMA_REGS_96 K3MOE_WGMMA_REGS_80 ", " K3MOE_WGMMA_R8_5
#define K3MOE_WGMMA_REGS_112 K3MOE_WGMMA_REGS_96 ", " K3MOE_WGMMA_R8_6
#define K3MOE_WGMMA_REGS_128 K3MOE_WGMMA_REGS_112 ", " K3MOE_WGMMA_R8_7
#define K3MOE_WGMMA_ACC8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define K3MOE_WGMMA_ACCS_16 K3MOE_WGMMA_ACC8(0)
#define K3MOE_WGMMA_ACCS_32 K3MOE_WGMMA_ACCS_16, K3MOE_WGMMA_ACC8(8)
#define K3MOE_WGMMA_ACCS_48 K3MOE_WGMMA_ACCS_32, K3MOE_WGMMA_ACC8(16)
#define K3MOE_WGMMA_ACCS_64 K3MOE_WGMMA_ACCS_48, K3MOE_WGMMA_ACC8(24)
#define K3MOE_WGMMA_ACCS_80 K3MOE_WGMMA_ACCS_64, K3MOE_WGMMA_ACC8(32)
#define K3MOE_WGMMA_ACCS_96 K3MOE_WGMMA_ACCS_80, K3MOE_WGMMA_ACC8(40)
#define K3MOE_WGMMA_ACCS_112 K3MOE_WGMMA_ACCS_96, K3MOE_WGMMA_ACC8(48)
#define K3MOE_WGMMA_ACCS_128 K3MOE_WGMMA_ACCS_112, K3MOE_WGMMA_ACC8(56)
#define K3MOE_WGMMA_BF16_RS(N, A0, A1, A2, A3, DESC, ZERO)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %" #ZERO ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N        \
               "k16.f32.bf16.bf16 {" K3MOE_WGMMA_REGS_##N "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DESC \
               ", p, 1, 1, 0;\n}\n"                                                                         \
               : K3MOE_WGMMA_ACCS_##N                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(uint32_t(!zero_d)))

// D (+)= A B, m64nNk16 (N = 16, 32, .., 128), fp32 accumulators: A (bf16, 64 x 16) from
// registers, each warp of the warpgroup 16 rows in the mma.sync m16n8k16 A-fragment layout; B
// (N x 16 bf16, K-major) by descriptor; D in the m16n8 accumulator layout per 8 columns.
// zero_d: D = A B.
template <int N>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                              bool zero_d) {
  static_assert(N % 16 == 0 && N >= 16 && N <= 128, "the instantiated wgmma widths");
  if constexpr (N == 16) K3MOE_WGMMA_BF16_RS(16, 8, 9, 10, 11, 12, 13);
  if constexpr (N == 32) K3MOE_WGMMA_BF16_RS(32, 16, 17, 18, 19, 20, 21);
  if constexpr (N == 48) K3MOE_WGMMA_BF16_RS(48, 24, 25, 26, 27, 28, 29);
  if constexpr (N == 64) K3MOE_WGMMA_BF16_RS(64, 32, 33, 34, 35, 36, 37);
  if constexpr (N == 80) K3MOE_WGMMA_BF16_RS(80, 40, 41, 42, 43, 44, 45);
  if constexpr (N == 96) K3MOE_WGMMA_BF16_RS(96, 48, 49, 50, 51, 52, 53);
  if constexpr (N == 112) K3MOE_WGMMA_BF16_RS(112, 56, 57, 58, 59, 60, 61);
  if constexpr (N == 128) K3MOE_WGMMA_BF16_RS(128, 64, 65, 66, 67, 68, 69);
}
#undef K3MOE_WGMMA_R8_0
#undef K3MOE_WGMMA_R8_1
#undef K3MOE_WGMMA_R8_2
#undef K3MOE_WGMMA_R8_3
#undef K3MOE_WGMMA_R8_4
#undef K3MOE_WGMMA_R8_5
#undef K3MOE_WGMMA_R8_6
#undef K3MOE_WGMMA_R8_7
#undef K3MOE_WGMMA_REGS_16
#undef K3MOE_WGMMA_REGS_32
#undef K3MOE_WGMMA_REGS_48
#undef K3MOE_WGMMA_REGS_64
#undef K3MOE_WGMMA_REGS_80
#undef K3MOE_WGMMA_REGS_96
#undef K3MOE_WGMMA_REGS_112
#undef K3MOE_WGMMA_REGS_128
#undef K3MOE_WGMMA_ACC8
#undef K3MOE_WGMMA_ACCS_16
#undef K3MOE_WGMMA_ACCS_32
#undef K3MOE_WGMMA_ACCS_48
#undef K3MOE_WGMMA_ACCS_64
#undef K3MOE_WGMMA_ACCS_80
#undef K3MOE_WGMMA_ACCS_96
#undef K3MOE_WGMMA_ACCS_112
#undef K3MOE_WGMMA_ACCS_128
#undef K3MOE_WGMMA_BF16_RS

// Raise (consumers) or lower (producers) the registers of every thread of this warpgroup.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Orders this thread's view of shared memory written through the generic proxy (cp.async, st)
// before its later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The same for global memory: generic-proxy writes (seen through an acquire), before bulk-async
// (TMA) reads of them.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// One arrival on `bar` once all of this thread's earlier cp.async copies have landed (counted in
// the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Barrier `id` (1..15) among `threads` threads of the CTA.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace k3moe::ptx
