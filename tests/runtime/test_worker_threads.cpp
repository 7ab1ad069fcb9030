// runtime/worker_threads.h: every item runs once, and a failure comes back as the lowest failing
// item's error, not as std::terminate.
#include "runtime/worker_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace k3moe {
namespace {

TEST(WorkerThreads, RunsEveryItemOnce) {
  for (int threads : {0, 1, 3, 8, 64}) {
    constexpr int64_t kItems = 1000;
    std::vector<std::atomic<int>> runs(kItems);
    parallel_for(kItems, threads, "test", [&](int64_t i) { ++runs[size_t(i)]; });
    for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(runs[size_t(i)].load(), 1) << "item " << i << ", threads " << threads;
  }
}

TEST(WorkerThreads, NoItemsRunsNothing) {
  int calls = 0;
  parallel_for(0, 8, "test", [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(WorkerThreads, RethrowsTheLowestFailingItemAndStops) {
  // Items are handed out in increasing order, so item 300 is taken (and fails) before any later
  // one; items past the failures still in flight may fail too, but never below it.
  std::atomic<int64_t> ran{0};
  try {
    parallel_for(100000, 8, "test", [&](int64_t i) {
      ++ran;
      if (i >= 300) throw std::runtime_error("item " + std::to_string(i));
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 300");
  }
  EXPECT_LT(ran.load(), 100000) << "items kept being handed out after a failure";
}

}  // namespace
}  // namespace k3moe
