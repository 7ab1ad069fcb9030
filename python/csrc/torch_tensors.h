// at::Tensor at the edge of the public k3moe API: borrowed DLTensor views (no copy, no allocation)
// and the binding's own argument checks, which name the op, the argument, the expected and the
// actual shape / dtype / device before anything reaches the library.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "k3moe/error.h"

namespace k3moe::torch_binding {

// A DLTensor over `t`'s data, shape and strides; valid while `t` lives. float8_e4m3fn is described
// as uint8 (E4M3 codes), the dtype the library takes for pre-quantized MXFP8 activations.
DLTensor borrow(const at::Tensor& t);

// A host vector handed to a CPU tensor without a copy; the tensor owns and frees it.
template <class T>
at::Tensor adopt(std::vector<T>&& values, at::IntArrayRef shape) {
  auto* owned = new std::vector<T>(std::move(values));
  return at::from_blob(
      owned->data(), shape, [owned](void*) { delete owned; }, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
}

// A Python int argument as the library's int, or c10::Error naming the op and the argument.
inline int to_int(const char* op, const char* name, int64_t value) {
  TORCH_CHECK(value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(), op, ": ", name,
              " is out of range: must fit in a 32-bit int [", std::numeric_limits<int>::min(), ", ",
              std::numeric_limits<int>::max(), "], got ", value);
  return static_cast<int>(value);
}

// "[7, 512] bfloat16 on cuda:0"
std::string describe(const at::Tensor& t);
std::string dtype_name(at::ScalarType dtype);

// `t` must be a defined tensor of one of `dtypes`, with `shape`, on `device`, with any strides and
// alignment. Throws c10::Error (RuntimeError in Python): "k3moe.forward: topk_ids must be
// [7, 4] int32 on cuda:0, got [7, 5] int32 on cuda:0".
void check_tensor_type(const char* op, const char* name, const at::Tensor& t,
                       std::initializer_list<at::ScalarType> dtypes, std::initializer_list<int64_t> shape,
                       c10::Device device);

// check_tensor_type, and `t` must be contiguous and 16-byte aligned: a tensor the library reads
// in place.
void check_tensor(const char* op, const char* name, const at::Tensor& t,
                  std::initializer_list<at::ScalarType> dtypes, std::initializer_list<int64_t> shape,
                  c10::Device device);

// The first CUDA tensor argument of an op fixes its device; it must be CUDA and of rank `ndim`.
void check_cuda_input(const char* op, const char* name, const at::Tensor& t, int64_t ndim);

// `text` with each byte that is not part of valid UTF-8 written as \xNN. Python decodes an error
// message as UTF-8, and a library message may quote a file's raw bytes (a broken safetensors
// header): undecodable, it would surface as UnicodeDecodeError instead of the RuntimeError.
std::string valid_utf8(std::string_view text);

// Runs `body`, turning a k3moe::Error into a c10::Error that carries the library's message, so
// that Python sees a RuntimeError with that text.
template <class Body>
decltype(auto) translate_errors(const char* op, Body&& body) {
  try {
    return body();
  } catch (const k3moe::Error& e) {
    TORCH_CHECK(false, op, ": ", valid_utf8(e.what()));
  }
}

}  // namespace k3moe::torch_binding
