#include "bench_ceilings.h"

#include <cublasLt.h>

#include "cublas_check.h"

#include <algorithm>
#include <cstdint>

#include "bench_timing.h"
#include "k3moe/error.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_buffer.h"
#include "streaming_read.cuh"

namespace k3moe::cli {
namespace {


// Random finite values of the element type: bf16 with |x| in [2^-8, 2^2), or e4m3 codes with the
// NaN codes avoided.
__global__ void fill_random(void* data, int64_t elements, int element_bits, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elements; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    if (element_bits == 16) {
      static_cast<uint16_t*>(data)[i] = uint16_t(((h >> 20) & 0x8000) | ((119 + (h % 10)) << 7) | ((h >> 8) & 0x7F));
    } else {
      uint8_t code = uint8_t(h >> 24);
      if ((code & 0x7F) == 0x7F) code ^= 1;
      static_cast<uint8_t*>(data)[i] = code;
    }
  }
}

double copy_tb_s(cudaStream_t stream, double sustain_ms, ClockWatch clock, ClockSummary* clock_summary) {
  const int64_t bytes = int64_t(4) << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random<<<1024, 256, 0, stream>>>(a.get(), bytes, 8, 1);
  const Timing t = time_ms(stream, 3, 20, [&](int) {
    K3MOE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  }, sustain_ms, clock, nullptr, Launch::Idle);
  *clock_summary = t.clock;
  return 2.0 * double(bytes) / (t.median_ms * 1e-3) / 1e12;
}

double gemm_tflop_s(cublasLtHandle_t lt, cudaStream_t stream, bool fp8, double sustain_ms, ClockWatch clock,
                    ClockSummary* clock_summary) {
  const int64_t n = 8192;
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const int64_t in_bytes = n * n * (fp8 ? 1 : 2);
  DeviceBuffer a(in_bytes), b(in_bytes), d(n * n * 2), workspace(64 << 20);
  fill_random<<<1024, 256, 0, stream>>>(a.get(), n * n, fp8 ? 8 : 16, 2);
  fill_random<<<1024, 256, 0, stream>>>(b.get(), n * n, fp8 ? 8 : 16, 3);
  K3MOE_CUDA_CHECK(cudaGetLastError());

  cublasLtMatmulDesc_t op;
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;  // "TN": what fp8 requires
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  cublasLtMatrixLayout_t la, lb, ld;
  K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, in_type, n, n, n));
  K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, in_type, n, n, n));
  K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  K3MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws_bytes = size_t(workspace.bytes());
  K3MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                          sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  K3MOE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heuristic, &found));
  K3MOE_CHECK(found > 0, "cuBLASLt has no ", fp8 ? "fp8" : "bf16", " GEMM algorithm for 8192^3");
  const float alpha = 1.0f, beta = 0.0f;
  const Timing t = time_ms(stream, 3, 20, [&](int) {
    K3MOE_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a.get(), la, b.get(), lb, &beta, d.get(), ld, d.get(), ld,
                                      &heuristic.algo, workspace.get(), ws_bytes, stream));
  }, sustain_ms, clock);
  *clock_summary = t.clock;
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  return 2.0 * double(n) * n * n / (t.median_ms * 1e-3) / 1e12;
}

}  // namespace

StreamingRead::StreamingRead() : buffer_(int64_t(2) << 30), sink_(sizeof(uint32_t)) {
  int device = 0;
  K3MOE_CUDA_CHECK(cudaGetDevice(&device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  fill_random<<<1024, 256>>>(buffer_.get(), buffer_.bytes(), 8, 4);
  K3MOE_CUDA_CHECK(cudaGetLastError());
  K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

double StreamingRead::median_us(double bytes, cudaStream_t stream, double sustain_ms) {
  const int64_t pieces = std::min(int64_t(bytes) / 16, buffer_.bytes() / 16);
  const int64_t span = buffer_.bytes() / 16 - pieces;
  struct LaunchShape {
    int blocks_per_sm, threads;
  };
  double best = 0.0;
  // The shapes follow each other at once, so the first one's sustained load holds for all three.
  for (const LaunchShape shape : {LaunchShape{2, 1024}, LaunchShape{4, 512}, LaunchShape{8, 256}}) {
    const Timing t = time_ms(stream, 3, 20, [&](int) {
      const int64_t offset = span > 0 ? next_offset_ % span : 0;
      next_offset_ += pieces + 4096;  // past what L2 may keep of the last read
      bench::read_stream<<<sm_count_ * shape.blocks_per_sm, shape.threads, 0, stream>>>(
          static_cast<const uint4*>(buffer_.get()) + offset, pieces, static_cast<uint32_t*>(sink_.get()));
      K3MOE_CUDA_CHECK(cudaGetLastError());
    }, best == 0.0 ? sustain_ms : 0.0);
    if (best == 0.0 || t.median_ms < best) best = t.median_ms;
  }
  return 1000.0 * best;
}

Ceilings measure_ceilings(int device, double sustain_ms, ClockWatch clock) {
  DeviceGuard guard(device);
  Ceilings c;
  cudaDeviceProp prop{};
  K3MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  c.gpu_name = prop.name;
  c.sm_count = prop.multiProcessorCount;
  c.l2_mb = prop.l2CacheSize / 1e6;
  K3MOE_CUDA_CHECK(cudaDriverGetVersion(&c.driver_version));
  const CudaStream stream;
  cublasLtHandle_t lt;
  K3MOE_CUBLAS_CHECK(cublasLtCreate(&lt));
  c.copy_tb_s = copy_tb_s(stream, sustain_ms, clock, &c.copy_clock);
  c.bf16_tflop_s = gemm_tflop_s(lt, stream, false, sustain_ms, clock, &c.bf16_clock);
  c.fp8_tflop_s = gemm_tflop_s(lt, stream, true, sustain_ms, clock, &c.fp8_clock);
  cublasLtDestroy(lt);
  return c;
}

}  // namespace k3moe::cli
