// An owning device tensor that hands out a DLTensor view: for the tools, tests and the validation
// harness, which build inputs for MoePlan::forward from host vectors.
#pragma once

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "k3moe/error.h"

#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace k3moe {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(std::vector<int64_t> shape, DLDataType dtype, int device)
      : shape_(std::move(shape)), dtype_(dtype), device_(device) {
    DeviceGuard on(device);  // the memory lives where the DLTensor view says
    buffer_ = DeviceBuffer(std::max<int64_t>(bytes(), 16));
  }
  template <class T>
  static DeviceTensor from_host(const std::vector<T>& host, std::vector<int64_t> shape, DLDataType dtype, int device) {
    DeviceTensor t(std::move(shape), dtype, device);
    K3MOE_CHECK(int64_t(host.size() * sizeof(T)) == t.bytes(), "host data has ", host.size() * sizeof(T),
                " bytes, the tensor ", t.bytes());
    t.upload(host.data());
    return t;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  int64_t bytes() const { return numel() * dtype_.bits / 8; }
  // upload and fill_bytes return once the device holds the bytes. cudaMemcpy from pageable memory
  // returns before its last DMA lands and cudaMemset before it runs, both on the default stream,
  // which does not order the non-blocking streams a forward runs on: without the synchronize, a
  // forward enqueued next can read the old bytes (seen as a graph-check failure of the validation
  // matrix, bench/NOTES.md, Session 53).
  void upload(const void* host) {
    K3MOE_CUDA_CHECK(cudaMemcpy(buffer_.get(), host, bytes(), cudaMemcpyHostToDevice));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes() / sizeof(T));
    K3MOE_CUDA_CHECK(cudaMemcpy(host.data(), buffer_.get(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  void fill_bytes(uint8_t value) {
    K3MOE_CUDA_CHECK(cudaMemset(buffer_.get(), value, bytes()));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  void* data() const { return buffer_.get(); }

  // A view valid while this object lives and is not moved.
  DLTensor* dl() {
    view_ = DLTensor{buffer_.get(), DLDevice{kDLCUDA, device_}, int(shape_.size()), dtype_, shape_.data(), nullptr, 0};
    return &view_;
  }

 private:
  std::vector<int64_t> shape_;
  DLDataType dtype_{};
  int device_ = 0;
  DeviceBuffer buffer_;
  DLTensor view_{};
};

}  // namespace k3moe
