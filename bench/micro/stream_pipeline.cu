// How fast the decode GEMMs' copy skeleton streams weights with no MMA work: persistent CTAs,
// units of `unit_chunks` contiguous chunks, each chunk one bulk copy into a ring of `stages`
// shared-memory stages (thread 0 issues, every thread waits on the stage's mbarrier, one
// __syncthreads per chunk, as expert_gemm.cu does), then `work` cycles of spinning per chunk in
// place of the widening and MMAs. Compared with a plain grid-stride read of the same bytes.
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc -Itools bench/micro/stream_pipeline.cu
// Run: ./a.out TOTAL_MB CHUNK_KB UNIT_CHUNKS [CTAS_PER_SM:STAGES:WORK ...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/sm90/ptx.cuh"
#include "streaming_read.cuh"

using namespace k3moe;

__global__ void pipeline(const uint8_t* src, int units, int unit_chunks, uint32_t chunk_bytes, int stages, int work,
                         uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[16];
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) ptx::mbarrier_init(&full[s], 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const int my_units = units > int(blockIdx.x) ? (units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int total = my_units * unit_chunks;
  auto source = [&](int i) {
    const int u = blockIdx.x + (i / unit_chunks) * gridDim.x;
    return src + (int64_t(u) * unit_chunks + i % unit_chunks) * chunk_bytes;
  };
  auto issue = [&](int i) {
    if (threadIdx.x == 0 && i < total) {
      ptx::mbarrier_arrive_expect_tx(&full[i % stages], chunk_bytes);
      ptx::cp_async_bulk_g2s(smem + (i % stages) * chunk_bytes, source(i), chunk_bytes, &full[i % stages]);
    }
  };
  for (int i = 0; i < stages - 1; ++i) issue(i);
  uint32_t acc = 0;
  for (int i = 0; i < total; ++i) {
    ptx::mbarrier_wait_parity(&full[i % stages], (i / stages) & 1);
    __syncthreads();
    issue(i + stages - 1);
    acc ^= reinterpret_cast<const uint32_t*>(smem + (i % stages) * chunk_bytes)[threadIdx.x];
    const long long t0 = clock64();
    while (clock64() - t0 < work) {
    }
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

template <class Launch>
float median_us(Launch&& launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < 23; ++r) {
    cudaEventRecord(a);
    launch(r);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    if (r >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 1000.0f * ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const double total_mb = atof(argv[1]);
  const uint32_t chunk_bytes = uint32_t(atof(argv[2]) * 1024) / 128 * 128;
  const int unit_chunks = atoi(argv[3]);
  const int64_t buffer_bytes = int64_t(2) << 30;
  uint8_t* buf;
  uint32_t* sink;
  cudaMalloc(&buf, buffer_bytes);
  cudaMalloc(&sink, 4);
  cudaMemset(buf, 0x5A, buffer_bytes);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int units = int(total_mb * 1e6 / (double(chunk_bytes) * unit_chunks) + 0.5);
  const int64_t bytes = int64_t(units) * unit_chunks * chunk_bytes;
  auto offset = [&](int r) { return (int64_t(r) * (bytes + (1 << 20))) % (buffer_bytes - bytes) / 128 * 128; };
  const float t_read = median_us([&](int r) {
    bench::read_stream<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(buf + offset(r)), bytes / 16, sink);
  });
  std::printf("%.1f MB in %d units of %d x %u B: plain read %.1f us (%.2f TB/s)\n", bytes / 1e6, units, unit_chunks,
              chunk_bytes, t_read, bytes / t_read / 1e6);
  for (int i = 4; i < argc; ++i) {
    int ctas_per_sm, stages, work;
    sscanf(argv[i], "%d:%d:%d", &ctas_per_sm, &stages, &work);
    const int smem = stages * chunk_bytes;
    cudaFuncSetAttribute(pipeline, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const float t = median_us([&](int r) {
      pipeline<<<sms * ctas_per_sm, 128, smem>>>(buf + offset(r), units, unit_chunks, chunk_bytes, stages, work, sink);
    });
    const cudaError_t e = cudaGetLastError();
    std::printf("  %d CTAs/SM x %d stages, work %5d cycles/chunk: %7.1f us (%.2f TB/s, %.3f of the plain read) %s\n",
                ctas_per_sm, stages, work, t, bytes / t / 1e6, t_read / t, e == cudaSuccess ? "" : cudaGetErrorString(e));
  }
}
