// What a CUDA-graph replay costs outside its kernels, timed as `k3moe bench` times the forward
// (start event, graph launch, stop event, synchronize; median of 41). The graph holds N kernels
// that do nothing but mark the global timer (the first CTA's start of the first kernel, the last
// CTA's end of the last), in plain stream order or with programmatic dependent launch (each waits
// for its predecessor and lets its successor start, as the forward's kernels do). The first kernel
// has one CTA (the decode permutation), the others 3 per SM (the GEMMs' persistent grids).
// Printed per graph: events (us), the kernels' span from the first start to the last end, and the
// difference: the graph's start and end outside any kernel, which no kernel change can remove.
// (H200, Session 25, two runs: one kernel 2.9-3.1 us of events; 4-6 kernels 3.6-3.9 us outside their
// span, stream order or PDL alike; each boundary between two empty kernels ~0.8 us; bench/NOTES.md.)
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc bench/micro/graph_launch.cu
// Run: ./a.out
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/sm90/ptx.cuh"

namespace {

__device__ unsigned long long g_first_start, g_last_end;

__global__ void stage(bool first, bool last, bool dependent) {
  if (first && threadIdx.x == 0) atomicMin(&g_first_start, k3moe::ptx::globaltimer());
  if (dependent) {
    k3moe::ptx::griddepcontrol_wait();
    k3moe::ptx::griddepcontrol_launch_dependents();
  }
  if (last && threadIdx.x == 0) atomicMax(&g_last_end, k3moe::ptx::globaltimer());
}

void check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Timing {
  double events_us, span_us;
};

Timing replay(int kernels, bool dependent, int sms, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kernels; ++k) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(k == 0 ? 1 : 3 * sms);
    config.blockDim = dim3(128);
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = dependent ? 1 : 0;
    check(cudaLaunchKernelEx(&config, stage, k == 0, k == kernels - 1, dependent));
  }
  check(cudaStreamEndCapture(stream, &graph));
  check(cudaGraphInstantiate(&exec, graph, 0));
  check(cudaGraphUpload(exec, stream));
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start));
  check(cudaEventCreate(&stop));
  std::vector<double> events, spans;
  for (int r = 0; r < 46; ++r) {
    const unsigned long long inf = ~0ull, zero = 0;
    check(cudaMemcpyToSymbol(g_first_start, &inf, sizeof inf));
    check(cudaMemcpyToSymbol(g_last_end, &zero, sizeof zero));
    check(cudaEventRecord(start, stream));
    check(cudaGraphLaunch(exec, stream));
    check(cudaEventRecord(stop, stream));
    check(cudaEventSynchronize(stop));
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop));
    unsigned long long first = 0, last = 0;
    check(cudaMemcpyFromSymbol(&first, g_first_start, sizeof first));
    check(cudaMemcpyFromSymbol(&last, g_last_end, sizeof last));
    if (r < 5) continue;  // warm-up
    events.push_back(1000.0 * ms);
    spans.push_back((double(last) - double(first)) / 1000.0);
  }
  check(cudaEventDestroy(start));
  check(cudaEventDestroy(stop));
  check(cudaGraphExecDestroy(exec));
  check(cudaGraphDestroy(graph));
  std::sort(events.begin(), events.end());
  std::sort(spans.begin(), spans.end());
  return {events[events.size() / 2], spans[spans.size() / 2]};
}

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("%8s %10s %12s %10s %12s\n", "kernels", "launch", "events us", "span us", "outside us");
  for (int kernels : {1, 2, 4, 5, 6})
    for (bool dependent : {false, true}) {
      const Timing t = replay(kernels, dependent, sms, stream);
      std::printf("%8d %10s %12.2f %10.2f %12.2f\n", kernels, dependent ? "PDL" : "stream", t.events_us, t.span_us,
                  t.events_us - t.span_us);
    }
  return 0;
}
