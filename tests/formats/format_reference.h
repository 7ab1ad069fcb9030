// Brute-force models of the number formats, written from their definitions alone (no formats.h):
// the value of every code by formula, and encoding as "the nearest representable magnitude, ties to
// the even code, saturating above the largest". The fast codecs in formats.h are tested against
// these.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace k3test {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

// E2M1 magnitudes in code order 0..7.
inline constexpr std::array<double, 8> kE2M1 = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// E4M3 "fn" magnitude of code 0..126 (127 is NaN): exponent field e, mantissa m, bias 7.
inline double e4m3_magnitude(int code) {
  const int e = code >> 3, m = code & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}
inline const std::array<double, 127>& e4m3_magnitudes() {
  static const std::array<double, 127> table = [] {
    std::array<double, 127> t{};
    for (int c = 0; c < 127; ++c) t[c] = e4m3_magnitude(c);
    return t;
  }();
  return table;
}

// Index of the magnitude nearest to a >= 0 among ascending mags[0..n); ties to the even index
// (the code whose mantissa LSB is 0); a >= mags[n-1] saturates. The differences are exact in
// double for the float inputs used here (a and the grid point lie within a factor of two, or the
// grid point is 0).
inline int nearest_even_index(const double* mags, int n, double a) {
  if (a >= mags[n - 1]) return n - 1;
  const int i = int(std::upper_bound(mags, mags + n, a) - mags) - 1;
  const double below = a - mags[i], above = mags[i + 1] - a;
  if (below < above) return i;
  if (above < below) return i + 1;
  return (i % 2 == 0) ? i : i + 1;
}

inline uint8_t ref_encode_e2m1(float x) {
  if (std::isnan(x)) return 0;  // the documented rule: NaN -> +0
  const int mag = nearest_even_index(kE2M1.data(), 8, std::fabs(double(x)));
  return uint8_t(mag | (std::signbit(x) ? 8 : 0));
}

inline uint8_t ref_encode_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;  // the documented rule: NaN -> 0x7F whatever its sign
  const int mag = nearest_even_index(e4m3_magnitudes().data(), 127, std::fabs(double(x)));
  return uint8_t(mag | (std::signbit(x) ? 0x80 : 0));
}

// Value of a decoded code as double (NaN for the NaN codes).
inline double ref_decode_e2m1(uint8_t code) {
  const double v = kE2M1[code & 7];
  return (code & 8) ? -v : v;
}
inline double ref_decode_e4m3(uint8_t code) {
  if ((code & 0x7F) == 0x7F) return NAN;
  const double v = e4m3_magnitude(code & 0x7F);
  return (code & 0x80) ? -v : v;
}
inline double ref_decode_e8m0(uint8_t s) { return s == 255 ? NAN : std::ldexp(1.0, int(s) - 127); }

// The round-up MX scale exponent, from its definition: the smallest e with
// max(amax, 2^-126) <= elem_max * 2^e, clamped to [-127, 127]; +127 bias. Non-finite -> 255.
inline uint8_t ref_mx_scale(float amax, float elem_max) {
  if (!std::isfinite(amax)) return 255;
  const double a = std::max(std::fabs(double(amax)), std::ldexp(1.0, -126));
  int e = std::ilogb(a) - std::ilogb(double(elem_max)) - 2;
  while (a > double(elem_max) * std::ldexp(1.0, e)) ++e;  // elem_max * 2^e is exact in double
  e = std::clamp(e, -127, 127);
  return uint8_t(e + 127);
}

// Half the distance to the next E2M1 magnitude above |v| (|v| <= 6): the largest rounding error.
inline double e2m1_half_step(double v) {
  const double a = std::fabs(v);
  return a < 2.0 ? 0.25 : a < 4.0 ? 0.5 : 1.0;
}

}  // namespace k3test
