// A fork-join pool for compute ops: run(fn) calls fn(thread_index, n_threads) on every thread (the caller is
// thread 0) and returns when all are done. Workers spin briefly between jobs, then sleep, so the many small ops
// of a decode step do not pay a futex round trip each.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Not reentrant: one run() at a time, from one thread.
  void run(const std::function<void(int ith, int nth)>& fn);

  // Splits [0, n) into n_threads contiguous chunks; fn(begin, end) per chunk.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// Parses -t: 0 or negative means "all cores".
int default_thread_count();

}  // namespace kiln
