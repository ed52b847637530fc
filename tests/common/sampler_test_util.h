// Pieces of the sampler tests: a counter of heap allocations (this header replaces the global operator new: include
// it from one translation unit of a test binary only), every chain stage off, log-probabilities.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "runtime/sampler.h"

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // malloc/free behind a replaced new/delete

// Counts heap allocations while g_count_allocs is set.
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};
void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// Every form that a replaced delete frees (the nothrow new of std::stable_sort's buffer included), so no allocation
// comes from another allocator than the one that frees it.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace kiln::test {

// Every chain stage off at temperature temp: a test switches on the one it checks.
inline SamplerParams plain_sampler(float temp, uint64_t seed) {
  SamplerParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

inline std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

}  // namespace kiln::test
