#include "runtime/tensor_checks.h"

#include <cuda.h>

#include <sstream>
#include <vector>

#include "k3moe/error.h"
#include "runtime/cuda_check.h"

namespace k3moe {

bool same_dtype(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

std::string dtype_name(DLDataType dtype) {
  std::ostringstream out;
  switch (dtype.code) {
    case kDLInt: out << "int"; break;
    case kDLUInt: out << "uint"; break;
    case kDLFloat: out << "float"; break;
    case kDLBfloat: out << "bfloat"; break;
    default: out << "dtype(code " << int(dtype.code) << ")"; break;
  }
  out << int(dtype.bits);
  if (dtype.lanes != 1) out << "x" << dtype.lanes;
  return out.str();
}

namespace {

template <class Shape>
std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  bool first = true;
  for (int64_t d : shape) {
    out << (first ? "" : ", ") << d;
    first = false;
  }
  out << "]";
  return out.str();
}

std::string device_name(DLDevice device) {
  std::ostringstream out;
  if (device.device_type == kDLCUDA) out << "cuda:" << device.device_id;
  else if (device.device_type == kDLCPU) out << "cpu";
  else out << "device type " << int(device.device_type) << ":" << device.device_id;
  return out.str();
}

bool is_contiguous(const DLTensor& t) {
  if (!t.strides) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// The bytes from `pointer` to the end of the address range the driver says it belongs to, or -1 if
// the driver cannot tell. The driver is reached through the runtime: the library does not link
// libcuda.
int64_t bytes_to_range_end(const void* pointer) {
  using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  static const GetAttribute get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess) cudaGetLastError();
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetAttribute>(fn) : nullptr;
  }();
  CUdeviceptr start = 0;
  size_t size = 0;
  const auto address = reinterpret_cast<CUdeviceptr>(pointer);
  if (!get || get(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address) != CUDA_SUCCESS ||
      get(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, address) != CUDA_SUCCESS || address < start ||
      address - start > size)
    return -1;
  return int64_t(size - (address - start));
}

}  // namespace

std::string describe_tensor(const DLTensor& t) {
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr))
    return "a tensor of ndim " + std::to_string(t.ndim) + (t.shape ? "" : " without a shape");
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  return shape_string(shape) + " " + dtype_name(t.dtype) + " on " + device_name(t.device);
}

void check_tensor(const DLTensor* t, const char* name, DLDataType dtype, std::initializer_list<int64_t> shape,
                  int device) {
  // NOTE: the messages are formatted only on failure: this runs on every forward.
  auto want = [&] {
    std::ostringstream out;
    out << shape_string(shape) << " " << dtype_name(dtype) << " on cuda:" << device;
    return out.str();
  };
  if (t == nullptr) K3MOE_FAIL(name, " must be ", want(), ", got no tensor");
  bool ok = t->ndim == int(shape.size()) && (t->ndim == 0 || t->shape != nullptr) && same_dtype(t->dtype, dtype) &&
            t->device.device_type == kDLCUDA && t->device.device_id == device;
  if (ok) {
    int d = 0;
    // An expected extent taken from another tensor (T) may be negative: never a match.
    for (int64_t extent : shape) ok = ok && extent >= 0 && t->shape[d++] == extent;
  }
  if (!ok) K3MOE_FAIL(name, " must be ", want(), ", got ", describe_tensor(*t));
  int64_t numel = 1;
  for (int64_t extent : shape) numel *= extent;
  if (numel == 0) return;  // nothing is read or written: any strides and address will do
  if (!is_contiguous(*t)) K3MOE_FAIL(name, " must be contiguous (row-major), got ", describe_tensor(*t), " with other strides");
  K3MOE_CHECK(t->data != nullptr, name, " has ", numel, " elements but no data pointer");
  const auto address = reinterpret_cast<uintptr_t>(static_cast<const char*>(t->data) + t->byte_offset);
  K3MOE_CHECK(address % 16 == 0, name, " must start 16-byte aligned, got address 0x", std::hex, address);
}

void check_device_exists(int device, const std::string& what) {
  int device_count = 0;
  K3MOE_CUDA_CHECK(cudaGetDeviceCount(&device_count));
  K3MOE_CHECK(device >= 0 && device < device_count, what, ": device ", device, " does not exist (", device_count,
              " CUDA devices)");
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return capture != cudaStreamCaptureStatusNone;
}

void check_stream_device(cudaStream_t stream, int device, const std::string& what) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  if (stream_is_capturing(stream)) return;  // the driver refuses the query during a capture
  int stream_device = -1;
  K3MOE_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
  K3MOE_CHECK(stream_device == device, what, " belongs to device ", stream_device, ", the plan to device ", device);
}

void check_device_memory(const void* pointer, int64_t bytes, int device, int alignment, const std::string& what) {
  K3MOE_CHECK(reinterpret_cast<uintptr_t>(pointer) % uintptr_t(alignment) == 0, what, " must be ", alignment,
              "-byte aligned, got address ", pointer);
  cudaPointerAttributes where{};
  K3MOE_CUDA_CHECK(cudaPointerGetAttributes(&where, pointer));
  const bool on_device = where.type == cudaMemoryTypeDevice || where.type == cudaMemoryTypeManaged;
  K3MOE_CHECK(on_device && where.device == device, what, " must be ", alignment, "-byte aligned memory of device ",
              device, ", got ", on_device ? "memory of device " + std::to_string(where.device) : std::string("host memory"),
              " at ", pointer);
  const int64_t room = bytes_to_range_end(pointer);
  K3MOE_CHECK(room < 0 || room >= bytes, what, " must hold ", bytes, " bytes, got ", room,
              " bytes from ", pointer, " to the end of its allocation");
}

}  // namespace k3moe
