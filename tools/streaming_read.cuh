// A kernel that only streams memory, the benchmark's read reference (bench_ceilings.cu) and
// bench/micro/stream_pipeline.cu's: 16-byte streaming loads, four in flight per thread over a grid
// stride; the xor of what a thread read goes to `sink` only if it equals a value random data does
// not produce, so the loads cannot be elided.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace k3moe::bench {
namespace {

__global__ void __launch_bounds__(1024) read_stream(const uint4* data, int64_t pieces, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < pieces; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldcs(data + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < pieces; i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

}  // namespace
}  // namespace k3moe::bench
