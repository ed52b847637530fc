// CUDA device discovery. The CUDA backend (kernels per op family) builds on this in the next issue; for now kiln
// reports what it finds (`kiln devices`).
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace kiln::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  size_t total_mem = 0, free_mem = 0;
  size_t smem_per_block_optin = 0;
};

Result<std::vector<DeviceInfo>> list_devices();

}  // namespace kiln::cuda
