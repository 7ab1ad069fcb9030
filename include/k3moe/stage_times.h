// When each stage of a GPU forward ran, read from the GPU's global timer (ns), for profiling the
// forward as it runs in a CUDA graph: kernel profilers serialize the launches, which removes the
// overlap programmatic dependent launch gives them, so they cannot say how much of each stage the
// forward waits for. Opt-in per forward (ForwardArgs::stage_times); `k3moe bench --stages` prints it.
#pragma once

#include <cstdint>
#include <string_view>

namespace k3moe {

enum class ForwardStage { Routing, Permutation, Gemm1, Activation, Gemm2, Combine };
inline constexpr int kForwardStages = 6;
std::string_view to_string(ForwardStage stage);

// One stage's record. Each field is a maximum over the stage's CTAs, raised by atomic max, so an
// array zeroed once holds, after every forward, that forward's times (the timer only grows); a
// field still 0 was not reached (a stage the forward did not run, or a wait it does not have).
struct StageTimes {
  uint64_t last_start = 0;  // the last CTA to begin: all of the stage's CTAs resident
  uint64_t last_wait = 0;   // the last CTA through its wait for the previous kernel's grid
  uint64_t last_end = 0;    // the last warp (GEMMs, permutation) or CTA (others) to finish
};

}  // namespace k3moe
