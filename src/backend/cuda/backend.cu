// The CUDA backend's registry entry (backend/registry.h): lists the GPUs; create() builds a CudaBackend
// (cuda_backend.h); make_group() the NCCL communicators (comm_nccl.h). The entry registers itself at start-up:
// the generic backend library does not link this one (src/CMakeLists.txt links it whole into kiln_backends).
#include <cstdio>

#include "backend/cuda/comm_nccl.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/registry.h"

namespace kiln::cuda {
namespace {

Result<std::vector<kiln::DeviceInfo>> devices() {
  KILN_ASSIGN_OR_RETURN(std::vector<DeviceInfo> ds, list_devices());
  std::vector<kiln::DeviceInfo> out;
  for (const DeviceInfo& d : ds) {
    kiln::DeviceInfo x;
    x.id = "cuda:" + std::to_string(d.index);
    x.description = d.name + ", sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ", " +
                    std::to_string(d.sm_count) + " SMs";
    x.memory_total = d.total_mem;
    x.memory_free = d.free_mem;
    out.push_back(std::move(x));
  }
  return out;
}

Result<std::unique_ptr<Backend>> create(int index, const BackendOptions&) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::create(index));
  return std::unique_ptr<Backend>(std::move(b));
}

// One line per GPU: index, name, compute capability, SMs, memory, shared memory per block.
Result<std::string> report() {
  KILN_ASSIGN_OR_RETURN(std::vector<DeviceInfo> ds, list_devices());
  if (ds.empty()) return std::string("cuda: no device found (kiln runs on the CPU)\n");
  std::string out;
  for (const DeviceInfo& d : ds) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "cuda: %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free), %zu KiB shared memory per block\n",
                  d.index, d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count, d.total_mem / 1073741824.0,
                  d.free_mem / 1073741824.0, static_cast<size_t>(d.smem_per_block_optin / 1024));
    out += buf;
  }
  return out;
}

}  // namespace

extern const BackendFactory kCudaBackendFactory = {"cuda", devices, create, make_nccl_group, report};
const BackendRegistration kRegisterCuda(&kCudaBackendFactory);

}  // namespace kiln::cuda
