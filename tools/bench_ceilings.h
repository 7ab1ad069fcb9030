// The physical ceilings a benchmark run measures for itself (PERF.md protocol): device-copy
// bandwidth, and bf16 / fp8 dense GEMM rates through cuBLASLt on random data.
#pragma once

#include <string>

namespace k3moe::cli {

struct Ceilings {
  double copy_tb_s = 0.0;     // device-to-device copy, bytes read + written
  double bf16_tflop_s = 0.0;  // cuBLASLt 8192^3, bf16 in / out, fp32 accumulate
  double fp8_tflop_s = 0.0;   // cuBLASLt 8192^3, e4m3 in, bf16 out, fp32 accumulate
  std::string gpu_name;
  int sm_count = 0;
  int driver_version = 0;
  double l2_mb = 0.0;
};

Ceilings measure_ceilings(int device);

}  // namespace k3moe::cli
