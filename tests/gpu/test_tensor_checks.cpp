// The host-side checks of DLPack tensors (src/runtime/tensor_checks.cpp): host functions, so these
// tests run without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "expect_error.h"
#include "runtime/tensor_checks.h"

namespace k3moe {
namespace {

using testing::expect_error;

struct Tensor {
  int64_t shape[2] = {4, 8};
  alignas(16) uint16_t data[32] = {};
  DLTensor t{data, {kDLCUDA, 0}, 2, kBf16, shape, nullptr, 0};
};

TEST(TensorChecks, AcceptsTheExpectedTensor) {
  Tensor x;
  EXPECT_NO_THROW(check_tensor(&x.t, "x", kBf16, {4, 8}, 0));
}

TEST(TensorChecks, NamesTheTensorTheExpectedAndTheActual) {
  Tensor x;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 16}, 0); },
               {"x must be [4, 16] bfloat16 on cuda:0", "got [4, 8] bfloat16 on cuda:0"});
  expect_error([&] { check_tensor(&x.t, "x", kF32, {4, 8}, 0); }, {"x must be [4, 8] float32", "got [4, 8] bfloat16"});
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 1); }, {"on cuda:1", "got [4, 8] bfloat16 on cuda:0"});
  expect_error([&] { check_tensor(nullptr, "out", kBf16, {4, 8}, 0); }, {"out must be", "got no tensor"});
}

TEST(TensorChecks, ANegativeExtentNeverMatches) {
  // T is read from one tensor and required of the others: a tensor of [-1, 8] must not pass as
  // its own [T, 8].
  Tensor x;
  x.shape[0] = -1;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {-1, 8}, 0); }, {"x must be [-1, 8]", "got [-1, 8]"});
}

TEST(TensorChecks, ANegativeNdimOrAMissingShapeIsDescribedNotRead) {
  Tensor x;
  x.t.ndim = -3;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 0); }, {"x must be [4, 8]", "a tensor of ndim -3"});
  x.t.ndim = 2;
  x.t.shape = nullptr;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 0); }, {"x must be [4, 8]", "ndim 2 without a shape"});
}

TEST(TensorChecks, StridesAlignmentAndData) {
  Tensor x;
  int64_t transposed[2] = {1, 4};
  x.t.strides = transposed;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 0); }, {"x must be contiguous"});
  x.t.strides = nullptr;
  x.t.byte_offset = 2;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 0); }, {"x must start 16-byte aligned"});
  x.t.byte_offset = 0;
  x.t.data = nullptr;
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {4, 8}, 0); }, {"x has 32 elements but no data pointer"});
}

TEST(TensorChecks, AnEmptyTensorTakesAnyStridesAndAddress) {
  // Nothing of it is read or written; frameworks give empty tensors strides such as {1, 1}.
  Tensor x;
  x.shape[0] = 0;
  int64_t strides[2] = {1, 1};
  x.t.strides = strides;
  x.t.byte_offset = 2;
  EXPECT_NO_THROW(check_tensor(&x.t, "x", kBf16, {0, 8}, 0));
  x.t.data = nullptr;
  EXPECT_NO_THROW(check_tensor(&x.t, "x", kBf16, {0, 8}, 0));
  expect_error([&] { check_tensor(&x.t, "x", kBf16, {0, 16}, 0); }, {"x must be [0, 16]", "got [0, 8]"});
}

}  // namespace
}  // namespace k3moe
