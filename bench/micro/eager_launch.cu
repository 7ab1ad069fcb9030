// What one eager forward costs the host to enqueue, by the way its five kernels are submitted:
//   launches   five cudaLaunchKernelEx with programmatic dependent launch (the forward today);
//   graph+set  one instantiated graph of the same five kernels, each node's parameters replaced
//              (cudaGraphExecKernelNodeSetParams) before one cudaGraphLaunch;
//   graph+set1 the same with only the first node's parameters replaced;
//   graph      one cudaGraphLaunch, no update;
//   one launch a single cudaLaunchKernelEx (about what an eager torch.add costs the driver).
// Each call's parameters differ from the last (a counter in a 256-byte struct, the size of the
// GEMMs' arguments), and the kernels store it, so the check at the end proves the updates landed.
// Timed: the host's enqueue loop of 200 calls (the queue does not fill), per call, median of 9
// interleaved rounds; then the same loop with a synchronize, for the device-bound figure.
// (H100 host, Session 52: launches 19.8 us per call, graph+set 7.3, graph+set1 3.0, graph 2.0, one
// launch 3.9; with the synchronize 19.7, 7.1, 4.8, 4.4 and 3.9, the graph's three device-bound;
// bench/NOTES.md.)
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc bench/micro/eager_launch.cu
// Run: ./a.out
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/sm90/ptx.cuh"

namespace {

struct Params {
  unsigned long long* out;
  unsigned long long value;
  unsigned long long padding[30];
};

__global__ void node(Params p, int index) {
  k3moe::ptx::griddepcontrol_wait();
  k3moe::ptx::griddepcontrol_launch_dependents();
  if (blockIdx.x == 0 && threadIdx.x == 0) p.out[index] = p.value;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kNodes = 5;
constexpr int kCalls = 200;
constexpr int kRounds = 9;
const unsigned kGrids[kNodes] = {1, 396, 40, 396, 8};

void launch(cudaStream_t stream, int index, const Params& p) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kGrids[index]);
  config.blockDim = dim3(128);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, node, p, index), "cudaLaunchKernelEx");
}

struct Graph {
  cudaGraphExec_t exec{};
  std::vector<cudaGraphNode_t> nodes;  // in launch order
};

Graph capture(cudaStream_t stream, const Params& p) {
  Graph g;
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < kNodes; ++i) launch(stream, i, p);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "get nodes");
  std::vector<cudaGraphNode_t> nodes(count);
  check(cudaGraphGetNodes(graph, nodes.data(), &count), "get nodes");
  g.nodes.resize(kNodes);
  for (cudaGraphNode_t n : nodes) {  // the node's second argument is its place in the chain
    cudaKernelNodeParams kp{};
    check(cudaGraphKernelNodeGetParams(n, &kp), "get params");
    g.nodes[*static_cast<int*>(kp.kernelParams[1])] = n;
  }
  check(cudaGraphInstantiate(&g.exec, graph, 0), "instantiate");
  return g;
}

void set_node(const Graph& g, int index, Params* p) {
  int i = index;
  void* args[] = {p, &i};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(node);
  kp.gridDim = dim3(kGrids[index]);
  kp.blockDim = dim3(128);
  kp.kernelParams = args;
  check(cudaGraphExecKernelNodeSetParams(g.exec, g.nodes[index], &kp), "set params");
}

double time_us(const std::function<void()>& call, cudaStream_t stream, bool sync_each_round) {
  check(cudaStreamSynchronize(stream), "sync");
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < kCalls; ++c) call();
  if (sync_each_round) check(cudaStreamSynchronize(stream), "sync");
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(end - start).count() / kCalls;
}

}  // namespace

int main() {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  unsigned long long* out;
  check(cudaMalloc(&out, sizeof(unsigned long long) * kNodes), "malloc");
  Params p{};
  p.out = out;
  Graph g = capture(stream, p);

  struct Method {
    const char* name;
    std::function<void()> call;
  };
  const std::vector<Method> methods = {
      {"launches", [&] { ++p.value; for (int i = 0; i < kNodes; ++i) launch(stream, i, p); }},
      {"graph+set", [&] { ++p.value; for (int i = 0; i < kNodes; ++i) set_node(g, i, &p);
                          check(cudaGraphLaunch(g.exec, stream), "graph launch"); }},
      {"graph+set1", [&] { ++p.value; set_node(g, 0, &p); check(cudaGraphLaunch(g.exec, stream), "graph launch"); }},
      {"graph", [&] { check(cudaGraphLaunch(g.exec, stream), "graph launch"); }},
      {"one launch", [&] { ++p.value; launch(stream, 0, p); }},
  };
  for (bool sync : {false, true}) {
    std::vector<std::vector<double>> us(methods.size());
    for (int r = 0; r < kRounds; ++r)
      for (size_t m = 0; m < methods.size(); ++m) us[m].push_back(time_us(methods[m].call, stream, sync));
    std::printf("%s per call (median of %d rounds of %d; min, max):\n",
                sync ? "enqueue and completion" : "host enqueue", kRounds, kCalls);
    for (size_t m = 0; m < methods.size(); ++m) {
      std::sort(us[m].begin(), us[m].end());
      std::printf("  %-11s %6.2f us  (%.2f, %.2f)\n", methods[m].name, us[m][kRounds / 2], us[m].front(), us[m].back());
    }
  }

  // The updates landed: a graph launch after setting every node stores the new value everywhere.
  ++p.value;
  for (int i = 0; i < kNodes; ++i) set_node(g, i, &p);
  check(cudaGraphLaunch(g.exec, stream), "graph launch");
  unsigned long long host[kNodes];
  check(cudaMemcpyAsync(host, out, sizeof(host), cudaMemcpyDeviceToHost, stream), "copy");
  check(cudaStreamSynchronize(stream), "sync");
  for (int i = 0; i < kNodes; ++i)
    if (host[i] != p.value) {
      std::printf("FAIL: node %d stored %llu, expected %llu\n", i, host[i], p.value);
      return 1;
    }
  std::printf("updates checked: every node stored the last call's value\n");
  return 0;
}
