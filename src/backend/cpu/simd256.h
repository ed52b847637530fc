// 256-bit helpers shared by the x86 SIMD kernel files. Include only from files compiled with AVX2 (or above); the
// functions are static so that each file keeps its own copy, built with its own target flags (an inline function
// with external linkage could be merged with a copy from a file built for a wider instruction set).
#pragma once

#include <immintrin.h>

namespace kiln::cpu {

// The sum of v's 8 lanes in one fixed order (the two 128-bit halves, then pairs, then the last two): the kernels'
// outputs depend on it, bit for bit.
static inline float hsum256(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

}  // namespace kiln::cpu
