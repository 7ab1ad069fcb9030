// A kernel's marks in its stage's record (include/k3moe/stage_times.h): the global timer raised
// into a field by atomic max. A null record (the default) costs one uniform branch.
#pragma once

#include <cstdint>

#include "k3moe/stage_times.h"
#include "kernels/sm90/ptx.cuh"

namespace k3moe::kernels {

__device__ __forceinline__ void mark(uint64_t* field) {
  atomicMax(reinterpret_cast<unsigned long long*>(field), static_cast<unsigned long long>(ptx::globaltimer()));
}

// Thread 0 of each CTA, at the kernel's entry.
__device__ __forceinline__ void mark_start(StageTimes* stage) {
  if (stage != nullptr && threadIdx.x == 0) mark(&stage->last_start);
}
// The caller picks one thread that passed the wait (or one per CTA).
__device__ __forceinline__ void mark_wait(StageTimes* stage) {
  if (stage != nullptr) mark(&stage->last_wait);
}
__device__ __forceinline__ void mark_end(StageTimes* stage) {
  if (stage != nullptr) mark(&stage->last_end);
}

}  // namespace k3moe::kernels
