#include "torch_tensors.h"

#include <sstream>

namespace k3moe::torch_binding {

namespace {

DLDataType dl_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kInt: return {kDLInt, 32, 1};
    case at::kByte: return {kDLUInt, 8, 1};
    case at::kFloat8_e4m3fn: return {kDLUInt, 8, 1};  // NOTE: E4M3 codes; see borrow()
    default: return {kDLOpaqueHandle, 0, 1};         // rejected by the library's dtype checks
  }
}

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << "[";
  for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << "]";
  return out.str();
}

}  // namespace

DLTensor borrow(const at::Tensor& t) {
  DLTensor d{};
  d.data = t.data_ptr();  // NOTE: already includes the storage offset, so byte_offset stays 0
  d.device.device_type = t.is_cuda() ? kDLCUDA : kDLCPU;
  d.device.device_id = t.is_cuda() ? t.get_device() : 0;
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = dl_dtype(t.scalar_type());
  // NOTE: the library only reads shape and strides; DLTensor's fields are non-const by C heritage.
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  d.byte_offset = 0;
  return d;
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kShort: return "int16";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kBool: return "bool";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    default: return c10::toString(dtype);
  }
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "no tensor";
  return shape_string(t.sizes()) + " " + dtype_name(t.scalar_type()) + " on " + t.device().str();
}

namespace {

std::string expected_string(std::initializer_list<at::ScalarType> dtypes, std::initializer_list<int64_t> shape,
                            c10::Device device) {
  std::ostringstream want;
  want << shape_string(shape) << " ";
  bool first = true;
  for (at::ScalarType dtype : dtypes) {
    want << (first ? "" : " or ") << dtype_name(dtype);
    first = false;
  }
  want << " on " << device.str();
  return want.str();
}

}  // namespace

void check_tensor_type(const char* op, const char* name, const at::Tensor& t,
                       std::initializer_list<at::ScalarType> dtypes, std::initializer_list<int64_t> shape,
                       c10::Device device) {
  // NOTE: the messages are only formatted on failure: this runs ~10 times per forward.
  TORCH_CHECK(t.defined(), op, ": ", name, " must be ", expected_string(dtypes, shape, device), ", got no tensor");
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor, got a ", t.layout(),
              " one (call .to_dense())");
  bool dtype_ok = false;
  for (at::ScalarType dtype : dtypes) dtype_ok = dtype_ok || t.scalar_type() == dtype;
  TORCH_CHECK(dtype_ok && t.device() == device && t.sizes().equals(shape), op, ": ", name, " must be ",
              expected_string(dtypes, shape, device), ", got ", describe(t));
}

void check_tensor(const char* op, const char* name, const at::Tensor& t,
                  std::initializer_list<at::ScalarType> dtypes, std::initializer_list<int64_t> shape,
                  c10::Device device) {
  check_tensor_type(op, name, t, dtypes, shape, device);
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (row-major), got ", describe(t),
              " with strides ", shape_string(t.strides()), " (call .contiguous())");
  const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
  TORCH_CHECK(address % 16 == 0, op, ": ", name, " must start 16-byte aligned, got ", describe(t),
              " at address 0x", std::hex, address, " (a slice of a larger tensor? copy it)");
}

std::string valid_utf8(std::string_view text) {
  const auto byte = [&](size_t at) -> uint8_t { return at < text.size() ? static_cast<uint8_t>(text[at]) : 0; };
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t lead = byte(i);
    // The length of the sequence `lead` starts and the range of its second byte, which rules out
    // overlong forms, surrogates and code points past U+10FFFF; later bytes are 0x80..0xBF.
    size_t length = 0;
    uint8_t low = 0x80, high = 0xBF;
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      low = lead == 0xE0 ? 0xA0 : 0x80;
      high = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      low = lead == 0xF0 ? 0x90 : 0x80;
      high = lead == 0xF4 ? 0x8F : 0xBF;
    }
    bool valid = length > 0;
    for (size_t k = 1; valid && k < length; ++k) {
      const uint8_t next = byte(i + k);
      valid = k == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
    }
    if (valid) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[lead >> 4];
      out += kHex[lead & 0xF];
      i += 1;
    }
  }
  return out;
}

void check_cuda_input(const char* op, const char* name, const at::Tensor& t, int64_t ndim) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a CUDA tensor, got no tensor");
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", describe(t));
  TORCH_CHECK(t.dim() == ndim, op, ": ", name, " must have ", ndim, " dimensions, got ", describe(t));
}

}  // namespace k3moe::torch_binding
