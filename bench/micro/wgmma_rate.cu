// How fast the wgmma consumers can run with the data already in shared memory: one CTA per SM of
// C consumer warpgroups (each 4 / C m64 tiles of a 256-row unit), every warpgroup looping over
// the same stage as expert_gemm_wgmma.cu's consume_chunk does (2 k-blocks x 4 16-k steps per
// chunk, wait<1> between steps). Variants per N:
//   rs       A from registers, fixed values (the tensor cores' rate for register A)
//   ss       A from shared memory by descriptor (the rate for shared A)
//   rs+widen the kernel's consumer: per step, widen the codes to bf16 in registers, wgmma (RS)
//   ss+widen the same, the widened A stored to shared memory (stmatrix, 128-byte swizzle), wgmma (SS)
//   w0       rs+widen waiting for each step's wgmmas (wait<0>) before widening the next
//   x2       two CTAs per SM;  +spin  with an idle producer warpgroup spinning on an mbarrier
//   rs+alu   rs, plus the widening into registers the wgmmas do not read (does ALU work overlap RS wgmmas?)
//   ss+alu   ss, plus the same unread widening (does it overlap wgmmas that read no registers?)
//   ss|alu   ss on C warpgroups, the unread widening on C other warpgroups (tensor and ALU in different warps)
//   rs+ping  rs+widen (C = 2), the two warpgroups issuing their wgmmas in turn (named barriers, as FA3's ping-pong)
//   rs+wint  rs+widen with an integer add in place of each bf16 multiply (wrong values; is it the multiply's pipe?)
// Prints cycles per chunk per CTA (the in-kernel N = 32 GEMM1 takes ~1,570: bench/NOTES.md, Session 15).
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/micro/wgmma_rate.cu
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/mxfp4_fragments.cuh"
#include "kernels/sm90/ptx.cuh"

using namespace k3moe;
using namespace k3moe::kernels;

#define ACC8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// D += A B, m64nNk16, A and B by descriptor (N = 32 or 64).
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc) {
  if constexpr (N == 32)
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
        "%13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;\n"
        : ACC8(0), ACC8(8)
        : "l"(a_desc), "l"(b_desc));
  if constexpr (N == 64)
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
        "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, "
        "1, 0, 0;\n"
        : ACC8(0), ACC8(8), ACC8(16), ACC8(24)
        : "l"(a_desc), "l"(b_desc));
}

__device__ __forceinline__ void stmatrix_x4(void* row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(ptx::smem_addr(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

enum Variant { kRs, kSs, kRsWiden, kSsWiden, kRsWidenWait0, kRsAlu, kSsAlu, kRsWidenInt, kSsAluSplit, kRsWidenPing };

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

constexpr int kCodeBytes = 16 * 2 * 512, kScaleBytes = 16 * 2 * 32;  // one chunk of a 256-row group
constexpr int kBBytes = 2 * 64 * 128;                               // N <= 64 rows x 2 k-halves
constexpr int kABytes = 4 * 2 * 8192;                               // 4 m64 tiles x 2 k-blocks

template <int N, int C, Variant V, int kCtas, bool kSpinner>
__global__ void __launch_bounds__(128 * (C * (V == kSsAluSplit ? 2 : 1) + kSpinner), kCtas) consumers(int chunks, float* sink, long long* cycles) {
  constexpr int kMTiles = 4 / C;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* s_b = smem;
  uint8_t* s_codes = s_b + kBBytes;
  uint8_t* s_scales = s_codes + kCodeBytes;
  uint8_t* s_a = s_scales + 1024;  // 1024-aligned; only the shared-A variants have it
  constexpr bool kSharedA = V == kSs || V == kSsWiden || V == kSsAlu || V == kSsAluSplit;
  for (int i = threadIdx.x; i < (kBBytes + kCodeBytes + (kSharedA ? kABytes : 0)) / 4;
       i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3C003C00u ^ (i * 2654435761u & 0x00FF00FFu);
  for (int i = threadIdx.x; i < kScaleBytes; i += blockDim.x) s_scales[i] = 120 + i % 8;
  __shared__ __align__(8) uint64_t s_done;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&s_done, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  ptx::fence_proxy_async_shared();
  if (kSpinner && threadIdx.x >= 128 * C) {  // a producer's idle warpgroup: spins on a barrier
    ptx::mbarrier_wait_parity(&s_done, 0);
    return;
  }
  const int cwg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  float acc[kMTiles][N / 2] = {};
  uint32_t junk = 0;
  const long long t0 = clock64();
  if constexpr (V == kSsAluSplit) {
    if (cwg >= C) {  // the ALU warpgroups: the consumers' widening, unread by any wgmma
      for (int c = 0; c < chunks; ++c)
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
            uint4 code;
            BlockMultipliers mult;
            load_block_fragments(s_codes, s_scales, ((cwg - C) * 4 * kMTiles + i * 4 + warp) * 2 + kb, lane, code, mult);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
              uint32_t unread[4];
              widen_step(code, mult, kk, unread);
              junk ^= unread[0] ^ unread[1] ^ unread[2] ^ unread[3];
            }
          }
      ptx::named_barrier_sync(8, 256 * C);
      if (junk == 0x12345u) sink[threadIdx.x] = 0.0f;
      return;
    }
  }
  if constexpr (V == kRsWidenPing) {
    static_assert(C == 2);
    if (cwg == 1) named_barrier_arrive(2, 256);  // warpgroup 0 issues first
  }
  for (int c = 0; c < chunks; ++c) {
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      uint4 code[kMTiles];
      BlockMultipliers mult[kMTiles];
      if constexpr (V != kRs && V != kSs && V != kSsAluSplit) {
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
          load_block_fragments(s_codes, s_scales, (cwg * 4 * kMTiles + i * 4 + warp) * 2 + kb, lane, code[i], mult[i]);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t afrag[kMTiles][4];
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
          if constexpr (V == kRsAlu || V == kSsAlu) {
            uint32_t unread[4];
            widen_step(code[i], mult[i], kk, unread);
            junk ^= unread[0] ^ unread[1] ^ unread[2] ^ unread[3];
#pragma unroll
            for (int r = 0; r < 4; ++r) afrag[i][r] = 0x3F803F80u + r + c;
          } else if constexpr (V == kRsWidenInt) {
            layout::widen_codes(kk == 0 ? code[i].x : kk == 1 ? code[i].y : kk == 2 ? code[i].z : code[i].w, afrag[i]);
#pragma unroll
            for (int r = 0; r < 4; ++r) afrag[i][r] += (r % 2 ? mult[i].row_g8 : mult[i].row_g);
          } else if constexpr (V != kRs && V != kSs && V != kSsAluSplit) {
            widen_step(code[i], mult[i], kk, afrag[i]);
          } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) afrag[i][r] = 0x3F803F80u + r + c;
          }
        }
        const uint64_t b_desc = ptx::wgmma_desc_k_major_sw128(s_b + kb * (kBBytes / 2) + kk * 32);
        if constexpr (V == kSsWiden) {
          // lane: row 8 (j % 2) + lane % 8 of the warp's 16, 16-byte column 2 kk + j / 2 (j = lane / 8)
          const int j = lane / 8, row = 16 * warp + 8 * (j % 2) + lane % 8, col = 2 * kk + j / 2;
#pragma unroll
          for (int i = 0; i < kMTiles; ++i)
            stmatrix_x4(s_a + ((cwg * kMTiles + i) * 2 + kb) * 8192 + (row / 8) * 1024 + (row % 8) * 128 +
                            ((col ^ (row % 8)) * 16),
                        afrag[i]);
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_sync(1 + cwg, 128);
        }
        if constexpr (V == kRsWidenPing) ptx::named_barrier_sync(2 + cwg, 256);
        ptx::wgmma_fence();
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
          if constexpr (V == kRs || V == kRsWiden || V == kRsWidenWait0 || V == kRsAlu || V == kRsWidenInt ||
                        V == kRsWidenPing) {
            ptx::wgmma_bf16_rs<N>(acc[i], afrag[i], b_desc, false);
          } else {
            wgmma_ss<N>(acc[i], ptx::wgmma_desc_k_major_sw128(s_a + ((cwg * kMTiles + i) * 2 + kb) * 8192 + kk * 32),
                        b_desc);
          }
        }
        ptx::wgmma_commit();
        if constexpr (V == kRsWidenPing) named_barrier_arrive(2 + (1 - cwg), 256);
        if constexpr (V == kRsWidenWait0) ptx::wgmma_wait<0>();
        else ptx::wgmma_wait<1>();
      }
    }
  }
  ptx::wgmma_wait<0>();
  if constexpr (V == kRsWidenPing)
    if (cwg == 0) ptx::named_barrier_sync(2, 256);  // warpgroup 1's last turn handed back
  if constexpr (V == kSsAluSplit) ptx::named_barrier_sync(8, 256 * C);
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int r = 0; r < N / 2; ++r) s += acc[i][r];
  if (s == 1.2345f || junk == 0x12345u) sink[threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (kSpinner) {
    __syncwarp();
    ptx::named_barrier_sync(7, 128 * C);
    if (threadIdx.x == 0) ptx::mbarrier_arrive(&s_done);
  }
}

// mma.sync m16n8k16 (bf16, fp32 accumulate) issued back to back by `warps` warps per CTA, each
// on 8 independent accumulators: the tensor rate the mma.sync decode kernels can reach.
__global__ void mma_sync_rate(int steps, float* sink, long long* cycles) {
  float acc[8][4] = {};
  uint32_t a[4] = {0x3F803F80u, 0x3F803F80u + threadIdx.x, 0x3F803F80u, 0x3F803F80u};
  const uint32_t b0 = 0x3F803F80u ^ threadIdx.x, b1 = 0x3F803F80u;
  const long long t0 = clock64();
  for (int s = 0; s < steps; ++s)
#pragma unroll
    for (int i = 0; i < 8; ++i) ptx::mma_bf16_16816(acc[i], a, b0, b1);
  const long long t1 = clock64();
  float sum = 0.0f;
  for (int i = 0; i < 8; ++i) sum += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  if (sum == 1.2345f) sink[threadIdx.x] = sum;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

void run_mma_sync(int sms, int warps, float* sink, long long* cycles) {
  const int steps = 4000;
  mma_sync_rate<<<sms, 32 * warps>>>(10, sink, cycles);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  mma_sync_rate<<<sms, 32 * warps>>>(steps, sink, cycles);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  long long c0 = 0;
  cudaMemcpy(&c0, cycles, sizeof c0, cudaMemcpyDeviceToHost);
  const double mmas = 8.0 * steps * warps;  // per SM
  std::printf("mma.sync m16n8k16 %2d warps/SM: %5.2f cycles per mma per SM sub-partition, %6.1f TFLOP/s  %s\n", warps,
              double(c0) / (mmas / 4), 4096.0 * mmas * sms / (ms * 1e-3) / 1e12, cudaGetErrorString(cudaGetLastError()));
}

template <int N, int C, Variant V, int kCtas = 1, bool kSpinner = false>
void run(const char* name, int sms, float* sink, long long* cycles) {
  constexpr bool kSharedA = V == kSs || V == kSsWiden || V == kSsAlu || V == kSsAluSplit;
  constexpr int kSmem = kBBytes + kCodeBytes + 1024 + (kSharedA ? kABytes : 0) + 1024;
  constexpr int kThreads = 128 * (C * (V == kSsAluSplit ? 2 : 1) + kSpinner);
  auto kernel = consumers<N, C, V, kCtas, kSpinner>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  const int chunks = 2000;
  kernel<<<sms * kCtas, kThreads, kSmem>>>(10, sink, cycles);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  kernel<<<sms * kCtas, kThreads, kSmem>>>(chunks, sink, cycles);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  long long host[1024];
  cudaMemcpy(host, cycles, sizeof(long long) * sms * kCtas, cudaMemcpyDeviceToHost);
  long long most = 0;
  for (int b = 0; b < sms * kCtas; ++b) most = host[b] > most ? host[b] : most;
  const double flop = 2.0 * 256 * 128 * N * double(chunks) * sms * kCtas;
  std::printf("N=%3d C=%d x%d %-12s %7.0f cycles/chunk  %6.3f us/chunk  %6.1f TFLOP/s  %s\n", N, C, kCtas, name,
              double(most) / chunks, 1e3 * ms / chunks, flop / (ms * 1e-3) / 1e12, cudaGetErrorString(cudaGetLastError()));
}

template <int N, int C>
void run_all(int sms, float* sink, long long* cycles) {
  run<N, C, kRs>("rs", sms, sink, cycles);
  run<N, C, kSs>("ss", sms, sink, cycles);
  run<N, C, kRsWiden>("rs+widen", sms, sink, cycles);
  run<N, C, kSsWiden>("ss+widen", sms, sink, cycles);
  run<N, C, kRsWidenWait0>("rs+widen w0", sms, sink, cycles);
  run<N, C, kRsWiden, 2>("rs+widen", sms, sink, cycles);
  run<N, C, kRsWiden, 1, true>("rs+widen+spin", sms, sink, cycles);
  run<N, C, kRsAlu>("rs+alu", sms, sink, cycles);
  run<N, C, kSsAlu>("ss+alu", sms, sink, cycles);
  run<N, C, kRsWidenInt>("rs+wint", sms, sink, cycles);
  run<N, C, kSsAluSplit>("ss|alu", sms, sink, cycles);
  if constexpr (C == 2) run<N, C, kRsWidenPing>("rs+ping", sms, sink, cycles);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink;
  long long* cycles;
  cudaMalloc(&sink, 4096);
  cudaMalloc(&cycles, sizeof(long long) * 1024);
  for (int warps : {4, 8, 12, 16}) run_mma_sync(sms, warps, sink, cycles);
  run_all<32, 2>(sms, sink, cycles);
  run_all<32, 4>(sms, sink, cycles);
  run_all<64, 2>(sms, sink, cycles);
  return 0;
}
