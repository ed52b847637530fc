// Scalar vector kernels (the portable fallback and the spec of the SIMD variants) and the runtime dispatch.
#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "util/fp16.h"

namespace kiln::cpu {
namespace {

float dot_f16(const uint16_t* k, const float* q, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_f32(k[i]) * q[i];
  return s;
}
float dot_f32(const float* k, const float* q, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += k[i] * q[i];
  return s;
}
void axpy_f16(float* y, const uint16_t* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_f32(x[i]);
}
void axpy_f32(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void scale_f32(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}
void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_fp16(x[i]);
}
void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}
void swiglu(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
double sum_sq(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i] * x[i]);
  return s;
}

const VecKernels kScalar = {"scalar", dot_f16, dot_f32, axpy_f16, axpy_f32, scale_f32,
                            f32_to_f16, f16_to_f32, swiglu, sum_sq};

// The elementwise/attention kernels need AVX-512 F/BW/VL/DQ (no VNNI) or AVX2/FMA/F16C; KILN_CPU_SIMD caps both.
const VecKernels& pick() {
  const CpuFeatures& f = cpu_features();
  const SimdLevel cap = env_simd_cap();
  if (cap >= SimdLevel::kAvx512 && vec_kernels_avx512() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)
    return *vec_kernels_avx512();
  if (cap >= SimdLevel::kAvx2 && vec_kernels_avx2() && f.avx2 && f.fma && f.f16c) return *vec_kernels_avx2();
  return kScalar;
}

}  // namespace

const VecKernels& vec_kernels_scalar() { return kScalar; }

const VecKernels& vec_kernels() {
  static const VecKernels& k = pick();
  return k;
}

void softmax_row(const float* x, float* y, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - mx);
    sum += y[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

}  // namespace kiln::cpu
