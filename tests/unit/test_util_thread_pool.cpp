// ThreadPool when the system refuses threads (issue 12: `-t 100000` aborted with std::system_error): the pool keeps
// the threads that started, runs every job on them, and says why -- in a child process whose address space is
// limited so that thread stacks (8 MiB each by default) soon cannot be mapped.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <numeric>
#include <vector>

#include "util/thread_pool.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_TEST_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KILN_TEST_SANITIZER 1
#endif
#endif

namespace kiln {
namespace {

// Sums 0..n-1 through parallel_for; true when every index was visited exactly once.
bool pool_covers(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  pool.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  for (auto& s : seen)
    if (s.load() != 1) return false;
  return true;
}

TEST(ThreadPool, RunsEveryChunk) {
  for (int n : {1, 2, 3, 8}) {
    ThreadPool pool(n);
    EXPECT_EQ(pool.size(), n);
    EXPECT_TRUE(pool.start_error().empty());
    EXPECT_TRUE(pool_covers(pool, 1000));
  }
}

TEST(ThreadPool, FewerThreadsWhenTheSystemRefusesThem) {
#ifdef KILN_TEST_SANITIZER
  GTEST_SKIP() << "skipped under a sanitizer: its runtime dies itself when a thread's memory cannot be mapped";
#endif
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The address space in use now plus 256 MiB: about 30 default 8 MiB stacks, far fewer than 10000.
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    struct rlimit rl {};
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (rlim_t{256} << 20);
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(10);
    int code = 0;
    {
      ThreadPool pool(10000);
      if (pool.size() < 1 || pool.size() >= 10000) code = 11;
      else if (pool.start_error().empty()) code = 12;
      else if (!pool_covers(pool, 100000)) code = 13;
      else if (!pool_covers(pool, 7)) code = 14;  // fewer items than threads
    }  // the destructor stops and joins the started workers
    _exit(code);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the child died of signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0)
                             << " (std::terminate on a failed thread start is SIGABRT)";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: setrlimit failed, 11: size, 12: no start_error, 13/14: a chunk missed";
}

}  // namespace
}  // namespace kiln
