// The NCCL Communicator (backend/comm.h) for CUDA backends, one rank per backend and one GPU per rank (NCCL
// refuses two ranks on one device). Built when CMake finds nccl.h (the CUDA toolkit, or NCCL_ROOT: KILN_HAVE_NCCL);
// libnccl.so.2 is loaded at run time. Without either, make_nccl_group says that tensor parallelism needs NCCL.
#pragma once

#include <memory>
#include <vector>

#include "backend/comm.h"

namespace kiln::cuda {

// ncclCommInitAll over the backends' devices (rank i = backends[i], each a CUDA backend: others are an error);
// collectives run on each backend's stream.
// Sets NCCL_NVLS_ENABLE=0 (NVLink multicast off) unless the environment already sets it.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& backends);
// Whether libnccl.so.2 loads here (false in a build without nccl.h).
bool nccl_available();

}  // namespace kiln::cuda
