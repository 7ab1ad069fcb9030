// The wgmma GEMM2 starts a token tile only once GEMM1's count of stored units there has reached
// ExpertGemmArgs::gemm1_stores_per_tile (it does not wait for GEMM1's grid). Here one tile's count
// stays one short and its rows hold NaN while GEMM2 runs; the host then writes the real rows and
// the last count through the copy engine (no SM needed), and GEMM2 must have held that tile, run
// the others, and finished with the bits of an undelayed run.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gpu_test.h"
#include "k3moe/formats.h"
#include "kernels/expert_gemm.cuh"
#include "kernels/expert_layout.cuh"
#include "runtime/cuda_stream.h"

namespace k3moe {
namespace {

// Page-locked host memory: the copy engine moves it while a kernel runs.
template <class T>
struct Pinned {
  T* p = nullptr;
  explicit Pinned(size_t count) { K3MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), count * sizeof(T))); }
  ~Pinned() { cudaFreeHost(p); }
};

TEST(WgmmaGemm2, HoldsATokenTileUntilGemm1sCountIsComplete) {
  K3MOE_REQUIRE_GPU();
  kernels::configure_expert_gemm_kernels();
  constexpr int kN = 512, kK = 256, kExperts = 3, kStores = 6, kDelayed = 1;
  // 64-token tiles {expert, first row, rows, count}: expert 1's one partial tile is held.
  const std::vector<int4> tiles{{0, 0, 64, kStores}, {1, 64, 40, kStores}, {2, 104, 64, kStores}, {2, 168, 10, kStores}};
  constexpr int kRows = 178;
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(size_t(kExperts) * kN * kK / 2), scales(size_t(kExperts) * kN * kK / 32);
  for (auto& c : codes) c = uint8_t(rng());
  for (auto& s : scales) s = layout::scale_to_kernel(uint8_t(120 + rng() % 9));
  std::vector<uint16_t> inter(size_t(kRows) * kK);
  for (auto& v : inter) v = float_to_bf16_bits(float(int(rng() % 2001) - 1000) / 512.0f);
  DeviceBuffer d_codes = testing::to_device(codes), d_scales = testing::to_device(scales),
               d_inter = testing::to_device(inter), d_tiles(int64_t(16 * tiles.size())),
               d_num_tiles = testing::to_device(std::vector<int32_t>{int32_t(tiles.size())}), d_counter(4),
               y(int64_t(4) * kRows * kN);
  int device = 0;
  cudaDeviceProp prop{};
  K3MOE_CUDA_CHECK(cudaGetDevice(&device));
  K3MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));

  kernels::ExpertGemmArgs a;
  a.codes = d_codes.get<uint8_t>();
  a.scales = d_scales.get<uint8_t>();
  a.act = d_inter.get<uint16_t>();
  a.act_rows = kRows;
  a.tile_info = d_tiles.get<int4>();
  a.num_tiles = d_num_tiles.get<int32_t>();
  a.unit_counter = d_counter.get<int>();
  a.num_local = kExperts;
  a.N = kN;
  a.K = kK;
  a.sm_count = prop.multiProcessorCount;
  a.gemm1_stores_per_tile = kStores;
  kernels::GemmOutput out;
  out.rows = y.get<float>();
  out.split_stride = int64_t(kRows) * kN;
  constexpr uint8_t kUnwritten = 0x55;  // y's bytes before GEMM2: 1.47e13 as fp32, not NaN
  auto reset = [&](std::vector<int4> t, cudaStream_t s) {
    K3MOE_CUDA_CHECK(cudaMemcpyAsync(d_tiles.get(), t.data(), 16 * t.size(), cudaMemcpyHostToDevice, s));
    K3MOE_CUDA_CHECK(cudaMemsetAsync(d_counter.get(), 0, 4, s));
    K3MOE_CUDA_CHECK(cudaMemsetAsync(y.get(), kUnwritten, size_t(y.bytes()), s));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  };
  const int64_t held_first = int64_t(tiles[kDelayed].y) * kN, held_end = held_first + int64_t(tiles[kDelayed].z) * kN;
  Pinned<uint16_t> rows(size_t(tiles[kDelayed].z) * kK);
  Pinned<int> count(1);
  Pinned<float> early_y(size_t(kRows) * kN);
  uint16_t* pinned_rows = rows.p;
  int* pinned_count = count.p;
  float* pinned_y = early_y.p;
  std::memcpy(pinned_rows, inter.data() + size_t(tiles[kDelayed].y) * kK, size_t(tiles[kDelayed].z) * kK * 2);
  *pinned_count = kStores;

  {
    constexpr int warps = 8;  // the wgmma GEMM2's only width; 16 is refused
    CudaStream gemm, host;
    EXPECT_THROW(kernels::launch_expert_gemm2(a, out, kernels::TokenTile::Wg64, 16, gemm), Error);
    kernels::ExpertGemmArgs no_rows = a;  // the TMA map of the rows needs their count
    no_rows.act_rows = 0;
    EXPECT_THROW(kernels::launch_expert_gemm2(no_rows, out, kernels::TokenTile::Wg64, warps, gemm), Error);
    reset(tiles, gemm);
    kernels::launch_expert_gemm2(a, out, kernels::TokenTile::Wg64, warps, gemm);
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(gemm));
    const std::vector<float> want = testing::to_host<float>(y);

    std::vector<int4> held = tiles;
    held[kDelayed].w = kStores - 1;
    reset(held, gemm);
    K3MOE_CUDA_CHECK(cudaMemsetAsync(d_inter.get<uint16_t>() + int64_t(tiles[kDelayed].y) * kK, 0xFF,
                                     size_t(tiles[kDelayed].z) * kK * 2, gemm));  // bf16 0xFFFF: NaN
    cudaEvent_t done;
    K3MOE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    kernels::launch_expert_gemm2(a, out, kernels::TokenTile::Wg64, warps, gemm);
    K3MOE_CUDA_CHECK(cudaEventRecord(done, gemm));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // Still held 50 ms later; every other tile's rows already written, the held tile's not.
    EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady) << "GEMM2 finished while a tile's GEMM1 count was short";
    K3MOE_CUDA_CHECK(cudaMemcpyAsync(pinned_y, y.get(), size_t(y.bytes()), cudaMemcpyDeviceToHost, host));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(host));
    int64_t early = 0, unheld_wrong = 0;
    for (int64_t i = 0; i < int64_t(want.size()); ++i) {
      uint32_t got_bits = 0, want_bits = 0;
      std::memcpy(&got_bits, pinned_y + i, 4);
      std::memcpy(&want_bits, want.data() + i, 4);
      if (i >= held_first && i < held_end) early += got_bits != 0x55555555u;
      else unheld_wrong += got_bits != want_bits;
    }
    EXPECT_EQ(early, 0) << "outputs of the held tile written before its count was complete";
    EXPECT_EQ(unheld_wrong, 0) << "outputs of the other tiles not (yet) equal to the undelayed run's";
    // GEMM1's last store of the tile: the rows, then the count.
    K3MOE_CUDA_CHECK(cudaMemcpyAsync(d_inter.get<uint16_t>() + int64_t(tiles[kDelayed].y) * kK, pinned_rows,
                                     size_t(tiles[kDelayed].z) * kK * 2, cudaMemcpyHostToDevice, host));
    K3MOE_CUDA_CHECK(cudaMemcpyAsync(&d_tiles.get<int4>()[kDelayed].w, pinned_count, 4, cudaMemcpyHostToDevice, host));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(host));
    // A GEMM2 that never sees the count would spin forever: fail the binary instead of hanging.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaEventQuery(done) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "GEMM2 still holds the tile 10 s after its count was completed";
        std::fflush(stdout);
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(gemm));
    K3MOE_CUDA_CHECK(cudaEventDestroy(done));
    const std::vector<float> got = testing::to_host<float>(y);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * want.size()), 0) << "held run differs from the undelayed run";
  }
}

}  // namespace
}  // namespace k3moe
