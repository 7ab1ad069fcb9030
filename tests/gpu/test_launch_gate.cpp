// The benchmark's launch gate: work enqueued behind a hold does not start before the release, and a
// hold that is never released gives up and says so instead of hanging the benchmark.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu_test.h"
#include "k3moe/error.h"
#include "launch_gate.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_stream.h"

namespace k3moe::cli {
namespace {

TEST(LaunchGate, WorkBehindAHoldWaitsForTheRelease) {
  K3MOE_REQUIRE_GPU();
  LaunchGate gate;
  const CudaStream stream;
  cudaEvent_t behind;
  K3MOE_CUDA_CHECK(cudaEventCreate(&behind));
  for (int round = 0; round < 3; ++round) {
    gate.hold(stream);
    K3MOE_CUDA_CHECK(cudaEventRecord(behind, stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaEventQuery(behind), cudaErrorNotReady) << "round " << round << ": passed a hold not yet released";
    gate.release();
    K3MOE_CUDA_CHECK(cudaEventSynchronize(behind));
    EXPECT_NO_THROW(gate.check()) << "round " << round;
  }
  cudaEventDestroy(behind);
}

TEST(LaunchGate, AHoldNeverReleasedGivesUpAndIsReported) {
  K3MOE_REQUIRE_GPU();
  LaunchGate gate;
  const CudaStream stream;
  gate.hold(stream);
  const auto begin = std::chrono::steady_clock::now();
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // what a timed call must not do while held
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_GT(waited_s, 0.5) << "the hold ended before its timeout without a release";
  EXPECT_THROW(gate.check(), Error);
}

}  // namespace
}  // namespace k3moe::cli
