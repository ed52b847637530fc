// Integer tensor-core MMA wrappers shared by the prefill GEMM (mmq.cuh) and the batched decode GEMV
// (mmvq_mma.cuh). sm_80+ (mma.sync m16n8k32 / m16n8k16 s8); compiled for older architectures the bodies are empty
// and the hosts never launch their callers (mmq_usable, mmvq_mma_on).
// Fragments (PTX ISA, row.col, s8): g = lane / 4, c = lane % 4. A (16 x 32): a0 row g, k 4c..4c+3; a1 row g+8, the
// same k; a2 row g, k 16+4c..; a3 row g+8, k 16+4c.. (m16n8k16: a0, a1 only). B (32 x 8, k-contiguous per column):
// b0 column g, k 4c..; b1 column g, k 16+4c... C: c0 (row g, column 2c), c1 (g, 2c+1), c2 (g+8, 2c), c3 (g+8, 2c+1).
#pragma once

#include <cstdint>

namespace kiln::cuda {

// The int8 MMAs start from C = kMmqMagic: the exact int32 sum isum (|isum| <= 32 x 127 x 127 < 2^22) comes back as
// the bit pattern of the float 1.5 x 2^23 + isum, so float(isum) is one FADD (mmq_i2f) instead of an I2F (a
// quarter-rate conversion pipe: it was the kernel's bottleneck). Exact: the same value as static_cast<float>(isum).
constexpr int kMmqMagic = 0x4B400000;
__device__ __forceinline__ float mmq_i2f(int c) { return __int_as_float(c) - 12582912.0f; }
__device__ __forceinline__ void mma_s8_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};\n"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMmqMagic));
#endif
}
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0), "r"(kMmqMagic));
#endif
}

}  // namespace kiln::cuda
