#include "k3moe/experts.h"

#include <string>

#include "k3moe/error.h"

namespace k3moe {
namespace {

struct BufferShape {
  const char* name;
  int64_t experts, rows, cols;
  int64_t bytes() const { return experts * rows * cols; }
  std::string str() const {
    std::string s = "[";
    s += std::to_string(experts) + ", " + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    return s;
  }
};

struct Shapes {
  BufferShape w13_packed, w13_scale, w2_packed, w2_scale;
};

Shapes shapes(const MoeConfig& c, int num_local) {
  const int64_t two_i = 2 * int64_t(c.intermediate);
  return {{"w13_packed", num_local, two_i, c.hidden / 2},
          {"w13_scale", num_local, two_i, c.hidden / 32},
          {"w2_packed", num_local, c.hidden, c.intermediate / 2},
          {"w2_scale", num_local, c.hidden, c.intermediate / 32}};
}

void check_buffer(const BufferShape& shape, const std::vector<uint8_t>& buffer) {
  K3MOE_CHECK(int64_t(buffer.size()) == shape.bytes(), "RankExperts.", shape.name, " must be ", shape.str(),
              " uint8 (", shape.bytes(), " bytes), got ", buffer.size(), " bytes");
}

// What the buffer layout itself needs. The kernels' stricter rules (multiples of 64) are
// MoeConfig::validate's; host-only users such as the reference may use smaller shapes.
void check_layout(const MoeConfig& c) {
  K3MOE_CHECK(c.hidden > 0 && c.hidden % 32 == 0, "RankExperts: hidden (H) must be a positive multiple of 32, got ",
              c.hidden);
  K3MOE_CHECK(c.intermediate > 0 && c.intermediate % 32 == 0,
              "RankExperts: intermediate (I) must be a positive multiple of 32, got ", c.intermediate);
  K3MOE_CHECK(c.num_experts >= 1, "RankExperts: num_experts must be >= 1, got ", c.num_experts);
  c.check_layer_bytes();
}

}  // namespace

RankExperts RankExperts::allocate(const MoeConfig& config, int layer, ExpertParallel ep) {
  check_layout(config);
  ep.validate(config.num_experts);
  RankExperts r;
  r.config = config;
  r.layer = layer;
  r.ep = ep;
  r.num_local = ep.num_local(config.num_experts);
  r.first_expert = ep.first_expert(config.num_experts);
  const Shapes s = shapes(config, r.num_local);
  r.w13_packed.assign(size_t(s.w13_packed.bytes()), 0);
  r.w13_scale.assign(size_t(s.w13_scale.bytes()), 0);
  r.w2_packed.assign(size_t(s.w2_packed.bytes()), 0);
  r.w2_scale.assign(size_t(s.w2_scale.bytes()), 0);
  return r;
}

void RankExperts::validate() const {
  check_layout(config);
  ep.validate(config.num_experts);
  K3MOE_CHECK(num_local == ep.num_local(config.num_experts), "RankExperts.num_local must be E / P = ",
              ep.num_local(config.num_experts), ", got ", num_local);
  K3MOE_CHECK(first_expert == ep.first_expert(config.num_experts), "RankExperts.first_expert must be r E / P = ",
              ep.first_expert(config.num_experts), ", got ", first_expert);
  const Shapes s = shapes(config, num_local);
  check_buffer(s.w13_packed, w13_packed);
  check_buffer(s.w13_scale, w13_scale);
  check_buffer(s.w2_packed, w2_packed);
  check_buffer(s.w2_scale, w2_scale);
}

}  // namespace k3moe
