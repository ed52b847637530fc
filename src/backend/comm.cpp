// make_local_group: the in-process Communicator (backend/comm.h). Ranks meet at a generation-counted barrier;
// all_reduce_sum is a reduce-scatter (rank r sums slice r of every rank's x into the shared result) then an
// all-gather (every rank copies the result back), so each element is summed once, in rank order 0..n-1 (the same
// order as NCCL's ring for two ranks; for more ranks the order differs from NCCL's by f32 rounding only).
#include "backend/comm.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

namespace kiln {
namespace {

struct Shared {
  explicit Shared(int n) : n(n), ptr(static_cast<size_t>(n)), count(static_cast<size_t>(n)) {}
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<float*> ptr;       // each rank's x for the current call
  std::vector<int64_t> count;    // each rank's element count for the current call
  std::vector<float> sum;        // the reduced result

  void barrier() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t g = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return generation != g; });
    }
  }
};

Status host_f32(const char* op, const Tensor& x) {
  if (!x.valid() || x.dtype != DType::F32 || !x.backend || !x.backend->host_memory())
    return make_error(ErrorCode::kInvalidArgument, "%s: the local communicator needs F32 tensors in host memory", op);
  if (x.nb[1] != static_cast<size_t>(x.ne[0]) * sizeof(float) || x.nb[2] != x.nb[1] * static_cast<size_t>(x.ne[1]) ||
      x.nb[3] != x.nb[2] * static_cast<size_t>(x.ne[2]))
    return make_error(ErrorCode::kInvalidArgument, "%s: tensor %s must be contiguous", op, x.shape_string().c_str());
  return Status::ok();
}

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->n; }

  Status all_reduce_sum(const Tensor& x) override {
    Status st = host_f32("all_reduce_sum", x);
    const int64_t n = st.is_ok() ? x.n_elements() : -1;
    KILN_TRY(exchange(st.is_ok() ? static_cast<float*>(x.data) : nullptr, n, "all_reduce_sum", st));
    const int R = s_->n;
    if (rank_ == 0) s_->sum.resize(static_cast<size_t>(n));
    s_->barrier();
    const int64_t lo = n * rank_ / R, hi = n * (rank_ + 1) / R;
    for (int64_t i = lo; i < hi; ++i) {
      float a = s_->ptr[0][i];
      for (int r = 1; r < R; ++r) a += s_->ptr[static_cast<size_t>(r)][i];
      s_->sum[static_cast<size_t>(i)] = a;
    }
    s_->barrier();
    std::memcpy(x.data, s_->sum.data(), static_cast<size_t>(n) * sizeof(float));
    s_->barrier();  // nobody reuses sum / ptr before every rank has copied
    return Status::ok();
  }

  Status all_gather(const Tensor& x, const Tensor& dst) override {
    Status st = host_f32("all_gather", x);
    if (st.is_ok()) st = host_f32("all_gather", dst);
    const int64_t n = st.is_ok() ? x.n_elements() : -1;
    if (st.is_ok() && dst.n_elements() != n * s_->n)
      st = make_error(ErrorCode::kInvalidArgument, "all_gather: dst %s must hold %d x %lld elements",
                      dst.shape_string().c_str(), s_->n, static_cast<long long>(n));
    KILN_TRY(exchange(st.is_ok() ? static_cast<float*>(x.data) : nullptr, st.is_ok() ? n : -1, "all_gather", st));
    for (int r = 0; r < s_->n; ++r)
      std::memcpy(static_cast<float*>(dst.data) + static_cast<int64_t>(r) * n, s_->ptr[static_cast<size_t>(r)],
                  static_cast<size_t>(n) * sizeof(float));
    s_->barrier();
    return Status::ok();
  }

 private:
  // Publishes this rank's buffer and count, waits for all, and fails on every rank when any rank's operands were
  // bad or the counts differ (so no rank is left waiting at a later barrier).
  Status exchange(float* p, int64_t n, const char* op, const Status& mine) {
    s_->ptr[static_cast<size_t>(rank_)] = p;
    s_->count[static_cast<size_t>(rank_)] = n;
    s_->barrier();
    bool ok = true;
    for (int r = 0; r < s_->n; ++r) ok = ok && s_->count[static_cast<size_t>(r)] >= 0 && s_->count[static_cast<size_t>(r)] == n;
    s_->barrier();  // every rank has read the counts before any rank moves on
    if (ok) return Status::ok();
    if (!mine.is_ok()) return mine;
    return make_error(ErrorCode::kInvalidArgument, "%s: rank %d's operand differs from another rank's (or another "
                      "rank's operand is invalid)", op, rank_);
  }

  std::shared_ptr<Shared> s_;
  int rank_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_local_group(int n) {
  if (n < 1 || n > 64) return make_error(ErrorCode::kInvalidArgument, "local communicator: %d ranks (1..64)", n);
  auto s = std::make_shared<Shared>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<LocalComm>(s, r));
  return out;
}

}  // namespace kiln
