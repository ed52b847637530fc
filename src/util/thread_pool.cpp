#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() ((void)0)
#endif

namespace kiln {

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr int kYieldIters = 16;

// Spins (PAUSE) up to kSpinTime, then yields a few times; true as soon as done() holds. The yields let a peer
// that the OS descheduled finish its share when the cores are oversubscribed (parallel ctest, other processes).
template <class Pred>
bool spin_then_yield(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      KILN_PAUSE();
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  for (int i = 0; i < kYieldIters; ++i) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  // A thread that cannot start (std::system_error: EAGAIN from a process or memory limit) ends the start-up: the
  // pool runs with the threads it has (the workers read n_threads_ only after run() publishes a job), and says so.
  const int want = n_threads_;
  try {
    threads_.reserve(static_cast<size_t>(want - 1));
    for (int i = 1; i < want; ++i) threads_.emplace_back([this, i] { worker(i); });
  } catch (const std::exception& e) {
    n_threads_ = static_cast<int>(threads_.size()) + 1;
    start_error_ = e.what();
    std::fprintf(stderr, "kiln: warning: only %d of %d threads could be started (%s): running with %d\n",
                 n_threads_, want, e.what(), n_threads_);
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int ith) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      spin_then_yield([&] { return (g = generation_.load(std::memory_order_acquire)) != seen; });
      while (g == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        g = generation_.load(std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(ith, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  if (!spin_then_yield([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    for (int32_t p = pending_.load(std::memory_order_acquire); p != 0; p = pending_.load(std::memory_order_acquire))
      pending_.wait(p, std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  run([&](int ith, int nth) {
    const int64_t chunk = (n + nth - 1) / nth;
    const int64_t b = std::min<int64_t>(n, chunk * ith);
    const int64_t e = std::min<int64_t>(n, b + chunk);
    if (b < e) fn(b, e);
  });
}

}  // namespace kiln
