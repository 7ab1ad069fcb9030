// The host's parallel loops (checkpoint loading, the kernel layout, the float64 reference, the
// synthetic generator): threads started together, the caller's among them, and a thread the
// system refuses reported as an error instead of ending the process.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "k3moe/error.h"

namespace k3moe {

// Starts `count` threads running `work` into `pool`. When the system refuses one, calls `stop`
// (after which every `work` returns), joins those started and throws k3moe::Error naming `what`:
// a joinable std::thread destroyed by the unwinding would end the process.
template <class Work, class Stop>
void start_threads(std::vector<std::thread>& pool, int count, const char* what, Work work, Stop stop) {
  try {
    for (int t = 0; t < count; ++t) pool.emplace_back(work);
  } catch (const std::system_error& e) {
    const size_t started = pool.size();
    stop();
    for (std::thread& t : pool) t.join();
    pool.clear();
    K3MOE_FAIL(what, ": the system refused worker thread ", started + 1, " of ", count, " (", e.what(), ")");
  }
}

// Runs fn(i) for every i in [0, n) on `threads` threads, the caller's included, in any order. A
// failure stops handing out items; once every thread has returned, the failure of the lowest item
// is rethrown (the one a serial loop meets first, among those run).
template <class Fn>
void parallel_for(int64_t n, int threads, const char* what, Fn&& fn) {
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  int64_t failed_item = n;
  std::exception_ptr failure;
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (i < failed_item) {
          failed_item = i;
          failure = std::current_exception();
        }
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  start_threads(pool, int(std::clamp<int64_t>(n, 1, std::max(threads, 1))) - 1, what, work, [&] { next = n; });
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace k3moe
