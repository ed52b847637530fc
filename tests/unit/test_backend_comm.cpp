// The collectives of tensor parallelism (backend/comm.h): the in-process group on CPU backends (each rank its own
// backend and thread), exact against the sum in rank order (the group sums each element in rank order, so the f32
// result is the same bits); operands that differ between ranks fail on every rank instead of hanging; the NCCL group
// on one GPU where this build has NCCL and the machine a GPU (skipped otherwise: the several-GPU runs of issue 17
// need a machine with several GPUs).
#include <gtest/gtest.h>

#include <thread>

#include "backend/comm.h"
#include "common/backend_test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/comm_nccl.h"
#endif

namespace kiln {
namespace {

using test::dev_f32;
using test::dev_read;
using test::DevTensor;
using test::randn;

// Runs f(rank) on one thread per rank and joins them.
template <class F>
void on_ranks(int n, F f) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&f, r] { f(r); });
  for (auto& t : th) t.join();
}

TEST(CommLocal, AllReduceSumAndAllGatherAreExact) {
  for (int n : {1, 2, 3, 4}) {
    auto g = make_local_group(n);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<std::unique_ptr<Backend>> be;
    for (int r = 0; r < n; ++r) {
      auto b = create_backend("cpu", BackendOptions{});
      ASSERT_TRUE(b.is_ok());
      be.push_back(std::move(b).value());
    }
    const int64_t d = 1000 + n;  // not a multiple of the rank count: uneven slices
    std::vector<std::vector<float>> x(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) x[static_cast<size_t>(r)] = randn(static_cast<size_t>(d), 40 + r);
    std::vector<float> want(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      float a = x[0][static_cast<size_t>(i)];
      for (int r = 1; r < n; ++r) a += x[static_cast<size_t>(r)][static_cast<size_t>(i)];
      want[static_cast<size_t>(i)] = a;
    }
    std::vector<std::vector<float>> got(static_cast<size_t>(n)), gathered(static_cast<size_t>(n));
    std::vector<Status> st(static_cast<size_t>(n));
    on_ranks(n, [&](int r) {
      Backend& b = *be[static_cast<size_t>(r)];
      const DevTensor t = dev_f32(b, x[static_cast<size_t>(r)], d);
      const DevTensor all = dev_f32(b, std::vector<float>(static_cast<size_t>(d * n), -1.0f), d, n);
      Communicator& c = *g.value()[static_cast<size_t>(r)];
      Status s = c.all_gather(t.t, all.t);
      if (s.is_ok()) s = c.all_reduce_sum(t.t);
      st[static_cast<size_t>(r)] = s;
      got[static_cast<size_t>(r)] = dev_read<float>(b, t);
      gathered[static_cast<size_t>(r)] = dev_read<float>(b, all);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[static_cast<size_t>(r)].is_ok()) << st[static_cast<size_t>(r)].to_string();
      EXPECT_EQ(g.value()[static_cast<size_t>(r)]->rank(), r);
      EXPECT_EQ(g.value()[static_cast<size_t>(r)]->size(), n);
      EXPECT_EQ(got[static_cast<size_t>(r)], want) << n << " ranks, rank " << r;
      for (int q = 0; q < n; ++q)
        EXPECT_TRUE(std::equal(x[static_cast<size_t>(q)].begin(), x[static_cast<size_t>(q)].end(),
                               gathered[static_cast<size_t>(r)].begin() + static_cast<int64_t>(q) * d))
            << "all_gather, rank " << r << ", slice " << q;
    }
  }
}

TEST(CommLocal, DifferentShapesFailOnEveryRankWithoutHanging) {
  auto g = make_local_group(2);
  ASSERT_TRUE(g.is_ok());
  auto b0 = create_backend("cpu", BackendOptions{}), b1 = create_backend("cpu", BackendOptions{});
  ASSERT_TRUE(b0.is_ok() && b1.is_ok());
  Backend* be[2] = {b0.value().get(), b1.value().get()};
  Status st[2];
  on_ranks(2, [&](int r) {
    const DevTensor t = dev_f32(*be[r], std::vector<float>(static_cast<size_t>(10 + 2 * r), 1.0f), 10 + 2 * r);
    st[r] = g.value()[static_cast<size_t>(r)]->all_reduce_sum(t.t);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].is_ok()) << "rank " << r;
    EXPECT_NE(st[r].to_string().find("all_reduce_sum"), std::string::npos) << st[r].to_string();
  }
  // The same group, same shapes now: works.
  on_ranks(2, [&](int r) {
    const DevTensor t = dev_f32(*be[r], std::vector<float>(8, static_cast<float>(r + 1)), 8);
    st[r] = g.value()[static_cast<size_t>(r)]->all_reduce_sum(t.t);
    if (st[r].is_ok()) {
      const std::vector<float> v = dev_read<float>(*be[r], t);
      for (float f : v) EXPECT_EQ(f, 3.0f);
    }
  });
  EXPECT_TRUE(st[0].is_ok() && st[1].is_ok()) << st[0].to_string() << " / " << st[1].to_string();
  EXPECT_FALSE(make_local_group(0).is_ok());
  EXPECT_FALSE(make_local_group(65).is_ok());
}

#ifdef KILN_HAVE_CUDA
TEST(CommNccl, RejectsBackendsThatAreNotCuda) {
  auto cpu = create_backend("cpu", BackendOptions{});
  ASSERT_TRUE(cpu.is_ok());
  auto g = cuda::make_nccl_group({cpu.value().get()});
  EXPECT_FALSE(g.is_ok());
}

TEST(CommNccl, OneRankOnOneGpu) {
  auto gpu = test::make_cuda0();
  if (!gpu) GTEST_SKIP() << "skipped: no CUDA device (cuda:0)";
  if (!cuda::nccl_available()) GTEST_SKIP() << "skipped: this build or machine has no NCCL";
  auto g = cuda::make_nccl_group({gpu.get()});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::vector<float> x = randn(777, 9);
  const DevTensor t = dev_f32(*gpu, x, 777), all = dev_f32(*gpu, std::vector<float>(777, 0.0f), 777);
  KILN_ASSERT_OK(g.value()[0]->all_reduce_sum(t.t));
  KILN_ASSERT_OK(g.value()[0]->all_gather(t.t, all.t));
  EXPECT_EQ(dev_read<float>(*gpu, t), x);
  EXPECT_EQ(dev_read<float>(*gpu, all), x);
}
#endif

}  // namespace
}  // namespace kiln
