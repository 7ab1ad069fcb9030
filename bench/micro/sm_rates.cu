// What the decode GEMMs' copy pipeline streams without them, and what their consumers' time per
// chunk costs it. Three CTAs per SM of the GEMMs' shape (4 consumer warps, 1 producer warp, 3
// stages of 17,408 bytes: one 256-row x 128-k chunk of MXFP4 with its scales) read MB megabytes by
// bulk copies (evict-first, as the GEMMs); the consumers touch each stage, wait delay_ns in place
// of the GEMM's work on it (the Tile8 consumers: ~2,230 cycles, ~1.1 us) and release it.
// Schedules of the same chunks: equal shares (CTA i takes chunks [i n / grid, (i + 1) n / grid),
// as each GEMM1 CTA at local28 T = 1 has one unit), and runs of `run` chunks from one counter (the
// GEMMs' persistent schedule). Printed (medians over repeats): span and rate, CTA end times
// (min / p10 / p50 / p90 / max, us from the first start) and, for equal shares, each SM's mean CTA
// time, how stable the SMs' order is between repeats (rank correlation), and a map of SM ids by
// speed decile (0: fastest).
// Options: delay_ns < 0 waits after the release instead of before (fragments copied out first);
// sleep 1 sleeps through the wait instead of spinning; stage_bytes and stages vary the chunk;
// cluster > 1 launches thread-block clusters of that many CTAs (the grid rounded down to a
// multiple) and prints, for equal shares, how much of the CTAs' spread in time lies inside a cluster
// and the span if each cluster had pooled its chunks: whether fast SMs could hand data to slower
// partners' consumers (distributed shared memory) at all.
// (H200, Session 29, 187 MB: 43.1-44.7 us with no wait, 47.0-48.2 at 1.1 us per chunk, whatever
// the stage count (2-4), the release point, spinning or sleeping, or halved chunks; the same SMs
// are fast as in the GEMMs. Session 32: partners in clusters of 2 are equally fast (1 % of the
// variance inside), and only 92 clusters of 4 or 45 of 8 fit at 3 CTAs per SM; bench/NOTES.md.)
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -Isrc bench/micro/sm_rates.cu
// Run: ./a.out [MB [repeats [run [delay_ns [stages [sleep [stage_bytes [cluster]]]]]]]]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "kernels/sm90/ptx.cuh"

namespace {

namespace ptx = k3moe::ptx;

constexpr int kMaxStages = 12, kMaxStageBytes = 17408, kConsumerWarps = 4, kThreads = 32 * (kConsumerWarps + 1);
constexpr int kCtasPerSm = 3;

struct CtaRecord {
  unsigned long long start, end;
  int smid, chunks;
};

__device__ int g_counter;

__device__ __forceinline__ int smid() {
  int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    stream_chunks(const uint8_t* src, int total_chunks, int run, int stages, int stage_bytes, int delay_ns, bool sleep,
                  CtaRecord* records, float* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ int s_count;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long start = ptx::globaltimer();
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], 32 * kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // The chunk sequence of this CTA, identical for the producer and the consumers: one contiguous
  // share (run == 0), or runs from the counter, published by the producer through the ring below.
  const bool equal = run == 0;
  const int first = int(int64_t(blockIdx.x) * total_chunks / gridDim.x);
  const int last = int(int64_t(blockIdx.x + 1) * total_chunks / gridDim.x);
  __shared__ int ring[kMaxStages];  // the chunk in each stage, -1: the end
  int stage = 0;
  uint32_t phase = 0;
  int count = 0;
  if (warp == kConsumerWarps) {
    if (lane == 0) {
      const uint64_t policy = ptx::l2_policy_evict_first();
      int c = equal ? first : 0, c_end = equal ? last : 0;
      for (;;) {
        if (!equal && c == c_end) {
          c = atomicAdd(&g_counter, run);
          c_end = min(c + run, total_chunks);
          if (c >= total_chunks) c = c_end = total_chunks;
        }
        ptx::mbarrier_wait_parity(&empty[stage], phase ^ 1);
        if (c == c_end) {
          ring[stage] = -1;
          ptx::mbarrier_arrive(&full[stage]);
          break;
        }
        ring[stage] = c;
        ptx::mbarrier_arrive_expect_tx(&full[stage], stage_bytes);
        ptx::cp_async_bulk_g2s(smem + stage * stage_bytes, src + int64_t(c) * stage_bytes, stage_bytes, &full[stage],
                               policy);
        ++c;
        ++count;
        if (++stage == stages) stage = 0, phase ^= 1;
      }
    }
  } else {
    float acc = 0.0f;
    for (;;) {
      ptx::mbarrier_wait_parity(&full[stage], phase);
      if (ring[stage] < 0) break;
      const uint4 v = ptx::ld_shared_v4(smem + stage * stage_bytes + threadIdx.x * 16);
      acc += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
      // The wait for the GEMM's work: before the release (the kernels today), or after it
      // (negative delay_ns: as if the fragments were copied to registers first).
      if (delay_ns < 0) ptx::mbarrier_arrive(&empty[stage]);
      if (delay_ns != 0) {
        // Spinning keeps the warp issuing, as the GEMM's consumers do; sleeping frees the issue slots.
        const unsigned long long t = ptx::globaltimer();
        while (ptx::globaltimer() - t < unsigned(abs(delay_ns)))
          if (sleep) __nanosleep(100);
      }
      if (delay_ns >= 0) ptx::mbarrier_arrive(&empty[stage]);
      if (++stage == stages) stage = 0, phase ^= 1;
    }
    if (acc == 1.2345f) *sink = acc;  // keeps the reads
  }
  __syncthreads();
  if (threadIdx.x == kConsumerWarps * 32) s_count = count;
  __syncthreads();
  if (threadIdx.x == 0) records[blockIdx.x] = {start, ptx::globaltimer(), smid(), s_count};
}

void check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * (v.size() - 1) + 0.5))];
}

// Spearman rank correlation of two equally long series.
double rank_correlation(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<int> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int i, int j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t k = 0; k < order.size(); ++k) r[order[k]] = double(k);
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = double(a.size()), mean = (n - 1) / 2;
  double num = 0, da = 0, db = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (ra[i] - mean) * (rb[i] - mean);
    da += (ra[i] - mean) * (ra[i] - mean);
    db += (rb[i] - mean) * (rb[i] - mean);
  }
  return num / std::sqrt(da * db);
}

bool stage_bytes_invalid(int bytes, int stages) {
  return bytes % 16 != 0 || bytes < 16 * 160 || bytes > kMaxStageBytes || stages * bytes * kCtasPerSm > 227 * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  const double mb = argc > 1 ? std::atof(argv[1]) : 187.0;  // GEMM1's weights at local28 T = 1
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  const int run = argc > 3 ? std::atoi(argv[3]) : 4;
  const int delay_ns = argc > 4 ? std::atoi(argv[4]) : 0;
  const int stages = argc > 5 ? std::atoi(argv[5]) : 3;
  const bool sleep = argc > 6 && std::atoi(argv[6]) != 0;
  const int stage_bytes = argc > 7 ? std::atoi(argv[7]) : kMaxStageBytes;
  const int cluster = argc > 8 ? std::atoi(argv[8]) : 1;
  if (!(mb > 0) || repeats < 1 || run < 1) {
    std::fprintf(stderr, "MB must be > 0, repeats and run >= 1; got %g, %d, %d\n", mb, repeats, run);
    return 2;
  }
  if (cluster < 1 || cluster > 8) {
    std::fprintf(stderr, "cluster must be 1..8 CTAs, got %d\n", cluster);
    return 2;
  }
  if (stages < 1 || stages > kMaxStages || stage_bytes_invalid(stage_bytes, stages)) {
    std::fprintf(stderr, "stages must be 1..%d, stage bytes a multiple of 16 in 2560..%d, 3 CTAs in 227 KB\n",
                 kMaxStages, kMaxStageBytes);
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount, grid = kCtasPerSm * sms / cluster * cluster;
  const int chunks = int(mb * 1e6 / stage_bytes);
  // Buffers rotated so that no repeat reads what the previous one left in L2.
  constexpr int kBuffers = 4;
  std::vector<uint8_t*> bufs(kBuffers);
  for (auto& b : bufs) {
    check(cudaMalloc(&b, size_t(chunks) * stage_bytes));
    check(cudaMemset(b, 0x5A, size_t(chunks) * stage_bytes));
  }
  CtaRecord* d_records;
  float* d_sink;
  check(cudaMalloc(&d_records, grid * sizeof(CtaRecord)));
  check(cudaMalloc(&d_sink, sizeof(float)));
  // As in the GEMMs, no fourth CTA fits on an SM: small stages are padded, or the CTA scheduler
  // (clusters above all) would place four CTAs on some SMs and leave others empty.
  const int smem_bytes = std::max(stages * stage_bytes, int(prop.sharedMemPerMultiprocessor / (kCtasPerSm + 1)));
  check(cudaFuncSetAttribute(stream_chunks, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  int ctas_per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, stream_chunks, kThreads, smem_bytes));
  if (ctas_per_sm != kCtasPerSm) {
    std::fprintf(stderr, "%d CTAs fit on an SM, not %d\n", ctas_per_sm, kCtasPerSm);
    return 2;
  }
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster_dim{};
  config.gridDim = grid;
  config.blockDim = kThreads;
  config.dynamicSmemBytes = smem_bytes;
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim = {unsigned(cluster), 1, 1};
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  int max_clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&max_clusters, stream_chunks, &config));
  std::printf(
      "%s, %d SMs; %d CTAs (%d per SM) of %d threads in clusters of %d (%d resident at once), %d stages of %d "
      "bytes; %.1f MB (%d chunks); consumers wait %d ns per chunk\n",
      prop.name, sms, grid, kCtasPerSm, kThreads, cluster, max_clusters, stages, stage_bytes,
      chunks * double(stage_bytes) / 1e6, chunks, delay_ns);

  for (int sched = 0; sched < 2; ++sched) {
    const int r = sched == 0 ? 0 : run;
    std::vector<double> spans, p[5], chunks_per_cta;
    std::vector<std::vector<double>> per_sm_runs;
    std::vector<double> within_fraction, pooled_span, cluster_sms;
    for (int rep = 0; rep < repeats + 1; ++rep) {  // the first is a warm-up
      const int zero = 0;
      check(cudaMemcpyToSymbol(g_counter, &zero, sizeof zero));
      check(cudaLaunchKernelEx(&config, stream_chunks, static_cast<const uint8_t*>(bufs[rep % kBuffers]), chunks, r,
                               stages, stage_bytes, delay_ns, sleep, d_records, d_sink));
      check(cudaGetLastError());
      std::vector<CtaRecord> rec(grid);
      check(cudaMemcpy(rec.data(), d_records, grid * sizeof(CtaRecord), cudaMemcpyDeviceToHost));
      if (rep == 0) continue;
      unsigned long long t0 = ~0ull, t1 = 0;
      for (const auto& c : rec) t0 = std::min(t0, c.start), t1 = std::max(t1, c.end);
      spans.push_back((t1 - t0) * 1e-3);
      std::vector<double> ends;
      std::vector<double> sm_sum(sms, 0.0);
      std::vector<int> sm_n(sms, 0);
      for (const auto& c : rec) {
        ends.push_back((c.end - t0) * 1e-3);
        chunks_per_cta.push_back(c.chunks);
        sm_sum[c.smid] += (c.end - c.start) * 1e-3;
        ++sm_n[c.smid];
      }
      const double q[5] = {0.0, 0.1, 0.5, 0.9, 1.0};
      for (int i = 0; i < 5; ++i) p[i].push_back(percentile(ends, q[i]));
      std::vector<double> per_sm(sms);
      for (int s = 0; s < sms; ++s) per_sm[s] = sm_n[s] ? sm_sum[s] / sm_n[s] : 0.0;
      per_sm_runs.push_back(per_sm);
      if (cluster > 1 && r == 0) {  // the counter evens the CTAs out by design
        // The CTA times' variance inside clusters (blocks c * cluster ..) against all of it, and the
        // span if every cluster had pooled its chunks (its CTAs' mean time).
        std::vector<double> time(grid);
        for (int b = 0; b < grid; ++b) time[b] = (rec[b].end - rec[b].start) * 1e-3;
        const double mean = std::accumulate(time.begin(), time.end(), 0.0) / grid;
        double total = 0, within = 0, pooled = 0, distinct = 0;
        for (int c = 0; c < grid / cluster; ++c) {
          double m = 0;
          std::vector<int> ids;
          for (int k = 0; k < cluster; ++k) {
            m += time[c * cluster + k] / cluster;
            ids.push_back(rec[c * cluster + k].smid);
          }
          for (int k = 0; k < cluster; ++k) {
            const double t = time[c * cluster + k];
            total += (t - mean) * (t - mean);
            within += (t - m) * (t - m);
          }
          pooled = std::max(pooled, (rec[c * cluster].start - t0) * 1e-3 + m);
          std::sort(ids.begin(), ids.end());
          distinct += double(std::unique(ids.begin(), ids.end()) - ids.begin());
        }
        within_fraction.push_back(total > 0 ? within / total : 0.0);
        pooled_span.push_back(pooled);
        cluster_sms.push_back(distinct / (grid / cluster));
      }
    }
    const double span = percentile(spans, 0.5);
    std::printf(
        "\n%s: span %.1f us (%.2f TB/s); CTA ends min / p10 / p50 / p90 / max: %.1f / %.1f / %.1f / %.1f / %.1f us\n",
        sched == 0 ? "equal shares" : "counter runs", span, chunks * double(stage_bytes) / span * 1e-6,
        percentile(p[0], 0.5), percentile(p[1], 0.5), percentile(p[2], 0.5), percentile(p[3], 0.5),
        percentile(p[4], 0.5));
    if (cluster > 1 && r == 0)
      std::printf(
          "  clusters of %d: %.2f distinct SMs each; %.0f %% of the CTA times' variance lies inside clusters; "
          "span if each cluster pooled its chunks: %.1f us\n",
          cluster, percentile(cluster_sms, 0.5), 100 * percentile(within_fraction, 0.5), percentile(pooled_span, 0.5));
    if (sched == 1) {
      std::printf("  runs of %d chunks from one counter; chunks per CTA min / p50 / max: %.0f / %.0f / %.0f\n", run,
                  percentile(chunks_per_cta, 0.0), percentile(chunks_per_cta, 0.5), percentile(chunks_per_cta, 1.0));
      continue;
    }
    // Per SM: the median over repeats of its CTAs' mean time.
    std::vector<double> sm_time(sms);
    for (int s = 0; s < sms; ++s) {
      std::vector<double> v;
      for (const auto& runs : per_sm_runs) v.push_back(runs[s]);
      sm_time[s] = percentile(v, 0.5);
    }
    std::printf(
        "  per SM (its CTAs' mean time, median of repeats): min %.1f, p10 %.1f, p50 %.1f, p90 %.1f, max %.1f us\n",
        percentile(sm_time, 0.0), percentile(sm_time, 0.1), percentile(sm_time, 0.5), percentile(sm_time, 0.9),
        percentile(sm_time, 1.0));
    double corr = 0;
    int pairs = 0;
    for (size_t a = 0; a + 1 < per_sm_runs.size(); ++a, ++pairs)
      corr += rank_correlation(per_sm_runs[a], per_sm_runs[a + 1]);
    std::printf(
        "  the same SMs slow in every repeat? rank correlation of consecutive repeats: %.2f (1: always the same "
        "order)\n",
        pairs ? corr / pairs : 0.0);
    std::printf("  SM ids 0..%d by speed decile (0: fastest):\n  ", sms - 1);
    std::vector<double> sorted = sm_time;
    std::sort(sorted.begin(), sorted.end());
    for (int s = 0; s < sms; ++s) {
      const int decile = int(std::lower_bound(sorted.begin(), sorted.end(), sm_time[s]) - sorted.begin()) * 10 / sms;
      std::printf("%d%s", decile, (s + 1) % 44 == 0 ? "\n  " : (s + 1) % 4 == 0 ? " " : "");
    }
    std::printf("\n");
  }
  return 0;
}
