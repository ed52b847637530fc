// make_nccl_group (cuda/comm_nccl.h): NCCL all-reduce (sum, f32, in place) and all-gather on each rank's stream.
// libnccl is opened at run time (dlopen "libnccl.so.2"), not linked: a kiln binary starts on machines without NCCL
// and says, when asked for a group, that tensor parallelism needs it. nccl.h is needed at build time
// (KILN_HAVE_NCCL); without it the entry returns kUnsupported naming what is missing.
#include "backend/cuda/comm_nccl.h"

#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

#ifdef KILN_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <mutex>
#endif

namespace kiln::cuda {

#ifdef KILN_HAVE_NCCL
namespace {

// The NCCL entry points, resolved from libnccl.so.2 once.
struct Nccl {
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  bool ok = false;
};

const Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    n.init_all = reinterpret_cast<decltype(n.init_all)>(dlsym(h, "ncclCommInitAll"));
    n.destroy = reinterpret_cast<decltype(n.destroy)>(dlsym(h, "ncclCommDestroy"));
    n.all_reduce = reinterpret_cast<decltype(n.all_reduce)>(dlsym(h, "ncclAllReduce"));
    n.all_gather = reinterpret_cast<decltype(n.all_gather)>(dlsym(h, "ncclAllGather"));
    n.error_string = reinterpret_cast<decltype(n.error_string)>(dlsym(h, "ncclGetErrorString"));
    n.ok = n.init_all && n.destroy && n.all_reduce && n.all_gather && n.error_string;
  });
  return n;
}

#define KILN_NCCL_TRY(call)                                                                                  \
  do {                                                                                                       \
    ncclResult_t kiln_nccl_r_ = (call);                                                                      \
    if (kiln_nccl_r_ != ncclSuccess)                                                                         \
      return make_error(ErrorCode::kInternal, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__,          \
                        nccl().error_string(kiln_nccl_r_));                                                   \
  } while (0)

Status device_f32(const char* op, const Tensor& x, const CudaBackend* be) {
  if (!x.valid() || x.dtype != DType::F32 || x.backend != be)
    return make_error(ErrorCode::kInvalidArgument, "%s: needs an F32 tensor of this rank's backend (%s)", op, be->name());
  if (x.nb[1] != static_cast<size_t>(x.ne[0]) * sizeof(float) || x.nb[2] != x.nb[1] * static_cast<size_t>(x.ne[1]) ||
      x.nb[3] != x.nb[2] * static_cast<size_t>(x.ne[2]))
    return make_error(ErrorCode::kInvalidArgument, "%s: tensor %s must be contiguous", op, x.shape_string().c_str());
  return Status::ok();
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t c, CudaBackend* be, int rank, int size) : c_(c), be_(be), rank_(rank), size_(size) {}
  ~NcclComm() override { nccl().destroy(c_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce_sum(const Tensor& x) override {
    KILN_TRY(device_f32("all_reduce_sum", x, be_));
    KILN_CUDA_TRY(cudaSetDevice(be_->device()));
    KILN_NCCL_TRY(nccl().all_reduce(x.data, x.data, static_cast<size_t>(x.n_elements()), ncclFloat, ncclSum, c_,
                                be_->stream()));
    return Status::ok();
  }
  Status all_gather(const Tensor& x, const Tensor& dst) override {
    KILN_TRY(device_f32("all_gather", x, be_));
    KILN_TRY(device_f32("all_gather", dst, be_));
    if (dst.n_elements() != x.n_elements() * size_)
      return make_error(ErrorCode::kInvalidArgument, "all_gather: dst %s must hold %d x %lld elements",
                        dst.shape_string().c_str(), size_, static_cast<long long>(x.n_elements()));
    KILN_CUDA_TRY(cudaSetDevice(be_->device()));
    KILN_NCCL_TRY(nccl().all_gather(x.data, dst.data, static_cast<size_t>(x.n_elements()), ncclFloat, c_, be_->stream()));
    return Status::ok();
  }

 private:
  ncclComm_t c_;
  CudaBackend* be_;
  int rank_, size_;
};

}  // namespace

bool nccl_available() { return nccl().ok; }

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  std::vector<CudaBackend*> backends;
  for (Backend* b : ranks) {
    auto* c = dynamic_cast<CudaBackend*>(b);
    if (!c) return make_error(ErrorCode::kInvalidArgument, "nccl: rank %zu's backend %s is not a CUDA backend",
                              backends.size(), b ? b->name() : "(null)");
    backends.push_back(c);
  }
  if (n < 1) return make_error(ErrorCode::kInvalidArgument, "nccl: no ranks");
  if (!nccl().ok)
    return make_error(ErrorCode::kUnsupported, "tensor parallelism needs NCCL: libnccl.so.2 could not be loaded (%s)",
                      dlerror() ? "dlopen failed" : "symbols missing");
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // keep NVLink multicast off unless the user set it
  std::vector<int> devs;
  for (CudaBackend* b : backends) devs.push_back(b->device());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  KILN_NCCL_TRY(nccl().init_all(comms.data(), n, devs.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclComm>(comms[static_cast<size_t>(r)], backends[r], r, n));
  return Result<std::vector<std::unique_ptr<Communicator>>>(std::move(out));  // nvcc: no implicit move here
}

#else

bool nccl_available() { return false; }

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>&) {
  return make_error(ErrorCode::kUnsupported, "tensor parallelism needs NCCL: this build found no nccl.h / libnccl "
                    "(set NCCL_ROOT to its install when configuring with -DKILN_CUDA=ON)");
}

#endif

}  // namespace kiln::cuda
