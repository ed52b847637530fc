// Checked CUDA calls: every runtime call goes through KILN_CUDA_TRY, which turns a failure into a Status naming
// the call, the file and the line (no abort, no exit).
#pragma once

#include <cuda_runtime.h>

#include "util/status.h"

#define KILN_CUDA_TRY(call)                                                                             \
  do {                                                                                                  \
    cudaError_t kiln_cuda_err_ = (call);                                                                \
    if (kiln_cuda_err_ != cudaSuccess)                                                                  \
      return ::kiln::make_error(::kiln::ErrorCode::kInternal, "%s failed at %s:%d: %s (%s)", #call, __FILE__, \
                                __LINE__, cudaGetErrorString(kiln_cuda_err_), cudaGetErrorName(kiln_cuda_err_)); \
  } while (0)
