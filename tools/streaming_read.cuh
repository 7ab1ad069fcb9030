// A kernel that only reads memory: the benchmark's read reference (bench_ceilings.cu) and
// bench/micro/stream_pipeline.cu's with streaming loads, the L2 flush (l2_flush.cu) with loads that
// fill L2. 16-byte loads, four in flight per thread over a grid stride; the xor of what a thread
// read goes to `sink` only if it equals a value random data does not produce, so the loads cannot
// be elided.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace k3moe::bench {
namespace {

enum class L2Use {
  Stream,  // ld.global.cs: evict-first, what a pass over data read once does
  Fill,    // ld.global.cg: cached in L2 with the normal policy, displacing what was there
};

template <L2Use kUse>
__device__ __forceinline__ uint4 load(const uint4* p) {
  return kUse == L2Use::Stream ? __ldcs(p) : __ldcg(p);
}

template <L2Use kUse = L2Use::Stream>
__global__ void __launch_bounds__(1024) read_stream(const uint4* data, int64_t pieces, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < pieces; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = load<kUse>(data + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < pieces; i += stride) {
    const uint4 v = load<kUse>(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

}  // namespace
}  // namespace k3moe::bench
