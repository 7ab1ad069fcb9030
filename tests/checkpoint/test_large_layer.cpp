// The acceptance proof for the loader: a synthetic FULL-size Kimi-K3 layer (896 experts,
// H 3584, I 3072, ~15.7 GB over 9 shards) loads for EP32 rank 7 (experts 196..223) and reads
// only that rank's 28 experts: by the reader's count and by the page cache (mincore).
// Labelled "large" (name contains Large); set K3MOE_LARGE_DIR to choose the filesystem.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "k3moe/checkpoint.h"
#include "k3moe/synthetic.h"

namespace k3moe {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<fs::path> shard_paths(const fs::path& dir) {
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  return shards;
}

// Writes back and drops the file's cached pages, so that later residency is what was read.
bool evict(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// Bytes of the file in the page cache (mincore on a fresh mapping: it faults nothing in).
uint64_t resident_bytes(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const uint64_t size = fs::file_size(path);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  uint64_t resident = 0;
  if (mincore(map, size, vec.data()) == 0)
    for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  munmap(map, size);
  return std::min(resident, size);
}

// read_bytes of /proc/self/io: what this process made the storage layer read (-1: unavailable).
int64_t process_read_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "read_bytes:") return value;
  return -1;
}

ProgressFn print_every_tenth() {
  auto last = std::make_shared<int>(-1);
  return [last](std::string_view stage, int64_t done, int64_t total) {
    const int tenth = int(10 * done / std::max<int64_t>(total, 1));
    if (tenth == *last) return;
    *last = tenth;
    std::printf("    %.*s %lld / %lld\n", int(stage.size()), stage.data(), static_cast<long long>(done),
                static_cast<long long>(total));
    std::fflush(stdout);
  };
}

TEST(CheckpointLarge, FullSizeLayerEp32Rank7ReadsOnlyItsExperts) {
  const char* env = std::getenv("K3MOE_LARGE_DIR");
  const fs::path root = env ? fs::path(env) : fs::temp_directory_path();
  const uint64_t need = 20'000'000'000ull;
  const uint64_t free_bytes = fs::space(root).available;
  if (free_bytes < need)
    GTEST_SKIP() << "needs 20 GB free under " << root << " for a full-size K3 layer, has " << free_bytes / 1e9
                 << " GB (set K3MOE_LARGE_DIR to another filesystem)";

  const testing::TempDir temp("large", root);
  const fs::path& dir = temp.path();

  SyntheticSpec spec;
  spec.config = MoeConfig::kimi_k3();
  spec.seed = 2026;
  spec.layers = {1};
  spec.num_shards = 9;  // shard s holds experts [s*896/9, (s+1)*896/9): rank 7 straddles shards 2 and 3
  const MoeConfig& c = spec.config;
  const ExpertParallel ep{32, 7};
  const int64_t rank_expected = 28 * c.expert_bytes();
  const int64_t layer_bytes = int64_t(c.num_experts) * c.expert_bytes();

  std::printf("  writing a full-size K3 layer into %s\n", dir.c_str());
  auto t0 = std::chrono::steady_clock::now();
  write_synthetic_checkpoint(dir, spec, print_every_tenth());
  const double write_s = seconds_since(t0);
  const std::vector<fs::path> shards = shard_paths(dir);
  ASSERT_EQ(shards.size(), 9u);
  uint64_t on_disk = 0;
  for (const fs::path& s : shards) on_disk += fs::file_size(s);
  const double values = double(c.num_experts) * 3.0 * c.hidden * c.intermediate;
  std::printf("  wrote %zu shards, %.3f GB in %.1f s (%.2f GB/s; %.2f ns of wall time per weight)\n",
              shards.size(), on_disk / 1e9, write_s, on_disk / 1e9 / write_s, write_s * 1e9 / values);
  EXPECT_GE(on_disk, uint64_t(layer_bytes));

  // Drop the shards from the page cache, so that what is resident afterwards is what was read.
  t0 = std::chrono::steady_clock::now();
  bool evicted = true;
  for (const fs::path& s : shards) evicted &= evict(s);
  uint64_t resident_before = 0;
  for (const fs::path& s : shards) resident_before += resident_bytes(s);
  const bool os_check = evicted && resident_before < on_disk / 100;
  std::printf("  evicted the shards in %.1f s: %.1f MB still resident%s\n", seconds_since(t0), resident_before / 1e6,
              os_check ? "" : "  -> eviction is not effective on this filesystem: the page-cache check is skipped");

  const int64_t io_before = process_read_bytes();
  t0 = std::chrono::steady_clock::now();
  const Checkpoint ckpt = Checkpoint::open(dir);
  const RankExperts experts = ckpt.load_experts(1, ep);
  const double load_s = seconds_since(t0);
  const int64_t io_after = process_read_bytes();
  std::vector<uint64_t> resident_after;
  uint64_t resident_total = 0;
  for (const fs::path& s : shards) resident_total += resident_after.emplace_back(resident_bytes(s));

  EXPECT_EQ(experts.first_expert, 196);
  EXPECT_EQ(experts.num_local, 28);
  const int64_t rank_in_files = ckpt.rank_bytes(1, ep);
  std::printf("  loaded EP32 rank 7 (experts 196..223) in %.2f s (%.2f GB/s)\n", load_s,
              experts.bytes_read / 1e9 / load_s);
  std::printf("  rank bytes: expected 28 x %lld = %lld; in the file headers %lld; layer %lld (%.1f x the rank)\n",
              static_cast<long long>(c.expert_bytes()), static_cast<long long>(rank_expected),
              static_cast<long long>(rank_in_files), static_cast<long long>(layer_bytes),
              double(layer_bytes) / double(rank_expected));
  std::printf("  reader's count: %llu bytes copied (%.4f of the rank's bytes)\n",
              static_cast<unsigned long long>(experts.bytes_read), double(experts.bytes_read) / double(rank_expected));
  EXPECT_EQ(rank_in_files, rank_expected);
  EXPECT_EQ(int64_t(experts.bytes_read), rank_expected);

  std::printf("  page cache after the load: %.3f MB resident over all shards (%.4f of the rank's bytes)\n",
              resident_total / 1e6, double(resident_total) / double(rank_expected));
  for (size_t i = 0; i < shards.size(); ++i)
    std::printf("    %s  %10.3f MB resident\n", shards[i].filename().c_str(), resident_after[i] / 1e6);
  if (io_before >= 0 && io_after >= 0)
    std::printf("  /proc/self/io read_bytes during the load: %.3f MB (%.4f of the rank's bytes)\n",
                (io_after - io_before) / 1e6, double(io_after - io_before) / double(rank_expected));
  if (os_check) {
    const double fetched = double(resident_total) - double(resident_before);
    EXPECT_NEAR(fetched, double(rank_expected), 0.01 * double(rank_expected))
        << "the OS read " << fetched << " bytes of the shards for a rank of " << rank_expected;
    // Shards without any of the rank's experts stay untouched (not even their headers).
    for (size_t i = 0; i < shards.size(); ++i)
      if (i != 1 && i != 2) EXPECT_EQ(resident_after[i], 0u) << shards[i];
    // The kernel's own count of bytes read from storage: no readahead past the rank's ranges.
    if (io_before >= 0 && io_after >= 0)
      EXPECT_LE(double(io_after - io_before), 1.01 * double(rank_expected)) << "bytes read from storage";
  }

  t0 = std::chrono::steady_clock::now();
  const RankExperts expected = synthesize_experts(spec, 1, ep);
  std::printf("  synthesize_experts for the rank: %.1f s\n", seconds_since(t0));
  EXPECT_TRUE(experts.w13_packed == expected.w13_packed);
  EXPECT_TRUE(experts.w13_scale == expected.w13_scale);
  EXPECT_TRUE(experts.w2_packed == expected.w2_packed);
  EXPECT_TRUE(experts.w2_scale == expected.w2_scale);
}

}  // namespace
}  // namespace k3moe
