// Device copies of the i-quant grid and sign tables (quant/iq_grids.h says what each holds; the values come from the
// generated quant/iq_grids.inc, the host tables' source too). Internal linkage: every translation unit that decodes
// an i-quant holds its own copy (33 KB), read through the L1 like any global data (a warp's lanes index different
// entries: constant memory would serialize them).
#pragma once

#include <cstdint>

#include "quant/iq_grids.inc"

namespace kiln::cuda {

static __device__ const uint64_t kDevIq2xxsGrid[256] = {KILN_IQ2XXS_GRID};
static __device__ const uint64_t kDevIq2xsGrid[512] = {KILN_IQ2XS_GRID};
static __device__ const uint64_t kDevIq2sGrid[1024] = {KILN_IQ2S_GRID};
static __device__ const uint32_t kDevIq3xxsGrid[256] = {KILN_IQ3XXS_GRID};
static __device__ const uint32_t kDevIq3sGrid[512] = {KILN_IQ3S_GRID};
static __device__ const uint64_t kDevIq1sGrid[2048] = {KILN_IQ1S_GRID};
static __device__ const uint8_t kDevIqSigns[128] = {KILN_IQ_SIGNS};

}  // namespace kiln::cuda
