#include "l2_flush.h"

#include "streaming_read.cuh"

namespace k3moe::cli {

L2Flush::L2Flush(int device) : sink_(sizeof(uint32_t)) {
  DeviceGuard guard(device);
  int l2_bytes = 0, sm_count = 0;
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  K3MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  buffer_ = DeviceBuffer(4 * int64_t(l2_bytes));
  K3MOE_CUDA_CHECK(cudaMemset(buffer_.get(), 0x5A, size_t(buffer_.bytes())));
  blocks_ = 4 * sm_count;
}

void L2Flush::run(cudaStream_t stream) const {
  bench::read_stream<bench::L2Use::Fill><<<blocks_, 512, 0, stream>>>(buffer_.get<const uint4>(), buffer_.bytes() / 16,
                                                                       sink_.get<uint32_t>());
  K3MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace k3moe::cli
