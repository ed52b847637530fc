// A fork-join pool for compute ops: run(fn) calls fn(thread_index, n_threads) on every thread (the caller is
// thread 0) and returns when all are done. Waiting is tiered: spin with PAUSE for ~100 us (the back-to-back ops of
// a decode step never leave it), then yield the core a few times, then sleep on a futex. The generation counter
// and the pending count are 32-bit so std::atomic::wait/notify map to a plain futex (64-bit atomics go through
// libstdc++'s proxy pool, whose wake-ups were measured at milliseconds).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "util/function_ref.h"

namespace kiln {

class ThreadPool {
 public:
  // n_threads <= 0: hardware concurrency. When the system refuses a thread (a process or memory limit), the pool
  // keeps the ones that started and runs with them: size() says how many, start_error() why (and a warning goes
  // to stderr) -- it never throws or terminates for that.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Why fewer threads than asked for started ("" when all did).
  const std::string& start_error() const { return start_error_; }
  // Not reentrant: one run() at a time, from one thread.
  // fn is referenced, not copied (no allocation per call): it must outlive the call, which it does.
  void run(FunctionRef<void(int ith, int nth)> fn);

  // Splits [0, n) into n_threads contiguous chunks; fn(begin, end) per chunk.
  void parallel_for(int64_t n, FunctionRef<void(int64_t begin, int64_t end)> fn);

 private:
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  const FunctionRef<void(int, int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};  // bumped once per run(); wraps harmlessly
  std::atomic<int32_t> pending_{0};      // workers still inside the current job
  std::atomic<bool> stop_{false};
  std::string start_error_;
};

// Parses -t: 0 or negative means "all cores".
int default_thread_count();

}  // namespace kiln
