#include "bench_baseline.h"

#include <cublasLt.h>

#include "cublas_check.h"

#include <map>
#include <tuple>

#include "k3moe/activation.h"
#include "k3moe/error.h"
#include "k3moe/formats.h"
#include "runtime/captured_graph.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace k3moe::cli {
namespace {


constexpr int kThreads = 256;

__global__ void dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, uint16_t* out, int64_t elements) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elements; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = float_to_bf16_bits(e2m1_to_float(e2m1_nibble(packed[i / 2], int(i % 2))) * e8m0_to_float(scales[i / 32]));
}

__global__ void gather_rows(const uint16_t* x, const int32_t* row_token, uint16_t* xg, int rows, int hidden) {
  const int row = blockIdx.x;
  if (row >= rows) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(row_token[row]) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(xg + int64_t(row) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void activation_rows(const uint16_t* h, uint16_t* a, int64_t rows, int inter, Activation act,
                                ActivationParams params) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * inter; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / inter, j = i % inter;
    const float g = bf16_bits_to_float(h[row * 2 * inter + j]), u = bf16_bits_to_float(h[row * 2 * inter + inter + j]);
    a[i] = float_to_bf16_bits(apply_activation<float>(act, params, g, u));
  }
}

__global__ void combine_rows(const uint16_t* y, const int32_t* slot_row, const float* weights, uint16_t* out,
                             int top_k, int hidden) {
  const int token = blockIdx.x;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < top_k; ++k) {
      const int32_t row = slot_row[token * top_k + k];
      if (row >= 0) acc = fmaf(weights[token * top_k + k], bf16_bits_to_float(y[int64_t(row) * hidden + h]), acc);
    }
    out[int64_t(token) * hidden + h] = float_to_bf16_bits(acc);
  }
}

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536)); }

}  // namespace

struct BaselineForward::Impl {
  MoeConfig config;
  int num_local = 0, first_expert = 0;
  Activation activation;
  ActivationParams params;
  DeviceBuffer w13, w2, workspace;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  std::map<std::tuple<int, int, int>, cublasLtMatmulHeuristicResult_t> algos;

  struct Gemm {
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulHeuristicResult_t algo;
    const void *A, *B;
    void* D;
  };
  struct Set {
    int tokens = 0, rows = 0;
    DeviceBuffer row_token, slot_row, weights, xg, h, act, y;
    std::vector<Gemm> gemm1, gemm2;
    CapturedGraph graph;
    const uint16_t* x = nullptr;
    uint16_t* out = nullptr;
  };
  std::vector<std::unique_ptr<Set>> sets;

  // D [rows, n] = X [rows, k] . W [n, k]^T, all row-major bf16: cuBLASLt "TN" on the transposes.
  Gemm make_gemm(const void* w, const void* x, void* d, int n, int k, int rows) {
    Gemm g{};
    K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, n, k));
    K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, rows, k));
    K3MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, n, rows, n));
    auto key = std::make_tuple(n, k, rows);
    if (auto it = algos.find(key); it != algos.end()) {
      g.algo = it->second;
    } else {
      cublasLtMatmulPreference_t pref;
      K3MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = size_t(workspace.bytes());
      K3MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      int found = 0;
      K3MOE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, g.a, g.b, g.d, g.d, pref, 1, &g.algo, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      K3MOE_CHECK(found > 0, "cuBLASLt has no bf16 algorithm for ", rows, " x ", n, " x ", k);
      algos[key] = g.algo;
    }
    g.A = w;
    g.B = x;
    g.D = d;
    return g;
  }

  void run_gemm(const Gemm& g, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    K3MOE_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, g.A, g.a, g.B, g.b, &beta, g.D, g.d, g.D, g.d, &g.algo.algo,
                                      workspace.get(), size_t(workspace.bytes()), stream));
  }

  void enqueue(Set& s, cudaStream_t stream) {
    const int H = config.hidden, I = config.intermediate;
    if (s.rows > 0) {
      gather_rows<<<s.rows, 128, 0, stream>>>(s.x, s.row_token.get<int32_t>(), s.xg.get<uint16_t>(), s.rows, H);
      for (const Gemm& g : s.gemm1) run_gemm(g, stream);
      activation_rows<<<blocks_for(int64_t(s.rows) * I), kThreads, 0, stream>>>(
          s.h.get<uint16_t>(), s.act.get<uint16_t>(), s.rows, I, activation, params);
      for (const Gemm& g : s.gemm2) run_gemm(g, stream);
    }
    combine_rows<<<s.tokens, kThreads, 0, stream>>>(s.y.get<uint16_t>(), s.slot_row.get<int32_t>(),
                                                    s.weights.get<float>(), s.out, config.top_k, H);
    K3MOE_CUDA_CHECK(cudaGetLastError());
  }
};

BaselineForward::BaselineForward(const RankExperts& experts, Activation activation, const ActivationParams& params)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.config = experts.config;
  p.num_local = experts.num_local;
  p.first_expert = experts.first_expert;
  p.activation = activation;
  p.params = params;
  auto dequantize = [](const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales) {
    DeviceBuffer dp(int64_t(packed.size())), ds(int64_t(scales.size())), out(int64_t(packed.size()) * 4);
    K3MOE_CUDA_CHECK(cudaMemcpy(dp.get(), packed.data(), packed.size(), cudaMemcpyHostToDevice));
    K3MOE_CUDA_CHECK(cudaMemcpy(ds.get(), scales.data(), scales.size(), cudaMemcpyHostToDevice));
    const int64_t elements = int64_t(packed.size()) * 2;
    dequantize_mxfp4<<<blocks_for(elements), kThreads>>>(dp.get<uint8_t>(), ds.get<uint8_t>(), out.get<uint16_t>(), elements);
    K3MOE_CUDA_CHECK(cudaGetLastError());
    K3MOE_CUDA_CHECK(cudaDeviceSynchronize());
    return out;
  };
  p.w13 = dequantize(experts.w13_packed, experts.w13_scale);
  p.w2 = dequantize(experts.w2_packed, experts.w2_scale);
  p.workspace = DeviceBuffer(32 << 20);
  K3MOE_CUBLAS_CHECK(cublasLtCreate(&p.lt));
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  K3MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
}

BaselineForward::~BaselineForward() {
  for (auto& s : impl_->sets) {
    for (auto* list : {&s->gemm1, &s->gemm2})
      for (auto& g : *list) {
        cublasLtMatrixLayoutDestroy(g.a);
        cublasLtMatrixLayoutDestroy(g.b);
        cublasLtMatrixLayoutDestroy(g.d);
      }
  }
  if (impl_->op) cublasLtMatmulDescDestroy(impl_->op);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

int BaselineForward::add_input_set(const uint16_t* x, const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                   uint16_t* out, int tokens, cudaStream_t stream) {
  Impl& p = *impl_;
  const int K = p.config.top_k, H = p.config.hidden, I = p.config.intermediate;
  auto s = std::make_unique<Impl::Set>();
  s->tokens = tokens;
  s->x = x;
  s->out = out;
  // Token lists per local expert, on the host (the baseline is handed the routing).
  std::vector<std::vector<int>> slots(p.num_local);
  for (int i = 0; i < tokens * K; ++i)
    if (ids[i] >= p.first_expert && ids[i] < p.first_expert + p.num_local) slots[ids[i] - p.first_expert].push_back(i);
  std::vector<int32_t> row_token, slot_row(size_t(tokens) * K, -1);
  std::vector<std::pair<int, int>> ranges;  // (expert, first row)
  for (int e = 0; e < p.num_local; ++e) {
    ranges.emplace_back(e, int(row_token.size()));
    for (int slot : slots[e]) {
      slot_row[slot] = int32_t(row_token.size());
      row_token.push_back(slot / K);
    }
  }
  s->rows = int(row_token.size());
  auto upload = [](const auto& host) {
    DeviceBuffer b(std::max<int64_t>(16, int64_t(host.size() * sizeof(host[0]))));
    if (!host.empty()) K3MOE_CUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice));
    K3MOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // landed before the baseline's non-blocking stream reads it
    return b;
  };
  s->row_token = upload(row_token);
  s->slot_row = upload(slot_row);
  s->weights = upload(weights);
  const int64_t rows = std::max(1, s->rows);
  s->xg = DeviceBuffer(rows * H * 2);
  s->h = DeviceBuffer(rows * 2 * I * 2);
  s->act = DeviceBuffer(rows * I * 2);
  s->y = DeviceBuffer(rows * H * 2);
  for (auto [e, first] : ranges) {
    const int count = int(slots[e].size());
    if (count == 0) continue;
    const uint16_t* w13 = p.w13.get<uint16_t>() + int64_t(e) * 2 * I * H;
    const uint16_t* w2 = p.w2.get<uint16_t>() + int64_t(e) * H * I;
    s->gemm1.push_back(p.make_gemm(w13, s->xg.get<uint16_t>() + int64_t(first) * H, s->h.get<uint16_t>() + int64_t(first) * 2 * I,
                                   2 * I, H, count));
    s->gemm2.push_back(p.make_gemm(w2, s->act.get<uint16_t>() + int64_t(first) * I, s->y.get<uint16_t>() + int64_t(first) * H,
                                   H, I, count));
  }
  s->graph = CapturedGraph(stream, [&] { p.enqueue(*s, stream); });
  p.sets.push_back(std::move(s));
  return int(p.sets.size()) - 1;
}

void BaselineForward::launch(int set, cudaStream_t stream) {
  impl_->sets.at(set)->graph.launch(stream);
}

}  // namespace k3moe::cli
