// Must fail to build through cmake/ptxas_guard.sh: the accumulators are read between a wgmma and
// its wait, so ptxas serializes the wgmmas (the guard's own test, tests/CMakeLists.txt).
#include "kernels/sm90/ptx.cuh"

__global__ void __launch_bounds__(128, 1) serialized(float* out, const uint32_t* in) {
  __shared__ __align__(1024) uint8_t b[64 * 128];
  float acc[16];
  const uint32_t a[4] = {in[0], in[1], in[2], in[3]};
  const uint64_t desc = k3moe::ptx::wgmma_desc_k_major_sw128(b);
  k3moe::ptx::wgmma_fence();
  k3moe::ptx::wgmma_bf16_rs<32>(acc, a, desc, true);
  k3moe::ptx::wgmma_commit();
  const float early = acc[0];
  k3moe::ptx::wgmma_bf16_rs<32>(acc, a, desc, false);
  k3moe::ptx::wgmma_commit();
  k3moe::ptx::wgmma_wait<0>();
  out[threadIdx.x] = early + acc[1];
}
