// Kernel launches with programmatic dependent launch: the kernel may start while the previous one
// in the stream finishes (it calls griddepcontrol_wait before reading that kernel's output), which
// removes the launch gap and lets it prefetch what does not depend on it. Graph capture keeps it.
// Launches go through enqueue_dependent, which records them instead while a LaunchRecording is
// active (ForwardGraph).
#pragma once

#include <cuda_runtime.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime/launch_recorder.h"

namespace k3moe::kernels {

template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  static_assert(sizeof...(Params) > 0 && sizeof...(Params) == sizeof...(Args));
  std::tuple<std::remove_cvref_t<Params>...> values(std::forward<Args>(args)...);
  std::apply(
      [&](auto&... value) {
        void* pointers[] = {static_cast<void*>(&value)...};
        const size_t sizes[] = {sizeof(value)...};
        enqueue_dependent(reinterpret_cast<const void*>(kernel), grid, block, smem, stream, pointers, sizes,
                          int(sizeof...(Params)));
      },
      values);
}

}  // namespace k3moe::kernels
