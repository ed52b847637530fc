// The CUDA backend's registry entry (backend/registry.h): lists the GPUs; create() builds a CudaBackend
// (cuda_backend.h).
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

}  // namespace

extern const BackendFactory kCudaBackendFactory = {"cuda", devices, create};

}  // namespace kiln::cuda
