// AVX2 + FMA + F16C vector kernels: 8 lanes, scalar tails. Same formulas as ops.cpp; exp_approx is the polynomial
// of ops_avx512.cpp (see there).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd256.h"
#include "util/fp16.h"

namespace kiln::cpu {
namespace {

inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 exp_approx(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

float dot_f16(const uint16_t* k, const float* q, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_f16(k + i), _mm256_loadu_ps(q + i), acc0);
    acc1 = _mm256_fmadd_ps(load_f16(k + i + 8), _mm256_loadu_ps(q + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f16(k + i), _mm256_loadu_ps(q + i), acc0);
  float s = hsum256(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += fp16_to_f32(k[i]) * q[i];
  return s;
}

float dot_f32(const float* k, const float* q, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), _mm256_loadu_ps(q + i), acc);
  float s = hsum256(acc);
  for (; i < n; ++i) s += k[i] * q[i];
  return s;
}

void axpy_f16(float* y, const uint16_t* x, float a, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * fp16_to_f32(x[i]);
}

void axpy_f32(float* y, const float* x, float a, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void scale_f32(float* y, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(vs, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= s;
}

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = f32_to_fp16(x[i]);
}

void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16(x + i));
  for (; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}

void swiglu(const float* g, const float* u, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vg = _mm256_loadu_ps(g + i);
    const __m256 e = exp_approx(_mm256_sub_ps(_mm256_setzero_ps(), vg));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(vg, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  if (i < n) {  // tail through the same polynomial, so every element gets identical numerics
    alignas(32) float tg[8] = {0}, tu[8] = {0}, ty[8];
    for (int64_t j = i; j < n; ++j) tg[j - i] = g[j], tu[j - i] = u[j];
    const __m256 vg = _mm256_load_ps(tg);
    const __m256 e = exp_approx(_mm256_sub_ps(_mm256_setzero_ps(), vg));
    _mm256_store_ps(ty, _mm256_mul_ps(_mm256_div_ps(vg, _mm256_add_ps(one, e)), _mm256_load_ps(tu)));
    for (int64_t j = i; j < n; ++j) y[j] = ty[j - i];
  }
}

double sum_sq(const float* x, int64_t n) {
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(v, v)));
  }
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  for (; i < n; ++i) r += static_cast<double>(x[i] * x[i]);
  return r;
}

const VecKernels kAvx2 = {"avx2", dot_f16, dot_f32, axpy_f16, axpy_f32, scale_f32,
                          f32_to_f16, f16_to_f32, swiglu, sum_sq};

}  // namespace

const VecKernels* vec_kernels_avx2() { return &kAvx2; }

}  // namespace kiln::cpu
