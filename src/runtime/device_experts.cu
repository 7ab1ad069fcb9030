// DeviceExperts: a rank's experts reordered into the kernel layout (kernels/expert_layout.cuh) on
// the host, then copied to the GPU once. download() inverts the layout for the round-trip test.
#include <algorithm>
#include <thread>
#include <vector>

#include "k3moe/error.h"
#include "k3moe/plan.h"
#include "kernels/expert_layout.cuh"
#include "runtime/device_buffer.h"
#include "runtime/device_experts_impl.h"

namespace k3moe {
namespace {

// One expert's matrix [N, K]; `source_row(r)` (below) maps a kernel row to the checkpoint row it holds.
struct MatrixView {
  int N, K;
  bool is_w13;
};

template <class RowMap>
void to_kernel_layout(const MatrixView& m, const uint8_t* packed, const uint8_t* scale, uint8_t* kcodes,
                      uint8_t* kscales, RowMap source_row, int global_expert, const MoeConfig& config) {
  std::fill(kcodes, kcodes + int64_t(m.N) * m.K / 2, 0);
  for (int r = 0; r < m.N; ++r) {
    const int src = source_row(r);
    const uint8_t* row_codes = packed + int64_t(src) * (m.K / 2);
    const uint8_t* row_scales = scale + int64_t(src) * (m.K / 32);
    for (int k = 0; k < m.K; ++k) {
      const layout::CodePosition pos = layout::code_position(r, k, m.K);
      kcodes[pos.byte] |= uint8_t(e2m1_nibble(row_codes[k / 2], k) << pos.shift);
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
      kscales[layout::scale_position(r, group * 32, m.K)] = layout::scale_to_kernel(s);
    }
  }
}

template <class RowMap>
void from_kernel_layout(const MatrixView& m, const uint8_t* kcodes, const uint8_t* kscales, uint8_t* packed,
                        uint8_t* scale, RowMap source_row) {
  for (int r = 0; r < m.N; ++r) {
    const int dst = source_row(r);
    uint8_t* row_codes = packed + int64_t(dst) * (m.K / 2);
    for (int k = 0; k < m.K; k += 2) {
      const layout::CodePosition even = layout::code_position(r, k, m.K);
      const layout::CodePosition odd = layout::code_position(r, k + 1, m.K);
      row_codes[k / 2] = pack_e2m1(uint8_t(kcodes[even.byte] >> even.shift), uint8_t(kcodes[odd.byte] >> odd.shift));
    }
    for (int group = 0; group < m.K / 32; ++group)
      scale[int64_t(dst) * (m.K / 32) + group] =
          layout::scale_from_kernel(kscales[layout::scale_position(r, group * 32, m.K)]);
  }
}

// Runs fn(expert) for every local expert on all hardware threads; rethrows the first error.
template <class Fn>
void for_each_expert(int num_local, Fn fn) {
  const int threads = std::max(1, std::min<int>(num_local, int(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (int e = t; e < num_local; e += threads) fn(e);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (auto& err : errors)
    if (err) std::rethrow_exception(err);
}

}  // namespace

DeviceExperts DeviceExperts::upload(const RankExperts& experts, int device) {
  experts.validate();
  const MoeConfig& c = experts.config;
  K3MOE_CHECK(c.hidden % 128 == 0 && c.intermediate % 128 == 0,
              "the kernels need H and I to be multiples of 128, got H = ", c.hidden, ", I = ", c.intermediate);
  auto impl = std::make_unique<Impl>();
  impl->config = c;
  impl->ep = experts.ep;
  impl->layer = experts.layer;
  impl->num_local = experts.num_local;
  impl->first_expert = experts.first_expert;
  impl->device = device;

  const MatrixView w13{2 * c.intermediate, c.hidden, true}, w2{c.hidden, c.intermediate, false};
  const int64_t w13_codes = int64_t(w13.N) * w13.K / 2, w13_scales = int64_t(w13.N) * w13.K / 32;
  const int64_t w2_codes = int64_t(w2.N) * w2.K / 2, w2_scales = int64_t(w2.N) * w2.K / 32;
  const int L = experts.num_local;
  std::vector<uint8_t> host_w13c(L * w13_codes), host_w13s(L * w13_scales), host_w2c(L * w2_codes),
      host_w2s(L * w2_scales);
  const int I = c.intermediate;
  for_each_expert(L, [&](int e) {
    to_kernel_layout(w13, experts.w13_packed.data() + e * w13_codes, experts.w13_scale.data() + e * w13_scales,
                     host_w13c.data() + e * w13_codes, host_w13s.data() + e * w13_scales,
                     [I](int r) { return layout::w13_checkpoint_row(r, I); }, experts.first_expert + e, c);
    to_kernel_layout(w2, experts.w2_packed.data() + e * w2_codes, experts.w2_scale.data() + e * w2_scales,
                     host_w2c.data() + e * w2_codes, host_w2s.data() + e * w2_scales, [](int r) { return r; },
                     experts.first_expert + e, c);
  });

  DeviceGuard guard(device);
  auto upload_bytes = [](const std::vector<uint8_t>& host) {
    DeviceBuffer buffer(int64_t(host.size()));
    K3MOE_CUDA_CHECK(cudaMemcpy(buffer.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
    return buffer;
  };
  impl->w13_codes = upload_bytes(host_w13c);
  impl->w13_scales = upload_bytes(host_w13s);
  impl->w2_codes = upload_bytes(host_w2c);
  impl->w2_scales = upload_bytes(host_w2s);
  return DeviceExperts(std::move(impl));
}

RankExperts DeviceExperts::download() const {
  const Impl& d = *impl_;
  RankExperts out = RankExperts::allocate(d.config, d.layer, d.ep);
  DeviceGuard guard(d.device);
  auto download_bytes = [](const DeviceBuffer& buffer) {
    std::vector<uint8_t> host(size_t(buffer.bytes()));
    K3MOE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.get(), host.size(), cudaMemcpyDeviceToHost));
    return host;
  };
  const auto w13c = download_bytes(d.w13_codes), w13s = download_bytes(d.w13_scales);
  const auto w2c = download_bytes(d.w2_codes), w2s = download_bytes(d.w2_scales);
  const MoeConfig& c = d.config;
  const MatrixView w13{2 * c.intermediate, c.hidden, true}, w2{c.hidden, c.intermediate, false};
  const int64_t w13_codes = int64_t(w13.N) * w13.K / 2, w13_scales = int64_t(w13.N) * w13.K / 32;
  const int64_t w2_codes = int64_t(w2.N) * w2.K / 2, w2_scales = int64_t(w2.N) * w2.K / 32;
  const int I = c.intermediate;
  for_each_expert(d.num_local, [&](int e) {
    from_kernel_layout(w13, w13c.data() + e * w13_codes, w13s.data() + e * w13_scales,
                       out.w13_packed.data() + e * w13_codes, out.w13_scale.data() + e * w13_scales,
                       [I](int r) { return layout::w13_checkpoint_row(r, I); });
    from_kernel_layout(w2, w2c.data() + e * w2_codes, w2s.data() + e * w2_scales, out.w2_packed.data() + e * w2_codes,
                       out.w2_scale.data() + e * w2_scales, [](int r) { return r; });
  });
  return out;
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
  return impl_->w13_codes.bytes() + impl_->w13_scales.bytes() + impl_->w2_codes.bytes() + impl_->w2_scales.bytes();
}

}  // namespace k3moe
