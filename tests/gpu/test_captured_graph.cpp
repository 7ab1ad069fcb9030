// CapturedGraph: replays what was captured; an enqueue that throws leaves the stream out of
// capture (usable) and the exception unchanged.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

#include "gpu_test.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_buffer.h"

namespace k3moe {
namespace {

TEST(CapturedGraph, ReplaysTheCapturedWork) {
  K3MOE_REQUIRE_GPU();
  const CudaStream stream;
  DeviceBuffer buffer(64);
  K3MOE_CUDA_CHECK(cudaMemset(buffer.get<uint8_t>(), 0, 64));
  const CapturedGraph graph(stream, [&] { K3MOE_CUDA_CHECK(cudaMemsetAsync(buffer.get<uint8_t>(), 0x5A, 64, stream)); });
  for (uint8_t b : testing::to_host<uint8_t>(buffer)) EXPECT_EQ(b, 0) << "capturing must not run the work";
  graph.launch(stream);
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (uint8_t b : testing::to_host<uint8_t>(buffer)) EXPECT_EQ(b, 0x5A);
}

TEST(CapturedGraph, ThrowingEnqueueEndsTheCapture) {
  K3MOE_REQUIRE_GPU();
  const CudaStream stream;
  DeviceBuffer buffer(64);
  EXPECT_THROW(CapturedGraph(stream,
                             [&] {
                               K3MOE_CUDA_CHECK(cudaMemsetAsync(buffer.get<uint8_t>(), 1, 64, stream));
                               throw std::runtime_error("enqueue failed");
                             }),
               std::runtime_error);
  cudaStreamCaptureStatus status;
  K3MOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  K3MOE_CUDA_CHECK(cudaMemsetAsync(buffer.get<uint8_t>(), 2, 64, stream));  // the stream still works
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace k3moe
