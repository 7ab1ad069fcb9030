// libFuzzer target for the safetensors header parser (optional; not part of the CTest suite,
// which runs the deterministic mutation fuzzer in test_safetensors.cpp instead). Build and run:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/checkpoint/fuzz/fuzz_safetensors_header.cpp src/checkpoint/safetensors.cpp -o fuzz_st
//   ./fuzz_st -max_total_time=60 -max_len=4096
// Every input must either parse into tensors inside the image or throw k3moe::Error.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "k3moe/error.h"
#include "k3moe/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3moe::SafetensorsFile f = k3moe::SafetensorsFile::from_bytes({data, data + size}, "fuzz");
    for (const k3moe::TensorInfo& t : f.tensors()) {
      if (t.end > size || uint64_t(t.numel() * k3moe::dtype_size(t.dtype)) != t.nbytes()) std::abort();
      std::vector<uint8_t> copy(t.nbytes());
      f.copy_to(t, copy);
    }
  } catch (const k3moe::Error&) {
  }
  return 0;
}
