// Host-side checks of DLPack tensors crossing the public API. Each failure is a k3moe::Error that
// names the tensor, the expected and the actual shape / dtype / device / layout.
#pragma once

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace k3moe {

inline constexpr DLDataType kBf16{kDLBfloat, 16, 1};
inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};
inline constexpr DLDataType kU8{kDLUInt, 8, 1};

std::string dtype_name(DLDataType dtype);
// "[4, 3584] bfloat16 on cuda:0"
std::string describe_tensor(const DLTensor& tensor);

// `t` must exist, live on CUDA device `device`, have `dtype` and `shape`, be contiguous
// (row-major) and start 16-byte aligned. Throws k3moe::Error otherwise.
void check_tensor(const DLTensor* t, const char* name, DLDataType dtype, std::initializer_list<int64_t> shape,
                  int device);
bool same_dtype(DLDataType a, DLDataType b);
// `device` must be a CUDA device of this process: "<what>: device 3 does not exist (1 CUDA devices)".
void check_device_exists(int device, const std::string& what);
// Whether `stream` is capturing a graph, or cannot be asked (a legacy stream while another stream's
// capture forbids it): then the driver queries below are not made.
bool stream_is_capturing(cudaStream_t stream);
// `stream` must belong to CUDA device `device` (the default streams always do: the caller sets the
// device; a capturing stream is not checked): "<what> belongs to device 1, the plan to device 0".
void check_stream_device(cudaStream_t stream, int device, const std::string& what);
// `pointer` must be device (or managed) memory of CUDA device `device`, `alignment`-byte aligned,
// with `bytes` bytes before the end of its allocation: "<what> must be ... memory of device 0, got
// host memory at 0x...". The driver reports the address range a pointer belongs to (its
// allocation; for virtual-memory mappings and pools the whole reservation), so a range the driver
// does not know is not checked against `bytes`, and one inside a larger reservation passes.
void check_device_memory(const void* pointer, int64_t bytes, int device, int alignment, const std::string& what);

template <class T>
T* data_ptr(const DLTensor* t) {
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}

}  // namespace k3moe
