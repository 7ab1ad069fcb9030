// The float64 reference of the routed-expert forward (see reference.h for the contract).
//
// Work is organised by expert, not by token: the (token, slot) pairs that hit a local expert are
// gathered first, then every needed weight row is dequantized once and applied to all of them.
// Tokens are processed in chunks only so that the per-pair buffers stay bounded (a few tokens, as
// the CLI runs, form one chunk).
//
// Emulate, step by step (double arithmetic; these are the only roundings):
//   x_in = x (a16) | MXFP8(x) per 32 along H (mxfp8)
//   h    = fp32(x_in . W13^T)
//   a    = act(h) in double, held as fp32 (the kernel's register), then bf16 (a16) | MXFP8 per 32
//          along I (mxfp8)
//   y    = fp32(a . W2^T)
//   out  = bf16(fp32(sum_k w_k y_k)), the sum in double in slot order
#include <algorithm>
#include <bit>
#include <thread>

#include "k3moe/activation.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "k3moe/quantize.h"
#include "k3moe/reference.h"
#include "forward_internal.h"
#include "runtime/worker_threads.h"

namespace k3moe {
namespace {

constexpr int kGroup = 32;       // MX group (weights and activations)
constexpr int kRowBlock = 32;    // weight rows per work item
constexpr size_t kChunkBudget = size_t(64) << 20;  // bytes of per-pair buffers per token chunk

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads (inline when the work is small).
template <class Fn>
void parallel_for(int64_t n, double flops, Fn&& fn) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = int(std::min<int64_t>({int64_t(hw), int64_t(32), n}));
  if (threads <= 1 || flops < 4e6) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  k3moe::parallel_for(n, threads, "reference forward", fn);
}

double dot(const double* a, const double* b, int n) {
  // NOTE: four partial sums (n is a multiple of 32) for instruction-level parallelism; the order
  // differs from a plain loop only in the last bits of a double, far below every tolerance.
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  for (int i = 0; i < n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  return (s0 + s1) + (s2 + s3);
}

// The dot product summed as fp32 over blocks of 16 products, each block exact (n is a multiple of 32).
double dot_fp32_blocks(const double* a, const double* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; i += 16) {
    double block = 0.0;
    for (int j = i; j < i + 16; ++j) block += a[j] * b[j];
    sum += float(block);
  }
  return double(sum);
}

float truncate_to_bf16(float f) { return bf16_bits_to_float(uint16_t(std::bit_cast<uint32_t>(f) >> 16)); }

// The two E2M1 values of every packed byte (low nibble = even element), exact in double.
struct PairTable {
  double v[256][2];
  PairTable() {
    for (int b = 0; b < 256; ++b) {
      v[b][0] = double(e2m1_to_float(e2m1_nibble(uint8_t(b), 0)));
      v[b][1] = double(e2m1_to_float(e2m1_nibble(uint8_t(b), 1)));
    }
  }
};
const PairTable& e2m1_pairs() {
  static const PairTable table;  // NOTE: function-local, so it is ready whenever it is first used
  return table;
}

// One MXFP4 row (len values, len/2 packed bytes, len/32 scales) to double, exactly.
void dequantize_row(const uint8_t* packed, const uint8_t* scales, int len, double* out) {
  const PairTable& pairs = e2m1_pairs();
  for (int g = 0; g < len / kGroup; ++g) {
    const double s = double(e8m0_to_float(scales[g]));
    for (int j = 0; j < kGroup / 2; ++j) {
      const double* pair = pairs.v[packed[g * kGroup / 2 + j]];
      out[g * kGroup + 2 * j] = pair[0] * s;
      out[g * kGroup + 2 * j + 1] = pair[1] * s;
    }
  }
}

// MXFP8 round trip of n (a multiple of 32) fp32 values, per 32, into double.
void mxfp8_round_trip(const float* in, int n, double* out) {
  uint8_t codes[kGroup];
  for (int g = 0; g < n / kGroup; ++g) {
    const uint8_t s = quantize_mxfp8_group(in + g * kGroup, kGroup, codes);
    const double scale = double(e8m0_to_float(s));
    for (int j = 0; j < kGroup; ++j) out[g * kGroup + j] = double(e4m3_to_float(codes[j])) * scale;
  }
}

void check_problem(const ReferenceProblem& p) {
  K3MOE_CHECK(p.experts != nullptr, "reference_forward: problem.experts is null");
  K3MOE_CHECK(p.routing != nullptr, "reference_forward: problem.routing is null");
  const RankExperts& ex = *p.experts;
  const MoeConfig& c = ex.config;
  const int64_t H = c.hidden, I = c.intermediate, E = c.num_experts, L = ex.num_local;
  K3MOE_CHECK(H > 0 && H % kGroup == 0, "reference_forward: hidden must be a positive multiple of 32, got ", H);
  K3MOE_CHECK(I > 0 && I % kGroup == 0, "reference_forward: intermediate must be a positive multiple of 32, got ", I);
  K3MOE_CHECK(L >= 0 && ex.first_expert >= 0 && ex.first_expert + L <= E, "reference_forward: local experts [",
              ex.first_expert, ", ", ex.first_expert + L, ") must lie in [0, ", E, ")");
  auto check_size = [](const std::vector<uint8_t>& buf, const char* name, int64_t a, int64_t b, int64_t cols) {
    K3MOE_CHECK(int64_t(buf.size()) == a * b * cols, "reference_forward: ", name, " must be [", a, ", ", b, ", ",
                cols, "] uint8, got ", buf.size(), " bytes");
  };
  check_size(ex.w13_packed, "w13_packed", L, 2 * I, H / 2);
  check_size(ex.w13_scale, "w13_scale", L, 2 * I, H / kGroup);
  check_size(ex.w2_packed, "w2_packed", L, H, I / 2);
  check_size(ex.w2_scale, "w2_scale", L, H, I / kGroup);

  const Routing& r = *p.routing;
  K3MOE_CHECK(p.tokens >= 0, "reference_forward: tokens must be >= 0, got ", p.tokens);
  K3MOE_CHECK(p.x_bf16.size() == size_t(p.tokens) * size_t(H), "reference_forward: x must be [", p.tokens, ", ",
              H, "] bf16 (", int64_t(p.tokens) * H, " values), got ", p.x_bf16.size(), " values");
  K3MOE_CHECK(r.tokens == p.tokens, "reference_forward: routing holds ", r.tokens, " tokens, x holds ", p.tokens);
  K3MOE_CHECK(r.top_k >= 1, "reference_forward: routing top_k must be >= 1, got ", r.top_k);
  K3MOE_CHECK(r.weights.size() == size_t(p.tokens) * size_t(r.top_k), "reference_forward: routing weights must be [",
              p.tokens, ", ", r.top_k, "] fp32, got ", r.weights.size(), " values");
  check_routing_ids(r.ids, p.tokens, r.top_k, int(E));
  K3MOE_CHECK(p.mode == Mode::A16 || p.mode == Mode::Mxfp8, "reference_forward: mode must be A16 or Mxfp8, got ",
              int(p.mode));
  K3MOE_CHECK(p.activation == Activation::Situ || p.activation == Activation::Swiglu ||
                  p.activation == Activation::SwigluOai,
              "reference_forward: activation must be Situ, Swiglu or SwigluOai, got ", int(p.activation));
  p.params.validate();
}

}  // namespace

std::vector<double> reference_forward(const ReferenceProblem& p, Precision precision) {
  check_problem(p);
  K3MOE_CHECK(precision == Precision::Ideal || precision == Precision::Emulate,
              "reference_forward: precision must be Ideal or Emulate, got ", int(precision));
  const MoeConfig& c = p.experts->config;
  const size_t pair_bytes = size_t(p.routing->top_k) * (size_t(2) * c.intermediate + c.hidden) * sizeof(double);
  const int chunk = int(std::clamp<size_t>(kChunkBudget / pair_bytes, 1, size_t(std::max(p.tokens, 1))));
  return detail::reference_forward_chunked(p, precision, chunk);
}

std::vector<double> detail::reference_forward_chunked(const ReferenceProblem& p, Precision precision,
                                                      int chunk, const EmulationVariant& variant) {
  check_problem(p);
  K3MOE_CHECK(chunk >= 1, "reference_forward: chunk_tokens must be >= 1, got ", chunk);
  const RankExperts& ex = *p.experts;
  const int H = ex.config.hidden, I = ex.config.intermediate, K = p.routing->top_k;
  const int T = p.tokens, L = ex.num_local;
  const bool emulate = precision == Precision::Emulate;
  const auto sum = emulate && variant.fp32_block_sums ? dot_fp32_blocks : dot;
  const auto activation_to_bf16 = emulate && variant.truncate_activation ? truncate_to_bf16 : round_to_bf16;
  const auto output_to_bf16 = emulate && variant.truncate_output ? truncate_to_bf16 : round_to_bf16;
  std::vector<double> out(size_t(T) * H, 0.0);
  if (T == 0 || L == 0) return out;

  std::vector<double> x_in, h, y;
  std::vector<int> pair_token, pair_of_slot, first_pair(size_t(L) + 1);
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int tc = std::min(chunk, T - t0);

    // ---- (token, slot) pairs grouped by local expert: first_pair[e] .. first_pair[e + 1]
    std::vector<int> count(size_t(L) + 1, 0);
    pair_of_slot.assign(size_t(tc) * K, -1);
    for (int t = 0; t < tc; ++t)
      for (int k = 0; k < K; ++k) {
        const int local = p.routing->ids[size_t(t0 + t) * K + k] - ex.first_expert;
        if (local >= 0 && local < L) ++count[local + 1];
      }
    for (int e = 0; e < L; ++e) count[e + 1] += count[e];
    first_pair = count;
    const int pairs = count[L];
    pair_token.assign(size_t(pairs), 0);
    for (int t = 0; t < tc; ++t)
      for (int k = 0; k < K; ++k) {
        const int local = p.routing->ids[size_t(t0 + t) * K + k] - ex.first_expert;
        if (local < 0 || local >= L) continue;  // -1 or another rank's expert
        const int pr = count[local]++;
        pair_token[pr] = t;
        pair_of_slot[size_t(t) * K + k] = pr;
      }

    // ---- expert inputs
    x_in.assign(size_t(tc) * H, 0.0);
    std::vector<float> row(H);
    for (int t = 0; t < tc; ++t) {
      const uint16_t* xb = p.x_bf16.data() + size_t(t0 + t) * H;
      double* xi = x_in.data() + size_t(t) * H;
      for (int k = 0; k < H; ++k) row[k] = bf16_bits_to_float(xb[k]);
      if (emulate && p.mode == Mode::Mxfp8) {
        mxfp8_round_trip(row.data(), H, xi);
      } else {
        for (int k = 0; k < H; ++k) xi[k] = double(row[k]);
      }
    }

    // Work items: (expert, block of kRowBlock weight rows) over experts that have pairs.
    auto make_items = [&](int rows) {
      std::vector<std::pair<int, int>> items;
      for (int e = 0; e < L; ++e)
        if (first_pair[e + 1] > first_pair[e])
          for (int r = 0; r < rows; r += kRowBlock) items.emplace_back(e, r);
      return items;
    };

    // ---- GEMM1: h[pair, n] = x_in[token] . W13[e, n], n < 2I
    h.assign(size_t(pairs) * 2 * I, 0.0);
    const auto items1 = make_items(2 * I);
    parallel_for(int64_t(items1.size()), double(pairs) * 2 * I * H, [&](int64_t it) {
      const auto [e, r0] = items1[size_t(it)];
      std::vector<double> w(H);
      for (int n = r0; n < std::min(r0 + kRowBlock, 2 * I); ++n) {
        const int64_t wrow = int64_t(e) * 2 * I + n;
        dequantize_row(ex.w13_packed.data() + wrow * (H / 2), ex.w13_scale.data() + wrow * (H / kGroup), H,
                       w.data());
        for (int pr = first_pair[e]; pr < first_pair[e + 1]; ++pr) {
          const double v = sum(x_in.data() + size_t(pair_token[pr]) * H, w.data(), H);
          h[size_t(pr) * 2 * I + n] = emulate ? double(float(v)) : v;
        }
      }
    });

    // ---- activation, in place: a[pair, i] overwrites h[pair, i] (i < I)
    parallel_for(pairs, double(pairs) * I * 40, [&](int64_t pr) {
      double* hp = h.data() + size_t(pr) * 2 * I;
      float a32[kGroup];
      for (int g = 0; g < I / kGroup; ++g) {
        for (int j = 0; j < kGroup; ++j) {
          const int i = g * kGroup + j;
          const double a = apply_activation<double>(p.activation, p.params, hp[i], hp[I + i]);
          if (!emulate) hp[i] = a;
          a32[j] = float(a);
        }
        if (!emulate) continue;
        if (p.mode == Mode::Mxfp8) {
          mxfp8_round_trip(a32, kGroup, hp + g * kGroup);
        } else {
          for (int j = 0; j < kGroup; ++j) hp[g * kGroup + j] = double(activation_to_bf16(a32[j]));
        }
      }
    });

    // ---- GEMM2: y[pair, j] = a[pair] . W2[e, j], j < H
    y.assign(size_t(pairs) * H, 0.0);
    const auto items2 = make_items(H);
    parallel_for(int64_t(items2.size()), double(pairs) * H * I, [&](int64_t it) {
      const auto [e, r0] = items2[size_t(it)];
      std::vector<double> w(I);
      for (int j = r0; j < std::min(r0 + kRowBlock, H); ++j) {
        const int64_t wrow = int64_t(e) * H + j;
        dequantize_row(ex.w2_packed.data() + wrow * (I / 2), ex.w2_scale.data() + wrow * (I / kGroup), I, w.data());
        for (int pr = first_pair[e]; pr < first_pair[e + 1]; ++pr) {
          const double v = sum(h.data() + size_t(pr) * 2 * I, w.data(), I);
          y[size_t(pr) * H + j] = emulate ? double(float(v)) : v;
        }
      }
    });

    // ---- combine, in slot order
    for (int t = 0; t < tc; ++t) {
      double* o = out.data() + size_t(t0 + t) * H;
      for (int k = 0; k < K; ++k) {
        const int pr = pair_of_slot[size_t(t) * K + k];
        if (pr < 0) continue;
        const double w = double(p.routing->weights[size_t(t0 + t) * K + k]);
        const double* yp = y.data() + size_t(pr) * H;
        for (int j = 0; j < H; ++j) o[j] += w * yp[j];
      }
      if (emulate)
        for (int j = 0; j < H; ++j) o[j] = double(output_to_bf16(float(o[j])));
    }
  }
  return out;
}

}  // namespace k3moe
