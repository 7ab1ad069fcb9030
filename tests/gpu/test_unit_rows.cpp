// 128-row units (8- and 16-token tiles, chunks of 256 of K) compute what 256-row units do, in the same
// order: a forward's output bits must not depend on the unit size over the same K ranges, in both
// modes; eager calls and graph replays agree.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "forward_inputs.h"
#include "k3moe/synthetic.h"
#include "gpu_test.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_stream.h"
#include "runtime/heuristics.h"

namespace k3moe {
namespace {

using testing::graph_config;

constexpr GpuTraits kH100{132, 2.0 * 2619e6 * 5120 / 8};  // H100 SXM: 128-row units where the heuristic gives them
using testing::Inputs;

TEST(UnitRows, HalfUnitsGiveTheBitsOfWholeOnes) {
  K3MOE_REQUIRE_GPU();
  const MoeConfig c = graph_config();
  const DeviceExperts experts = testing::graph_experts(9);
  const CudaStream stream;
  for (Mode mode : {Mode::A16, Mode::Mxfp8})
    for (int splits : {1, 2})
      for (int tile : {8, 16})
      for (int T : {1, 17, 40}) {
        SCOPED_TRACE(::testing::Message() << "mode " << to_string(mode) << ", splits " << splits << ", tile " << tile
                                          << ", T = " << T);
        std::vector<uint16_t> out[2];
        for (int half = 0; half < 2; ++half) {
          PlanOptions o{c, 64, mode, Activation::Situ, c.activation_params, {1, 0}, 0};
          o.gemm_kernel = GemmKernel::MmaSync;
          o.token_tile = tile;
          // GEMM1's K ranges are the same at either size; GEMM2's K = 256 is one chunk of 128-row
          // units, so it stays whole (another split would sum other partials).
          o.gemm1_splits = splits;
          o.gemm2_splits = 1;
          o.gemm1_unit_rows = o.gemm2_unit_rows = half ? kernels::kGemmHalfUnitRows : kernels::kGemmRowsPerCta;
          const MoePlan plan = MoePlan::create(o);
          const KernelChoice k = kernel_choice(o, T, kH100);
          ASSERT_EQ(kernels::tile_tokens(k.token_tile), tile);
          ASSERT_EQ(k.gemm1_unit_rows, o.gemm1_unit_rows);
          ASSERT_EQ(k.gemm2_unit_rows, o.gemm2_unit_rows);
          Inputs in(c, T, 3, false);
          plan.forward(experts, in.args(), stream);
          K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
          out[half] = in.out.download<uint16_t>();
        }
        EXPECT_EQ(out[1], out[0]);
      }
  PlanOptions o{c, 64, Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0};
  o.gemm2_unit_rows = 64;
  testing::expect_error([&] { MoePlan::create(o); }, {"gemm unit rows must be 0 (automatic), 128 or 256, got 64"});
}

TEST(UnitRows, HalfUnitsOnlyWhereTheTileAndKAllowThem) {
  MoeConfig c = graph_config();
  PlanOptions o{c, 4096, Mode::A16, Activation::Situ, c.activation_params, {1, 0}, 0};
  o.gemm1_unit_rows = o.gemm2_unit_rows = kernels::kGemmHalfUnitRows;
  o.gemm1_splits = 8;
  KernelChoice k = kernel_choice(o, 17, kH100);
  EXPECT_EQ(k.gemm1_unit_rows, 128);
  EXPECT_EQ(k.gemm2_unit_rows, 128);
  EXPECT_EQ(k.gemm1_splits, 2) << "K = 512 holds two chunks of 256";
  EXPECT_NE(k.describe().find("units of 128 (GEMM1) and 128 (GEMM2) weight rows"), std::string::npos) << k.describe();
  EXPECT_EQ(kernel_choice(o, 60, kH100).token_tile, kernels::TokenTile::T16);
  EXPECT_EQ(kernel_choice(o, 60, kH100).gemm1_unit_rows, 128);
  // 24-token tiles, and K = 384 (not a multiple of 256): 256-row units.
  EXPECT_EQ(kernel_choice(o, 80, kH100).token_tile, kernels::TokenTile::T24);
  EXPECT_EQ(kernel_choice(o, 80, kH100).gemm1_unit_rows, 256);
  o.config.hidden = 384;
  k = kernel_choice(o, 17, kH100);
  EXPECT_EQ(k.gemm1_unit_rows, 256);
  EXPECT_EQ(k.gemm2_unit_rows, 128);
}

// Kimi-K3's routing at reduced widths (ep32-896 rank 7 of the validation matrix): T = 300 gives ~5
// rows per local expert, several token tiles for some, and the 3-launch permutation. Eager calls
// and graph replays of one plan must give the same bits, call after call, as the inputs in the
// same buffers change between two sets (as the validation matrix's graph check does).
TEST(UnitRows, EagerAndReplaysAgreeAcrossCalls) {
  K3MOE_REQUIRE_GPU();
  MoeConfig c = graph_config();
  c.num_experts = 896;
  c.top_k = 16;
  const ExpertParallel ep{32, 7};
  SyntheticSpec spec;
  spec.config = c;
  spec.seed = 21;
  const DeviceExperts experts = DeviceExperts::upload(synthesize_experts(spec, c.first_moe_layer(), ep), 0);
  const CudaStream stream;
  const int T = 300;
  Inputs sets[2] = {Inputs(c, T, 5, true), Inputs(c, T, 6, true)};
  Inputs in(c, T, 5, true);
  const auto use = [&](int set) {
    for (auto [to, from] : {std::pair{&in.x, &sets[set].x}, std::pair{&in.logits, &sets[set].logits}})
      K3MOE_CUDA_CHECK(
          cudaMemcpyAsync(to->data(), from->data(), size_t(to->bytes()), cudaMemcpyDeviceToDevice, stream));
  };
  for (Mode mode : {Mode::A16, Mode::Mxfp8})
    for (int rows : {256, 128})
      for (int splits : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "mode " << to_string(mode) << ", unit rows " << rows << ", splits "
                                          << splits);
        PlanOptions o{c, T, mode, Activation::Situ, c.activation_params, ep, 0};
        o.gemm1_splits = o.gemm2_splits = splits;
        o.gemm1_unit_rows = o.gemm2_unit_rows = rows;
        const MoePlan plan = MoePlan::create(o);
        const CapturedGraph graph(stream, [&] { plan.forward(experts, in.args(), stream); });
        const auto run = [&](bool replay) {
          in.out.fill_bytes(0xFF);
          if (replay) graph.launch(stream);
          else plan.forward(experts, in.args(), stream);
          K3MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
          return in.out.download<uint16_t>();
        };
        std::vector<uint16_t> want[2];
        for (int set = 0; set < 2; ++set) {
          use(set);
          want[set] = run(false);
        }
        ASSERT_NE(want[0], want[1]);
        int differ = 0;
        for (int i = 0; i < 12; ++i) {
          use(i % 2);
          differ += run(i % 3 != 0) != want[i % 2];
        }
        EXPECT_EQ(differ, 0) << "of 12 calls (8 replays)";
      }
}
}  // namespace
}  // namespace k3moe
