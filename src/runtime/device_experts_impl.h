// What a DeviceExperts holds: the four kernel-layout tensors on one GPU.
#pragma once

#include "k3moe/plan.h"
#include "runtime/device_buffer.h"

namespace k3moe {

struct DeviceExperts::Impl {
  MoeConfig config;
  ExpertParallel ep;
  int layer = 0, num_local = 0, first_expert = 0, device = 0;
  DeviceBuffer w13_codes;   // [num_local, 2I/16, H/64, 512]
  DeviceBuffer w13_scales;  // [num_local, 2I/16, H/64, 32]
  DeviceBuffer w2_codes;    // [num_local, H/16, I/64, 512]
  DeviceBuffer w2_scales;   // [num_local, H/16, I/64, 32]
};

}  // namespace k3moe
