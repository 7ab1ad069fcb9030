// DeviceExperts: a rank's experts reordered into the kernel layout (kernels/expert_layout.cuh) on
// the host, then copied to the GPU once. download() inverts the layout for the round-trip test.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "k3moe/error.h"
#include "k3moe/plan.h"
#include "kernels/expert_layout.cuh"
#include "runtime/device_buffer.h"
#include "runtime/device_experts_impl.h"
#include "runtime/tensor_checks.h"
#include "runtime/worker_threads.h"

namespace k3moe {
namespace {

// One expert's matrix [N, K] and where it starts in its buffers (the same offsets in the checkpoint's
// and the kernel's: both hold N * K / 2 code bytes and N * K / 32 scales per expert).
struct MatrixView {
  int N, K;
  bool is_w13;
  int64_t codes_offset, scales_offset;
  // The checkpoint row that kernel row r holds (W13 interleaves gate and up rows).
  int source_row(int r) const { return is_w13 ? layout::w13_checkpoint_row(r, N / 2) : r; }
};

void matrix_to_kernel(const MatrixView& m, const uint8_t* packed, const uint8_t* scale, uint8_t* kcodes,
                      uint8_t* kscales, int global_expert, const MoeConfig& config) {
  std::fill(kcodes, kcodes + int64_t(m.N) * m.K / 2, 0);
  for (int r = 0; r < m.N; ++r) {
    const int src = m.source_row(r);
    const uint8_t* row_codes = packed + int64_t(src) * (m.K / 2);
    const uint8_t* row_scales = scale + int64_t(src) * (m.K / 32);
    for (int k = 0; k < m.K; ++k) {
      if (row_scales[k / 32] == kE8M0NaN) continue;  // NOTE: a NaN group keeps zero codes (see KernelLayout)
      const layout::CodeBits pos = layout::code_bits(r, k, m.N, m.K);
      const uint8_t code = e2m1_nibble(row_codes[k / 2], k);
      for (int j = 0; j < 4; ++j)
        if (code >> j & 1) kcodes[pos.word_byte + pos.bit[j] / 8] |= uint8_t(1u << (pos.bit[j] % 8));
    }
    for (int group = 0; group < m.K / 32; ++group) {
      const uint8_t s = row_scales[group];
      if (s > layout::kMaxScale && s != kE8M0NaN) {
        const char* tensor = !m.is_w13 ? "w2" : src < config.intermediate ? "w1" : "w3";
        const int row = m.is_w13 && src >= config.intermediate ? src - config.intermediate : src;
        K3MOE_FAIL("expert ", global_expert, " ", tensor, ".weight_scale[", row, ", ", group, "] = ", int(s),
                   " (2^", int(s) - 127, "): the kernels take E8M0 scales 0..", int(layout::kMaxScale),
                   " (group scales up to 2) and 255 (NaN); larger scales are not supported");
      }
      kscales[layout::scale_position(r, group * 32, m.N, m.K)] = layout::scale_to_kernel(s);
    }
  }
}

void matrix_from_kernel(const MatrixView& m, const uint8_t* kcodes, const uint8_t* kscales, uint8_t* packed,
                        uint8_t* scale) {
  for (int r = 0; r < m.N; ++r) {
    const int dst = m.source_row(r);
    uint8_t* row_codes = packed + int64_t(dst) * (m.K / 2);
    for (int k = 0; k < m.K; ++k) {
      const layout::CodeBits pos = layout::code_bits(r, k, m.N, m.K);
      uint8_t code = 0;
      for (int j = 0; j < 4; ++j) code |= uint8_t((kcodes[pos.word_byte + pos.bit[j] / 8] >> (pos.bit[j] % 8) & 1) << j);
      row_codes[k / 2] = (k % 2) ? uint8_t(row_codes[k / 2] | (code << 4)) : code;
    }
    for (int group = 0; group < m.K / 32; ++group)
      scale[int64_t(dst) * (m.K / 32) + group] =
          layout::scale_from_kernel(kscales[layout::scale_position(r, group * 32, m.N, m.K)]);
  }
}

// Runs fn(local expert, matrix) for W13 and W2 of every local expert, one expert per task on all
// hardware threads; rethrows the lowest expert's error.
template <class Fn>
void for_each_expert_matrix(const MoeConfig& c, int num_local, Fn fn) {
  const KernelLayoutSizes one = kernel_layout_sizes(c, ExpertParallel{c.num_experts, 0});  // per expert
  parallel_for(num_local, int(std::max(1u, std::thread::hardware_concurrency())), "kernel layout", [&](int64_t e) {
    fn(int(e), MatrixView{2 * c.intermediate, c.hidden, true, e * one.w13_codes, e * one.w13_scales});
    fn(int(e), MatrixView{c.hidden, c.intermediate, false, e * one.w2_codes, e * one.w2_scales});
  });
}

// The layout stores K (H for W13, I for W2) in chunks of kChunkK: any other K would index past
// the buffers.
void check_layout_dimensions(const MoeConfig& c) {
  K3MOE_CHECK(c.hidden % layout::kChunkK == 0 && c.intermediate % layout::kChunkK == 0, "the kernel layout needs H "
              "and I to be multiples of ", layout::kChunkK, " (it stores K in chunks of ", layout::kChunkK,
              "), got H = ", c.hidden, ", I = ", c.intermediate);
}

}  // namespace

KernelLayoutSizes kernel_layout_sizes(const MoeConfig& c, ExpertParallel ep) {
  c.validate();
  ep.validate(c.num_experts);
  const int64_t L = ep.num_local(c.num_experts), H = c.hidden, I = c.intermediate;
  return {L * 2 * I * H / 2, L * 2 * I * H / 32, L * H * I / 2, L * H * I / 32};
}

KernelLayout to_kernel_layout(const RankExperts& experts) {
  experts.validate();
  const MoeConfig& c = experts.config;
  check_layout_dimensions(c);
  const KernelLayoutSizes sizes = kernel_layout_sizes(c, experts.ep);
  KernelLayout out{std::vector<uint8_t>(sizes.w13_codes), std::vector<uint8_t>(sizes.w13_scales),
                   std::vector<uint8_t>(sizes.w2_codes), std::vector<uint8_t>(sizes.w2_scales)};
  for_each_expert_matrix(c, experts.num_local, [&](int e, const MatrixView& m) {
    const auto [packed, scale] = m.is_w13 ? std::tie(experts.w13_packed, experts.w13_scale)
                                          : std::tie(experts.w2_packed, experts.w2_scale);
    const auto [codes, scales] = m.is_w13 ? std::tie(out.w13_codes, out.w13_scales)
                                          : std::tie(out.w2_codes, out.w2_scales);
    matrix_to_kernel(m, packed.data() + m.codes_offset, scale.data() + m.scales_offset,
                     codes.data() + m.codes_offset, scales.data() + m.scales_offset, experts.first_expert + e, c);
  });
  return out;
}

RankExperts from_kernel_layout(const KernelLayout& in, const MoeConfig& c, int layer, ExpertParallel ep) {
  check_layout_dimensions(c);
  const KernelLayoutSizes sizes = kernel_layout_sizes(c, ep);
  const std::tuple<const char*, size_t, int64_t> buffers[] = {{"w13_codes", in.w13_codes.size(), sizes.w13_codes},
                                                               {"w13_scales", in.w13_scales.size(), sizes.w13_scales},
                                                               {"w2_codes", in.w2_codes.size(), sizes.w2_codes},
                                                               {"w2_scales", in.w2_scales.size(), sizes.w2_scales}};
  for (const auto& [name, bytes, expected] : buffers)
    K3MOE_CHECK(int64_t(bytes) == expected, "from_kernel_layout: ", name, " holds ", bytes, " bytes, the config (H ",
                c.hidden, ", I ", c.intermediate, ", ", ep.num_local(c.num_experts), " local experts) needs ", expected);
  RankExperts out = RankExperts::allocate(c, layer, ep);
  for_each_expert_matrix(c, out.num_local, [&](int, const MatrixView& m) {
    const auto [codes, scales] = m.is_w13 ? std::tie(in.w13_codes, in.w13_scales)
                                          : std::tie(in.w2_codes, in.w2_scales);
    const auto [packed, scale] = m.is_w13 ? std::tie(out.w13_packed, out.w13_scale)
                                          : std::tie(out.w2_packed, out.w2_scale);
    matrix_from_kernel(m, codes.data() + m.codes_offset, scales.data() + m.scales_offset,
                       packed.data() + m.codes_offset, scale.data() + m.scales_offset);
  });
  return out;
}

DeviceExperts DeviceExperts::upload(const RankExperts& experts, int device) {
  check_device_exists(device, "DeviceExperts::upload");
  const KernelLayout host = to_kernel_layout(experts);
  auto impl = std::make_unique<Impl>();
  impl->config = experts.config;
  impl->ep = experts.ep;
  impl->layer = experts.layer;
  impl->num_local = experts.num_local;
  impl->first_expert = experts.first_expert;
  impl->device = device;
  DeviceGuard guard(device);
  const std::vector<uint8_t>* parts[] = {&host.w13_codes, &host.w13_scales, &host.w2_codes, &host.w2_scales};
  int64_t total = 0;
  for (auto* part : parts) total += (int64_t(part->size()) + 255) / 256 * 256;
  impl->owned = DeviceBuffer(total);
  const uint8_t** pointers[] = {&impl->data.w13_codes, &impl->data.w13_scales, &impl->data.w2_codes,
                                &impl->data.w2_scales};
  int64_t offset = 0;
  for (int i = 0; i < 4; ++i) {
    uint8_t* dst = impl->owned.get<uint8_t>() + offset;
    K3MOE_CUDA_CHECK(cudaMemcpy(dst, parts[i]->data(), parts[i]->size(), cudaMemcpyHostToDevice));
    *pointers[i] = dst;
    offset += (int64_t(parts[i]->size()) + 255) / 256 * 256;
  }
  // A copy from pageable memory returns before its last DMA lands, on the default stream, which a
  // forward on a non-blocking stream does not wait for: the upload is synchronous only with this.
  K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return DeviceExperts(std::move(impl));
}

DeviceExperts DeviceExperts::view(const MoeConfig& config, ExpertParallel ep, int layer, int device, Pointers p) {
  config.validate();
  ep.validate(config.num_experts);
  check_layout_dimensions(config);
  K3MOE_CHECK(p.w13_codes && p.w13_scales && p.w2_codes && p.w2_scales, "DeviceExperts::view needs all four pointers");
  check_device_exists(device, "DeviceExperts::view");
  // The GEMMs' bulk copies fault (and leave the context unusable) on a source not 16-byte aligned,
  // in host memory, or past the end of its allocation.
  const KernelLayoutSizes sizes = kernel_layout_sizes(config, ep);
  const std::tuple<const char*, const void*, int64_t> named[] = {{"w13_codes", p.w13_codes, sizes.w13_codes},
                                                                 {"w13_scales", p.w13_scales, sizes.w13_scales},
                                                                 {"w2_codes", p.w2_codes, sizes.w2_codes},
                                                                 {"w2_scales", p.w2_scales, sizes.w2_scales}};
  for (const auto& [name, pointer, bytes] : named)
    check_device_memory(pointer, bytes, device, 16, std::string("DeviceExperts::view: ") + name);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->ep = ep;
  impl->layer = layer;
  impl->num_local = ep.num_local(config.num_experts);
  impl->first_expert = ep.first_expert(config.num_experts);
  impl->device = device;
  impl->data = p;
  return DeviceExperts(std::move(impl));
}

RankExperts DeviceExperts::download() const {
  const Impl& d = *impl_;
  const KernelLayoutSizes sizes = kernel_layout_sizes(d.config, d.ep);
  DeviceGuard guard(d.device);
  auto fetch = [](const uint8_t* src, int64_t bytes) {
    std::vector<uint8_t> host(static_cast<size_t>(bytes));
    K3MOE_CUDA_CHECK(cudaMemcpy(host.data(), src, host.size(), cudaMemcpyDeviceToHost));
    return host;
  };
  const KernelLayout layout{fetch(d.data.w13_codes, sizes.w13_codes), fetch(d.data.w13_scales, sizes.w13_scales),
                            fetch(d.data.w2_codes, sizes.w2_codes), fetch(d.data.w2_scales, sizes.w2_scales)};
  return from_kernel_layout(layout, d.config, d.layer, d.ep);
}

DeviceExperts::DeviceExperts(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceExperts::DeviceExperts(DeviceExperts&&) noexcept = default;
DeviceExperts& DeviceExperts::operator=(DeviceExperts&&) noexcept = default;
DeviceExperts::~DeviceExperts() = default;

const MoeConfig& DeviceExperts::config() const { return impl_->config; }
ExpertParallel DeviceExperts::ep() const { return impl_->ep; }
int DeviceExperts::layer() const { return impl_->layer; }
int DeviceExperts::num_local() const { return impl_->num_local; }
int DeviceExperts::first_expert() const { return impl_->first_expert; }
int DeviceExperts::device() const { return impl_->device; }
int64_t DeviceExperts::bytes() const {
  const KernelLayoutSizes s = kernel_layout_sizes(impl_->config, impl_->ep);
  return s.w13_codes + s.w13_scales + s.w2_codes + s.w2_scales;
}

}  // namespace k3moe
