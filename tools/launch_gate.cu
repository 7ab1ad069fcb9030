#include "launch_gate.h"

#include "k3moe/error.h"
#include "kernels/sm90/ptx.cuh"
#include "runtime/cuda_check.h"

namespace k3moe::cli {
namespace {

constexpr uint64_t kTimeoutNs = 1000000000;

__global__ void wait_for_ticket(const volatile uint32_t* ticket, uint32_t wanted, volatile uint32_t* timed_out) {
  const uint64_t start = ptx::globaltimer();
  while (*ticket < wanted) {
    if (ptx::globaltimer() - start > kTimeoutNs) {
      *timed_out = 1;
      return;
    }
    __nanosleep(500);
  }
}

volatile uint32_t* mapped_word() {
  void* p = nullptr;
  K3MOE_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint32_t), cudaHostAllocMapped));
  *static_cast<volatile uint32_t*>(p) = 0;
  return static_cast<volatile uint32_t*>(p);
}

uint32_t* device_view(volatile uint32_t* host) {
  void* p = nullptr;
  K3MOE_CUDA_CHECK(cudaHostGetDevicePointer(&p, const_cast<uint32_t*>(host), 0));
  return static_cast<uint32_t*>(p);
}

}  // namespace

LaunchGate::LaunchGate()
    : ticket_(mapped_word()), timed_out_(mapped_word()), device_ticket_(device_view(ticket_)),
      device_timed_out_(device_view(timed_out_)) {}

LaunchGate::~LaunchGate() {
  cudaFreeHost(const_cast<uint32_t*>(ticket_));
  cudaFreeHost(const_cast<uint32_t*>(timed_out_));
}

void LaunchGate::hold(cudaStream_t stream) {
  wait_for_ticket<<<1, 1, 0, stream>>>(device_ticket_, ++next_, device_timed_out_);
  K3MOE_CUDA_CHECK(cudaGetLastError());
}

void LaunchGate::release() { *ticket_ = next_; }

void LaunchGate::check() const {
  K3MOE_CHECK(*timed_out_ == 0, "a timed call was not enqueued within 1 s of its stream being held (did it "
                                "synchronize the stream?)");
}

LaunchGate& process_launch_gate() {
  static LaunchGate gate;
  return gate;
}

}  // namespace k3moe::cli
