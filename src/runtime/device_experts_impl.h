// What a DeviceExperts holds: the four kernel-layout tensors on one GPU.
#pragma once

#include "k3moe/plan.h"
#include "runtime/device_buffer.h"

namespace k3moe {

struct DeviceExperts::Impl {
  MoeConfig config;
  ExpertParallel ep;
  int layer = 0, num_local = 0, first_expert = 0, device = 0;
  // w13 codes [num_local, 2I/16, H/64, 512], scales [.., 32]; w2 codes [num_local, H/16, I/64, 512]...
  Pointers data;
  DeviceBuffer owned;  // empty for a view
};

}  // namespace k3moe
