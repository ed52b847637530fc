#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"

namespace kiln::cuda {

namespace {

Status query(int i, DeviceInfo* d) {
  cudaDeviceProp p{};
  KILN_CUDA_TRY(cudaGetDeviceProperties(&p, i));
  d->index = i;
  d->name = p.name;
  d->cc_major = p.major;
  d->cc_minor = p.minor;
  d->sm_count = p.multiProcessorCount;
  d->total_mem = p.totalGlobalMem;
  d->smem_per_block_optin = p.sharedMemPerBlockOptin;
  KILN_CUDA_TRY(cudaSetDevice(i));
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  d->free_mem = free_b;
  return Status::ok();
}

}  // namespace

bool pdl_enabled() {
  constexpr int kMaxDev = 64;
  static std::atomic<int> cache[kMaxDev];  // 0 unknown, 1 off, 2 on
  static const bool env_off = [] {
    const char* e = std::getenv("KILN_CUDA_PDL");
    return e && std::strcmp(e, "0") == 0;
  }();
  if (env_off) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return false;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 ? 2 : 1;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

Result<std::vector<DeviceInfo>> list_devices() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return std::vector<DeviceInfo>{};
  if (e != cudaSuccess)
    return make_error(ErrorCode::kInternal, "cudaGetDeviceCount failed: %s", cudaGetErrorString(e));
  std::vector<DeviceInfo> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) KILN_TRY(query(i, &out[static_cast<size_t>(i)]));
  return out;
}

}  // namespace kiln::cuda
