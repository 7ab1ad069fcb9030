// The physical ceilings a benchmark run measures for itself (PERF.md protocol): device-copy
// bandwidth, and bf16 / fp8 dense GEMM rates through cuBLASLt on random data; and a pure
// streaming-read kernel, timed at each case's byte count, for the floor this GPU reaches in
// practice at that size (ramp-up and tail included).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "bench_timing.h"
#include "runtime/device_buffer.h"

namespace k3moe::cli {

struct Ceilings {
  double copy_tb_s = 0.0;     // device-to-device copy, bytes read + written
  double bf16_tflop_s = 0.0;  // cuBLASLt 8192^3, bf16 in / out, fp32 accumulate
  double fp8_tflop_s = 0.0;   // cuBLASLt 8192^3, e4m3 in, bf16 out, fp32 accumulate
  // The SM clock while each was timed (with a ClockWatch).
  ClockSummary copy_clock, bf16_clock, fp8_clock;
  std::string gpu_name;
  int sm_count = 0;
  int driver_version = 0;
  double l2_mb = 0.0;
};

// sustain_ms: each ceiling is timed after that long of back-to-back calls (bench_timing.h).
Ceilings measure_ceilings(int device, double sustain_ms, ClockWatch clock = {});

// Reads `bytes` of random data with 16-byte streaming loads, nothing else; the best of a few
// launch shapes. Successive reads start at rotating offsets of a 2 GiB buffer so that L2 does not
// serve them (as the benchmark rotates its inputs).
class StreamingRead {
 public:
  StreamingRead();
  double median_us(double bytes, cudaStream_t stream, double sustain_ms);

 private:
  DeviceBuffer buffer_, sink_;
  int sm_count_ = 0;
  int64_t next_offset_ = 0;
};

}  // namespace k3moe::cli
