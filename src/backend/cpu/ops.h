// CPU vector kernels used by the backend ops, in a table chosen once from the CPU's features (runtime dispatch):
// scalar (ops.cpp), AVX2+FMA+F16C (ops_avx2.cpp), AVX-512 (ops_avx512.cpp). KILN_CPU_SIMD=scalar|avx2 in the
// environment caps the level (tests and A/B measurements), as for the matmul.
//
// Numerics: every variant computes the same formula; results differ only by f32 summation order (dots) and by
// the exp approximation (<= 2 ulp vs expf, see exp_approx in ops_avx512.cpp). f16 conversions are exact
// (widening) or round-to-nearest-even (narrowing) in every variant, bit-identical to util/fp16.h.
#pragma once

#include <cstdint>

namespace kiln::cpu {

struct VecKernels {
  const char* level;
  float (*dot_f16)(const uint16_t* k, const float* q, int64_t n);  // sum_i f16(k[i]) * q[i]
  float (*dot_f32)(const float* k, const float* q, int64_t n);
  void (*axpy_f16)(float* y, const uint16_t* x, float a, int64_t n);  // y += a * x
  void (*axpy_f32)(float* y, const float* x, float a, int64_t n);
  void (*scale_f32)(float* y, float s, int64_t n);                     // y *= s
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*swiglu)(const float* g, const float* u, float* y, int64_t n);  // y = g / (1 + exp(-g)) * u
  double (*sum_sq)(const float* x, int64_t n);                          // sum (double)(x[i] * x[i])
};

// The softmax op's row (Backend::softmax; also the MoE router's): max-subtracted exp in f32, the sum in double, one
// f32 reciprocal multiplied in. y may be x.
void softmax_row(const float* x, float* y, int64_t n);

const VecKernels& vec_kernels();       // best allowed for this CPU
const VecKernels& vec_kernels_scalar();
const VecKernels* vec_kernels_avx2();   // nullptr when not compiled in
const VecKernels* vec_kernels_avx512();

}  // namespace kiln::cpu
