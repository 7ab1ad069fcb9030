// MXFP4 group quantization for the synthetic generator: the same bytes as quantize_mxfp4_group
// (quantize.h), several times faster on random data.
//
// NOTE: float_to_e2m1 is a chain of comparisons that compiles to branches, and on random weights
// those branches mispredict (~12 ns per value). Its result depends only on a float's sign,
// exponent, top two mantissa bits and whether the remaining 21 bits are zero (every rounding
// threshold, 0.25 0.75 1.25 1.75 2.5 3.5 5, has at most two mantissa bits, so no threshold falls
// strictly between two such classes). The table below is filled by calling float_to_e2m1 on one
// member of each class, so it IS that definition, tabulated, not a second rounding rule.
#pragma once

#include <array>
#include <cstdint>

#include "k3moe/formats.h"

namespace k3moe::detail {

class Mxfp4GroupEncoder {
 public:
  Mxfp4GroupEncoder() {
    for (uint32_t cls = 0; cls < table_.size(); ++cls) {
      const uint32_t top = (cls >> 1) << 21;  // sign, exponent, two mantissa bits
      const uint32_t rest = cls & 1u;         // 1: some of the low 21 bits are set
      table_[cls] = float_to_e2m1(bits_float(top | rest));
    }
  }

  uint8_t e2m1(float x) const {
    const uint32_t u = float_bits(x);
    return table_[((u >> 21) << 1) | uint32_t((u & 0x1FFFFFu) != 0)];
  }

  // One group of 32 values: writes 16 packed bytes, returns the E8M0 scale. Same result as
  // quantize_mxfp4_group followed by pack_e2m1 (tests/checkpoint checks it bit for bit).
  uint8_t quantize_group(const float* values, uint8_t* packed) const {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      finite &= is_finite(values[i]);
      const float a = abs_f(values[i]);
      amax = a > amax ? a : amax;
    }
    const uint8_t s = finite ? mx_scale_round_up(amax, kE2M1Max) : kE8M0NaN;
    if (s == kE8M0NaN) {
      for (int j = 0; j < 16; ++j) packed[j] = 0;
      return s;
    }
    for (int j = 0; j < 16; ++j)
      packed[j] = pack_e2m1(e2m1(scale_down_by_e8m0(values[2 * j], s)),
                            e2m1(scale_down_by_e8m0(values[2 * j + 1], s)));
    return s;
  }

 private:
  std::array<uint8_t, 4096 * 2> table_{};
};

}  // namespace k3moe::detail
