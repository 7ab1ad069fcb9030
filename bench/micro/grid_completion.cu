// Does a grid's completion wait for the bytes it wrote? A writer grid (2 CTAs of 256 threads per
// SM) stores `MB` MB of fp32 (or, in the read columns, only reads them); thread 0 of each CTA marks
// the global timer at its end. The next kernel in the stream marks its first CTA's start (plain
// stream order) or, launched with programmatic dependent launch and resident early, the moment its
// griddepcontrol.wait returns. Printed: the median over 21 repeats of that moment - the writer's
// last end, in us. (H200, Session 22: 0.5-2.1 us for 16-256 MB in every column: completion does
// not wait for the writes; bench/NOTES.md, Session 22 Step 6.)
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc bench/micro/grid_completion.cu
// Run: ./a.out [MB ...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/sm90/ptx.cuh"

namespace {

__device__ unsigned long long g_writer_end, g_next_start;

__global__ void writer(float* dst, long long floats, bool read_only, float* sink) {
  k3moe::ptx::griddepcontrol_launch_dependents();
  const long long stride = (long long)gridDim.x * blockDim.x;
  float acc = 0.0f;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < floats / 4; i += stride) {
    float4* p = reinterpret_cast<float4*>(dst) + i;
    if (read_only) {
      const float4 v = __ldcs(p);
      acc += v.x + v.y + v.z + v.w;
    } else {
      *p = make_float4(float(i), 1.0f, 2.0f, 3.0f);
    }
  }
  if (acc == 12345.0f) *sink = acc;
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&g_writer_end, k3moe::ptx::globaltimer());
}

__global__ void next(bool dependent) {
  if (dependent) k3moe::ptx::griddepcontrol_wait();
  if (threadIdx.x == 0) atomicMin(&g_next_start, k3moe::ptx::globaltimer());
}

void check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
}

double gap_us(float* buf, long long floats, bool read_only, bool dependent, int sms, float* sink) {
  std::vector<double> gaps;
  for (int r = 0; r < 21; ++r) {
    const unsigned long long zero = 0, inf = ~0ull;
    check(cudaMemcpyToSymbol(g_writer_end, &zero, sizeof zero));
    check(cudaMemcpyToSymbol(g_next_start, &inf, sizeof inf));
    writer<<<sms * 2, 256>>>(buf, floats, read_only, sink);
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(sms);
    config.blockDim = dim3(128);
    config.attrs = &attribute;
    config.numAttrs = dependent ? 1 : 0;
    check(cudaLaunchKernelEx(&config, next, dependent));
    check(cudaDeviceSynchronize());
    unsigned long long end = 0, start = 0;
    check(cudaMemcpyFromSymbol(&end, g_writer_end, sizeof end));
    check(cudaMemcpyFromSymbol(&start, g_next_start, sizeof start));
    gaps.push_back((double(start) - double(end)) / 1000.0);
  }
  std::sort(gaps.begin(), gaps.end());
  return gaps[gaps.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes_mb = {0.0, 1.0, 4.0, 16.0, 32.0, 64.0, 256.0};
  if (argc > 1) {
    sizes_mb.clear();
    for (int i = 1; i < argc; ++i) sizes_mb.push_back(std::atof(argv[i]));
  }
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double most = *std::max_element(sizes_mb.begin(), sizes_mb.end());
  float *buf = nullptr, *sink = nullptr;
  check(cudaMalloc(&buf, size_t(std::max(most, 1.0) * (1 << 20))));
  check(cudaMalloc(&sink, sizeof(float)));
  check(cudaMemset(buf, 0, size_t(std::max(most, 1.0) * (1 << 20))));
  std::printf("%8s %14s %14s %14s %14s\n", "MB", "write, stream", "write, PDL", "read, stream", "read, PDL");
  for (double mb : sizes_mb) {
    const long long floats = (long long)(mb * (1 << 20) / 4) / 4 * 4;
    std::printf("%8.1f %14.2f %14.2f %14.2f %14.2f\n", mb, gap_us(buf, floats, false, false, sms, sink),
                gap_us(buf, floats, false, true, sms, sink), gap_us(buf, floats, true, false, sms, sink),
                gap_us(buf, floats, true, true, sms, sink));
  }
  return 0;
}
