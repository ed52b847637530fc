// AVX2 (+FMA, F16C) matmul kernels: placeholder table until the kernels land (every type takes the threaded
// scalar path).
#include "backend/cpu/matmul_kernels.h"

namespace kiln::cpu::detail {
namespace {
bool has(DType) { return false; }
void gemm(const GemmJob&, int64_t, int64_t) {}
const FastKernels kKernels = {"avx2", false, has, quantize_act_row_scalar, gemm};
}  // namespace
const FastKernels* fast_kernels_avx2() { return &kKernels; }
}  // namespace kiln::cpu::detail
