// AVX-512 activation quantizers for the fast path (layout in matmul_kernels.h). Byte-identical to
// quantize_act_row_scalar (quant/reference.h): the same f32 operations in the same order, only several elements at
// a time. Blocks holding inf/NaN, or whose scale would overflow f16 (Q8_0) or whose reciprocal is not finite
// (Q8_K), take the scalar reference path, which defines the saturating behaviour for them.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "util/fp16.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 in its own intrinsic headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kiln::cpu::detail {

namespace {

constexpr int kNonFinite = 0x99;  // fpclass: QNaN | SNaN | +inf | -inf

inline float hmax(__m512 v) {
  __m256 a = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// roundf (ties away from zero), exactly: truncate, then step away from zero where the dropped fraction is >= 0.5
// (v - trunc(v) is exact in f32).
inline __m512 round_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
  return _mm512_mask_add_ps(t, up, t, one);
}

void scalar_q8_0_block(const float* x, uint8_t* qs, float* dexp, bool bias) {
  block_q8_0 blk;
  (void)quantize_row(DType::Q8_0, x, &blk, QK8_0);
  for (int k = 0; k < QK8_0; ++k) qs[k] = static_cast<uint8_t>(blk.qs[k]) ^ (bias ? 0x80 : 0);
  for (int k = 0; k < 8; ++k) dexp[k] = fp16_to_f32(blk.d);
}

void quantize_q8_0(const ActLayout& l, const float* x, uint8_t* row) {
  float* dexp = reinterpret_cast<float*>(row + l.d_off);
  const int64_t nb = l.n_in / QK8_0;
  const __m512i bias = _mm512_set1_epi32(l.bias128 ? 0x80 : 0);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * QK8_0;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    if (_mm512_fpclass_ps_mask(v0, kNonFinite) | _mm512_fpclass_ps_mask(v1, kNonFinite)) {
      scalar_q8_0_block(xb, row + b * QK8_0, dexp + b * 8, l.bias128);
      continue;
    }
    const float amax = hmax(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const uint16_t dh = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    if ((dh & 0x7FFF) >= 0x7C00) {  // f16 overflow: the reference saturates
      scalar_q8_0_block(xb, row + b * QK8_0, dexp + b * 8, l.bias128);
      continue;
    }
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 lim = _mm512_set1_ps(127.0f);
    const __m512 r0 = _mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v0, _mm512_set1_ps(id))), -lim), lim);
    const __m512 r1 = _mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v1, _mm512_set1_ps(id))), -lim), lim);
    const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_xor_si512(_mm512_cvttps_epi32(r0), bias));
    const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_xor_si512(_mm512_cvttps_epi32(r1), bias));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + b * QK8_0), q0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + b * QK8_0 + 16), q1);
    _mm256_storeu_ps(dexp + b * 8, _mm256_set1_ps(_cvtsh_ss(dh)));
  }
  // Padding to n_pad: zero quants (biased: 0x80 would be a = 0 too, but the weights there are zero either way)
  // and zero scales, so a masked tail chunk adds nothing.
  std::memset(row + nb * QK8_0, 0, static_cast<size_t>(l.n_pad - nb * QK8_0));
  std::memset(dexp + nb * 8, 0, static_cast<size_t>(l.n_pad / 32 - nb) * 8 * sizeof(float));
}

void quantize_q8_K(const ActLayout& l, const float* x, uint8_t* row) {
  float* dd = reinterpret_cast<float*>(row + l.d_off);
  int16_t* bsums = reinterpret_cast<int16_t*>(row + l.bsum_off);
  const int64_t nb = l.n_in / QK_K;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * QK_K;
    int8_t* q = reinterpret_cast<int8_t*>(row + b * QK_K);
    __m512 amaxv = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int k = 0; k < 16; ++k) {
      const __m512 v = _mm512_loadu_ps(xb + 16 * k);
      bad |= _mm512_fpclass_ps_mask(v, kNonFinite);
      amaxv = _mm512_max_ps(amaxv, _mm512_abs_ps(v));
    }
    const float amax = hmax(amaxv);
    float iscale = 0.0f;
    float max = 0.0f;
    if (!bad && amax != 0.0f) {
      // The first element with |x| == amax carries the sign (the reference keeps the first on ties).
      const __m512 am = _mm512_set1_ps(amax);
      for (int k = 0; k < 16; ++k) {
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * k)), am, _CMP_EQ_OQ);
        if (m) {
          max = xb[16 * k + __builtin_ctz(m)];
          break;
        }
      }
      iscale = -127.f / max;
    }
    if (bad || amax == 0.0f || !std::isfinite(iscale)) {
      block_q8_K blk;
      (void)quantize_row(DType::Q8_K, xb, &blk, QK_K);
      std::memcpy(q, blk.qs, QK_K);
      dd[b] = blk.d;
      std::memcpy(bsums + b * 16, blk.bsums, sizeof(blk.bsums));
      continue;
    }
    const __m512 is = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; ++k) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + 16 * k), is);
      __m512i qi = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      qi = _mm512_min_epi32(qi, _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * k), _mm512_cvtepi32_epi8(qi));
      bsums[b * 16 + k] = static_cast<int16_t>(_mm512_reduce_add_epi32(qi));
    }
    dd[b] = 1.0f / iscale;
  }
  std::memset(row + nb * QK_K, 0, static_cast<size_t>(l.n_pad - nb * QK_K));
}

void round_floats(const ActLayout& l, const float* x, uint8_t* row) {
  float* o = reinterpret_cast<float*>(row);
  const int64_t n = l.n_in;
  for (int64_t i = 0; i < l.n_pad; i += 16) {
    const __mmask16 m = i + 16 <= n ? 0xFFFF : (i < n ? static_cast<__mmask16>((1u << (n - i)) - 1) : 0);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    if (l.wtype == DType::F16) {
      v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (l.wtype == DType::BF16) {
      // As util/fp16.h f32_to_bf16: round to nearest even on the bits; NaN -> quiet NaN.
      const __m512i u = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                    _mm512_set1_epi32(0x7f800000));
      r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
      v = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    }
    _mm512_store_ps(o + i, v);
  }
}

}  // namespace

void quantize_act_row_avx512(const ActLayout& l, const float* x, uint8_t* row) {
  switch (l.kind) {
    case ActKind::kFloat: return round_floats(l, x, row);
    case ActKind::kQ8Block32: return quantize_q8_0(l, x, row);
    case ActKind::kQ8K: return quantize_q8_K(l, x, row);
  }
}

}  // namespace kiln::cpu::detail
