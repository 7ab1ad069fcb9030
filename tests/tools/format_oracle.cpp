// format_oracle: runs one formats.h codec over an array, for the Python cross-checks
// (tests/python/test_formats_ml_dtypes.py).
//
// Protocol (one request per run): stdin holds an ASCII line "<command> <n>\n" followed by the
// input array in native (little-endian) binary; stdout receives the output array in binary.
//
//   command          input          output
//   e2m1_decode      n x uint8      n x float32
//   e2m1_encode      n x float32    n x uint8
//   e4m3_decode      n x uint8      n x float32
//   e4m3_encode      n x float32    n x uint8
//   ue4m3_decode     n x uint8      n x float32
//   ue4m3_encode     n x float32    n x uint8
//   e8m0_decode      n x uint8      n x float32
//   mx_scale_e2m1    n x float32    n x uint8     mx_scale_round_up(amax, 6)
//   mx_scale_e4m3    n x float32    n x uint8     mx_scale_round_up(amax, 448)
//   bf16_round       n x float32    n x float32   round_to_bf16
//   mxfp8_quantize   n x float32    n x uint8 codes, then n/32 x uint8 scales (n % 32 == 0)
//   mxfp4_quantize   n x float32    n/2 x uint8 packed, then n/32 x uint8 scales (n % 32 == 0)
//
// Exit status 0 on success, 2 on a malformed request (message on stderr).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "k3moe/formats.h"
#include "k3moe/quantize.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "format_oracle: %s\n", message.c_str());
  return 2;
}

template <class T>
bool read_array(std::vector<T>& out, size_t n) {
  out.resize(n);
  return std::fread(out.data(), sizeof(T), n, stdin) == n;
}

template <class T>
void write_array(const std::vector<T>& v) {
  std::fwrite(v.data(), sizeof(T), v.size(), stdout);
}

template <class Fn>
int map_u8_to_f32(size_t n, Fn&& fn) {
  std::vector<uint8_t> in;
  if (!read_array(in, n)) return fail("short input: expected " + std::to_string(n) + " uint8");
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = fn(in[i]);
  write_array(out);
  return 0;
}

template <class Out, class Fn>
int map_f32(size_t n, Fn&& fn) {
  std::vector<float> in;
  if (!read_array(in, n)) return fail("short input: expected " + std::to_string(n) + " float32");
  std::vector<Out> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = fn(in[i]);
  write_array(out);
  return 0;
}

}  // namespace

int main() {
  char command[64] = {0};
  unsigned long long count = 0;
  if (std::scanf("%63s %llu", command, &count) != 2) return fail("expected '<command> <n>' on the first line");
  if (std::fgetc(stdin) != '\n') return fail("the header line must end with a newline");
  const std::string cmd = command;
  const size_t n = size_t(count);
  using namespace k3moe;

  if (cmd == "e2m1_decode") return map_u8_to_f32(n, [](uint8_t c) { return e2m1_to_float(c); });
  if (cmd == "e4m3_decode") return map_u8_to_f32(n, [](uint8_t c) { return e4m3_to_float(c); });
  if (cmd == "ue4m3_decode") return map_u8_to_f32(n, [](uint8_t c) { return ue4m3_to_float(c); });
  if (cmd == "e8m0_decode") return map_u8_to_f32(n, [](uint8_t c) { return e8m0_to_float(c); });
  if (cmd == "e2m1_encode") return map_f32<uint8_t>(n, [](float x) { return float_to_e2m1(x); });
  if (cmd == "e4m3_encode") return map_f32<uint8_t>(n, [](float x) { return float_to_e4m3(x); });
  if (cmd == "ue4m3_encode") return map_f32<uint8_t>(n, [](float x) { return float_to_ue4m3(x); });
  if (cmd == "mx_scale_e2m1") return map_f32<uint8_t>(n, [](float a) { return mx_scale_round_up(a, kE2M1Max); });
  if (cmd == "mx_scale_e4m3") return map_f32<uint8_t>(n, [](float a) { return mx_scale_round_up(a, kE4M3Max); });
  if (cmd == "bf16_round") return map_f32<float>(n, [](float x) { return round_to_bf16(x); });

  if (cmd == "mxfp8_quantize" || cmd == "mxfp4_quantize") {
    if (n % 32 != 0) return fail(cmd + ": n must be a multiple of 32, got " + std::to_string(n));
    std::vector<float> in;
    if (!read_array(in, n)) return fail("short input: expected " + std::to_string(n) + " float32");
    if (cmd == "mxfp8_quantize") {
      const Mxfp8Matrix m = quantize_mxfp8(in, 1, int(n));
      write_array(m.codes);
      write_array(m.scales);
    } else {
      const Mxfp4Matrix m = quantize_mxfp4(in, 1, int(n));
      write_array(m.packed);
      write_array(m.scales);
    }
    return 0;
  }
  return fail("unknown command '" + cmd + "'");
}
