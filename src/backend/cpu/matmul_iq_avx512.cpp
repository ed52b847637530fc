// The i-quant grid kernels (matmul_iq_kern.h) compiled for AVX-512 (BW/VL).
#include "backend/cpu/matmul_iq_kern.h"

namespace kiln::cpu::detail {

void gemm_iq_grid_avx512(const GemmJob& j, int64_t o0, int64_t o1) { gemm_iq_grid(j, o0, o1); }

}  // namespace kiln::cpu::detail
