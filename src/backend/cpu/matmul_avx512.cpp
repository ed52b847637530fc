// AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels. Register-tiled: each kernel call computes R weight rows x C
// activation rows over the whole n_in, decoding each weight block once into registers and reusing it for the C
// activation rows (matmul_kernels.h drive_tiles does the cache blocking around it).
//
// Numerics (each agrees with matmul_ref.cpp up to f32 summation order):
//  - F32/F16/BF16: weights widened to f32 exactly, activations pre-rounded to the weight type (act layout kFloat);
//    products are exact for F16/BF16 and fused for F32; sums in 16 f32 lanes per (row, token), reduced at the end.
//  - Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4 x Q8_0: per block of 32 the weights are decoded to int8 w in [-128, 127] (the
//    codebook types by a vpshufb lookup of their nibbles; MXFP4 as doubled FP4 values with half its scale) and the activation is
//    stored biased, u = a + 128 in uint8, so vpdpbusd(u, w) = sum a*w + 128 sum w; each 4-element lane starts
//    from -128 * (its sum of w) (computed once per weight block), giving the exact int32 sum a*w per lane. Each
//    lane is converted to f32 and fused-multiply-added with d_w * d_a of its block.
//  - Q4_K/Q5_K/Q6_K x Q8_K: weights decoded to uint8 q (Q6_K: q in [0, 63], the -32 folded in below), vpmaddubsw
//    gives int16 pair sums of q*a (max 2*63*127, no saturation), vpdpwssd multiplies them by the sub-block scale and
//    accumulates in int32: the super-block's integer sum is exact. Q6_K adds -32 * sum_g sc_g * bsums_g (exact);
//    Q4_K/Q5_K keep the mins term sum_j m_j * bsums separately as llama.cpp's formula does. Per super-block:
//    acc += (d_w * d_a) * isum - (dmin_w * d_a) * summs in f32 lanes.
//  - IQ4_XS x Q8_K: w = codebook value (int8, |w| <= 127, signed, so no vpmaddubsw on w directly) and Q8_K's
//    |a| <= 127: vpmaddubsw(|w|, a negated where w < 0) pair sums stay below 2*127*127 < 2^15, vpdpwssd with the
//    sub-block's signed scale ls - 32 accumulates the super-block's exact int32 sum; acc += (d_w * d_a) * isum.
//  - TQ1_0/TQ2_0 x Q8_K: w = c - 1 with the code c in [0, 3] decoded to uint8; vpdpbusd(c, a) sums c*a exactly in
//    int32 and the super-block's sum of a (from the bsums) is subtracted once: isum = sum (c - 1) a, exact;
//    acc += (d_w * d_a) * isum.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

// GCC 12's own intrinsic headers (_mm512_extractf64x4_pd, _mm512_cvtph_ps) pass _mm256_undefined_*() values and
// then warn about them being uninitialized (GCC bug 105593); nothing in this file reads an undefined lane.
#if defined(__GNUC__) && !defined(__clang__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/simd256.h"
#include "quant/blocks.h"

namespace kiln::cpu::detail {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// Same summation order as before: the two 256-bit halves first, then hsum256's tree.
inline float hsum(__m512 v) { return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))); }

inline void store_tile_sums(const GemmJob& j, int64_t o, int64_t t, int r, int c, __m512 v) {
  j.y[(t + c) * j.y_stride + o + r] = hsum(v);
}

// ---- F32 / F16 / BF16 weights --------------------------------------------------------------------------------

template <DType WT>
inline __m512 load_w16(const uint8_t* row, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (WT == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  } else {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
}

template <DType WT>
inline __m512 load_w16_masked(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (WT == DType::F32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (WT == DType::F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  } else {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
}

template <DType WT>
struct FloatKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const uint8_t* w[R];
    const float* x[C];
    for (int r = 0; r < R; ++r) w[r] = j.w + (o + r) * j.w_row_bytes;
    for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const float*>(j.act + (t + c) * j.layout.row_bytes);
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t n = j.n_in;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m512 xv[C];
      for (int c = 0; c < C; ++c) xv[c] = _mm512_load_ps(x[c] + i);
      for (int r = 0; r < R; ++r) {
        if (WT == DType::F32 || i % 32 == 0) prefetch_weights(w[r] + i * (WT == DType::F32 ? 4 : 2), 1);  // per 64 B
        const __m512 wv = load_w16<WT>(w[r], i);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
      }
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      for (int r = 0; r < R; ++r) {
        const __m512 wv = load_w16_masked<WT>(w[r], i, m);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, _mm512_load_ps(x[c] + i), acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_tile_sums(j, o, t, r, c, acc[r][c]);
  }
};

// ---- Q4_0 / Q5_0 / Q8_0 weights x Q8_0 activations (biased uint8) --------------------------------------------

template <DType WT>
inline constexpr int64_t kB32Bytes = WT == DType::Q8_0 ? sizeof(block_q8_0)
                                     : WT == DType::Q4_0 ? sizeof(block_q4_0)
                                     : WT == DType::Q5_0 ? sizeof(block_q5_0)
                                     : WT == DType::IQ4_NL ? sizeof(block_iq4_nl) : sizeof(block_mxfp4);

// Blocks b (and b+1 when `two`) of a codebook type (IQ4_NL: f16 scale, MXFP4: E8M0 exponent; 16 nibble bytes
// after it) as 64 int8 codebook values (zero for a missing second block) and their scales in 16 f32 lanes.
template <DType WT>
inline __m512i decode_book32(const uint8_t* row, int64_t b, bool two, __m512* dw) {
  using Block = std::conditional_t<WT == DType::IQ4_NL, block_iq4_nl, block_mxfp4>;
  const Block* x = reinterpret_cast<const Block*>(row) + b;
  auto scale = [](const Block& blk) {
    if constexpr (WT == DType::IQ4_NL) return h2f(blk.d);
    else return e8m0_half_to_f32(blk.e);
  };
  const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(WT == DType::IQ4_NL ? kIq4nlValues : kMxfp4Values)));
  const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[0].qs));
  __m512i v = _mm512_inserti32x4(_mm512_castsi128_si512(q0), _mm_srli_epi16(q0, 4), 1);
  float d1 = 0.0f;
  if (two) {
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[1].qs));
    v = _mm512_inserti32x4(_mm512_inserti32x4(v, q1, 2), _mm_srli_epi16(q1, 4), 3);
    d1 = scale(x[1]);
  }
  *dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(scale(x[0]))), _mm256_set1_ps(d1), 1);
  return _mm512_maskz_shuffle_epi8(two ? ~0ull : 0xFFFFFFFFull, book, _mm512_and_si512(v, _mm512_set1_epi8(0x0F)));
}

// Decodes blocks b (and b+1 when `two`) of a weight row into 64 int8 (elements in order; zero for a missing second
// block) and their scales into 16 f32 lanes (8 per block).
template <DType WT>
inline __m512i decode_b32(const uint8_t* row, int64_t b, bool two, __m512* dw) {
  if constexpr (WT == DType::IQ4_NL || WT == DType::MXFP4) {
    return decode_book32<WT>(row, b, two, dw);
  } else if constexpr (WT == DType::Q8_0) {
    const block_q8_0* x = reinterpret_cast<const block_q8_0*>(row) + b;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[0].qs));
    const float d0 = h2f(x[0].d);
    if (two) {
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[1].qs));
      *dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(h2f(x[1].d)), 1);
      return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    *dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_setzero_ps(), 1);
    return _mm512_zextsi256_si512(lo);
  } else if constexpr (WT == DType::Q4_0) {
    const block_q4_0* x = reinterpret_cast<const block_q4_0*>(row) + b;
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[0].qs));
    const float d0 = h2f(x[0].d);
    __m128i q1 = _mm_setzero_si128();
    float d1 = 0.0f;
    __m512i v = _mm512_castsi128_si512(q0);
    v = _mm512_inserti32x4(v, _mm_srli_epi16(q0, 4), 1);
    if (two) {
      q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[1].qs));
      d1 = h2f(x[1].d);
      v = _mm512_inserti32x4(v, q1, 2);
      v = _mm512_inserti32x4(v, _mm_srli_epi16(q1, 4), 3);
      v = _mm512_sub_epi8(_mm512_and_si512(v, _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(8));
    } else {
      v = _mm512_inserti64x4(v, _mm256_setzero_si256(), 1);
      v = _mm512_maskz_sub_epi8(0xFFFFFFFFull, _mm512_and_si512(v, _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(8));
    }
    *dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
    return v;
  } else {  // Q5_0
    const block_q5_0* x = reinterpret_cast<const block_q5_0*>(row) + b;
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[0].qs));
    uint32_t h0, h1 = 0;
    std::memcpy(&h0, x[0].qh, 4);
    const float d0 = h2f(x[0].d);
    float d1 = 0.0f;
    __m512i v = _mm512_castsi128_si512(q0);
    v = _mm512_inserti32x4(v, _mm_srli_epi16(q0, 4), 1);
    __mmask64 live = 0xFFFFFFFFull;
    if (two) {
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[1].qs));
      std::memcpy(&h1, x[1].qh, 4);
      d1 = h2f(x[1].d);
      v = _mm512_inserti32x4(v, q1, 2);
      v = _mm512_inserti32x4(v, _mm_srli_epi16(q1, 4), 3);
      live = ~0ull;
    }
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
    const __mmask64 hb = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
    v = _mm512_mask_add_epi8(v, hb, v, _mm512_set1_epi8(16));
    v = _mm512_maskz_sub_epi8(live, v, _mm512_set1_epi8(16));
    *dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
    return v;
  }
}

template <DType WT>
struct Block32Kern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const uint8_t* w[R];
    const uint8_t* xq[C];
    const float* xd[C];
    for (int r = 0; r < R; ++r) w[r] = j.w + (o + r) * j.w_row_bytes;
    for (int c = 0; c < C; ++c) {
      xq[c] = j.act + (t + c) * j.layout.row_bytes;
      xd[c] = reinterpret_cast<const float*>(xq[c] + j.layout.d_off);
    }
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = j.n_in / 32;
    const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < nb; b += 2) {
      const bool two = b + 1 < nb;
      __m512i wq[R], init[R];
      __m512 dw[R];
      for (int r = 0; r < R; ++r) {
        prefetch_weights(w[r] + b * kB32Bytes<WT>, (2 * kB32Bytes<WT> + 63) / 64);  // two blocks per step
        wq[r] = decode_b32<WT>(w[r], b, two, &dw[r]);
        init[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, wq[r]));
      }
      for (int c = 0; c < C; ++c) {
        const __m512i xv = _mm512_load_si512(xq[c] + b * 32);
        const __m512 dx = _mm512_load_ps(xd[c] + b * 8);
        for (int r = 0; r < R; ++r) {
          const __m512i s = _mm512_dpbusd_epi32(init[r], xv, wq[r]);
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_tile_sums(j, o, t, r, c, acc[r][c]);
  }
};

// ---- Q4_K / Q5_K / Q6_K weights x Q8_K activations ---------------------------------------------------------

// int16 lane selectors: chunk k of a Q4_K/Q5_K super-block covers sub-blocks 2k (int16 lanes 0..15) and 2k+1
// (lanes 16..31); of a Q6_K super-block, scale groups 4k..4k+3 (8 int16 lanes each).
inline __m512i k4_scale_idx(int k) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<short>(2 * k)),
                                 _mm512_set1_epi16(static_cast<short>(2 * k + 1)));
}
inline __m512i q6_scale_idx(int k) {
  return _mm512_set_epi16(4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3,
                          4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2,
                          4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1,
                          4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k);
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block, one byte each.
inline void unpack_k4_scales(const uint8_t* s, uint64_t* sc, uint64_t* mn) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu;
  const uint32_t mn_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  *sc = sc_lo | (static_cast<uint64_t>(sc_hi) << 32);
  *mn = mn_lo | (static_cast<uint64_t>(mn_hi) << 32);
}

// Per weight row and super-block: the decoded state a K-quant kernel needs.
struct KRow {
  __m512i sc16;   // int16 scales (Q4_K/Q5_K: 8 in lanes 0..7; Q6_K: 16 in lanes 0..15)
  __m512i aux16;  // Q4_K/Q5_K: mins paired for vpmaddwd with bsums (m_j in lanes 2j, 2j+1); Q6_K: -32 * sc;
                  // the same 256 bits in both halves (the epilogue handles two tokens per vector)
  float d, dmin;
  __m512i qh;     // Q5_K: the 32 qh bytes in both 256-bit halves
};

template <DType WT>
inline void decode_k_row(const uint8_t* blk, KRow* k) {
  if constexpr (WT == DType::Q6_K) {
    const block_q6_K* x = reinterpret_cast<const block_q6_K*>(blk);
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x->scales)));
    k->sc16 = _mm512_castsi256_si512(s);
    k->aux16 = _mm512_broadcast_i64x4(_mm256_mullo_epi16(s, _mm256_set1_epi16(-32)));
    k->d = h2f(x->d);
    k->dmin = 0.0f;
  } else {
    const block_q4_K* x = reinterpret_cast<const block_q4_K*>(blk);  // q5_K starts with the same fields
    uint64_t sc, mn;
    unpack_k4_scales(x->scales, &sc, &mn);
    k->sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(mn)));
    k->aux16 = _mm512_broadcast_i64x4(_mm256_or_si256(m32, _mm256_slli_epi32(m32, 16)));
    k->d = h2f(x->d);
    k->dmin = h2f(x->dmin);
    if constexpr (WT == DType::Q5_K) {
      const block_q5_K* x5 = reinterpret_cast<const block_q5_K*>(blk);
      k->qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x5->qh)));
    }
  }
}

// Weights of chunk k (elements 64k..64k+63 of the super-block) as uint8.
template <DType WT>
inline __m512i decode_k_chunk(const uint8_t* blk, const KRow& kr, int k) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  if constexpr (WT == DType::Q6_K) {
    const block_q6_K* x = reinterpret_cast<const block_q6_K*>(blk);
    const int h = k / 2;
    const __m512i ql = _mm512_loadu_si512(x->ql + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->qh + 32 * h));
    const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    if (k % 2 == 0)
      return _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m30));
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(qh2, m30));
  } else {
    const block_q4_K* x = reinterpret_cast<const block_q4_K*>(blk);
    const uint8_t* qs = WT == DType::Q5_K ? reinterpret_cast<const block_q5_K*>(blk)->qs : x->qs;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * k));
    __m512i v = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
    if constexpr (WT == DType::Q5_K) {
      const __m512i bit = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                                                 _mm512_set1_epi8(static_cast<char>(1 << (2 * k + 1))));
      v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(kr.qh, bit), v, _mm512_set1_epi8(16));
    }
    return v;
  }
}

template <DType WT>
struct KQuantKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    constexpr size_t kBlockBytes = WT == DType::Q4_K ? sizeof(block_q4_K)
                                   : WT == DType::Q5_K ? sizeof(block_q5_K) : sizeof(block_q6_K);
    const Q8KTile<R, C> tile(j, o, t);
    const auto &w = tile.w;
    const auto &xq = tile.xq;
    const auto &xd = tile.xd;
    const auto &xs = tile.xs;
    constexpr int P = (C + 1) / 2;  // token pairs
    __m512 acc[R][P];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
    const int64_t nb = j.n_in / QK_K;
    for (int64_t b = 0; b < nb; ++b) {
      KRow kr[R];
      const uint8_t* blk[R];
      for (int r = 0; r < R; ++r) {
        blk[r] = w[r] + b * kBlockBytes;
        prefetch_weights(blk[r], (kBlockBytes + 63) / 64);  // 3 lines (Q4_K 144 B, Q5_K 176 B), 4 (Q6_K 210 B)
        decode_k_row<WT>(blk[r], &kr[r]);
      }
      __m512i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        const __m512i idx = WT == DType::Q6_K ? q6_scale_idx(k) : k4_scale_idx(k);
        __m512i wq[R], sc[R];
        for (int r = 0; r < R; ++r) {
          wq[r] = decode_k_chunk<WT>(blk[r], kr[r], k);
          sc[r] = _mm512_permutexvar_epi16(idx, kr[r].sc16);
        }
        for (int c = 0; c < C; ++c) {
          const __m512i xv = _mm512_loadu_si512(xq[c] + b * QK_K + 64 * k);
          for (int r = 0; r < R; ++r)
            isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(wq[r], xv), sc[r]);
        }
      }
      // Epilogue, two tokens per vector: the 16 int32 lanes of each (row, token) sum fold to 8 (exact), token
      // c0 in lanes 0..7 and c0 + 1 in lanes 8..15, next to the two tokens' bsums and scales; so the mins, the
      // conversions and the scaling run once per token pair (at C = 4 they were half of the kernel's work).
      __m512 dw[R], dmw[R];
      for (int r = 0; r < R; ++r) {
        dw[r] = _mm512_set1_ps(kr[r].d);
        if constexpr (WT != DType::Q6_K) dmw[r] = _mm512_set1_ps(kr[r].dmin);
      }
      for (int p = 0; p < P; ++p) {
        const int c0 = 2 * p;
        const bool two = c0 + 1 < C;
        const __m256i bs_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c0] + b * 16));
        const __m256i bs_hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c0 + 1] + b * 16))
                                  : _mm256_setzero_si256();
        const __m512i bs = _mm512_inserti64x4(_mm512_castsi256_si512(bs_lo), bs_hi, 1);
        const __m512 da = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(xd[c0][b])),
                                             _mm256_set1_ps(two ? xd[c0 + 1][b] : 0.0f), 1);
        for (int r = 0; r < R; ++r) {
          const __m512i s0 = isum[r][c0], s1 = two ? isum[r][c0 + 1] : _mm512_setzero_si512();
          const __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(s0, s1, _MM_SHUFFLE(1, 0, 1, 0)),
                                             _mm512_shuffle_i64x2(s0, s1, _MM_SHUFFLE(3, 2, 3, 2)));
          if constexpr (WT == DType::Q6_K) {
            const __m512i s = _mm512_dpwssd_epi32(f, bs, kr[r].aux16);
            acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], da), acc[r][p]);
          } else {
            const __m512 mins = _mm512_cvtepi32_ps(_mm512_madd_epi16(bs, kr[r].aux16));
            acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f), _mm512_mul_ps(dw[r], da), acc[r][p]);
            acc[r][p] = _mm512_fnmadd_ps(mins, _mm512_mul_ps(dmw[r], da), acc[r][p]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) {
        const __m512 v = acc[r][p];
        j.y[(t + 2 * p) * j.y_stride + o + r] = hsum256(_mm512_castps512_ps256(v));
        if (2 * p + 1 < C) j.y[(t + 2 * p + 1) * j.y_stride + o + r] = hsum256(_mm512_extractf32x8_ps(v, 1));
      }
  }
};

// ---- IQ4_XS weights x Q8_K activations ---------------------------------------------------------------------

// Chunk k (elements 64k..64k+63: sub-blocks 2k and 2k+1, indices in qs[32k..32k+31]) as int8 codebook values.
inline __m512i iq4xs_chunk(const block_iq4_xs* x, int k, const __m512i& book) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->qs + 32 * k));
  // 128-bit lanes in element order: low nibbles of bytes 0-15, their high nibbles, the same for bytes 16-31
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
  const __m512i idx = _mm512_and_si512(_mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
  return _mm512_shuffle_epi8(book, idx);
}

// The 8 signed sub-block scales ls - 32 as int16 lanes 0..7.
inline __m512i iq4xs_scales(const block_iq4_xs* x) {
  uint32_t lo;
  std::memcpy(&lo, x->scales_l, 4);
  const uint64_t nib = _pdep_u64(lo, 0x0F0F0F0F0F0F0F0Full);  // low nibble of scale s in byte s
  const uint64_t hi = _pdep_u64(x->scales_h, 0x0303030303030303ull);
  const __m128i ls = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(nib | (hi << 4))));
  return _mm512_castsi128_si512(_mm_sub_epi16(ls, _mm_set1_epi16(32)));
}

struct Iq4XsKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const Q8KTile<R, C> tile(j, o, t);
    const auto &w = tile.w;
    const auto &xq = tile.xq;
    const auto &xd = tile.xd;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const block_iq4_xs* x[R];
      __m512i sc16[R];
      for (int r = 0; r < R; ++r) {
        x[r] = reinterpret_cast<const block_iq4_xs*>(w[r]) + b;
        prefetch_weights(reinterpret_cast<const uint8_t*>(x[r]), (sizeof(block_iq4_xs) + 63) / 64);
        sc16[r] = iq4xs_scales(x[r]);
      }
      __m512i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        const __m512i idx = k4_scale_idx(k);  // int16 lanes 0..15: sub-block 2k, 16..31: 2k+1
        __m512i aw[R], sc[R];
        __mmask64 neg[R];
        for (int r = 0; r < R; ++r) {
          const __m512i wq = iq4xs_chunk(x[r], k, book);
          aw[r] = _mm512_abs_epi8(wq);
          neg[r] = _mm512_movepi8_mask(wq);
          sc[r] = _mm512_permutexvar_epi16(idx, sc16[r]);
        }
        for (int c = 0; c < C; ++c) {
          const __m512i xv = _mm512_loadu_si512(xq[c] + b * QK_K + 64 * k);
          for (int r = 0; r < R; ++r) {
            const __m512i sx = _mm512_mask_sub_epi8(xv, neg[r], _mm512_setzero_si512(), xv);  // sign(a, w)
            isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(aw[r], sx), sc[r]);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const float dw = h2f(x[r]->d);
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_set1_ps(dw * xd[c][b]), acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_tile_sums(j, o, t, r, c, acc[r][c]);
  }
};

// ---- TQ1_0 / TQ2_0 weights x Q8_K activations -------------------------------------------------------------

// Chunk k (elements 64k..64k+63) of a ternary block as uint8 codes c (w = c - 1; TQ2_0's code 3 included).
template <DType WT>
inline __m512i ternary_chunk(const uint8_t* blk, int k) {
  if constexpr (WT == DType::TQ2_0) {
    // qs[32 (k / 2) + m] holds elements 64k + m (bits 4(k % 2)..+1) and 64k + 32 + m (the next 2 bits)
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (k / 2))));
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * (k % 2))),
                                          _mm256_set1_epi16(static_cast<short>(4 * (k % 2) + 2)), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(3));
  } else {
    // The bytes holding the chunk's elements, in element order, and the power of 3 that brings each element's trit
    // to the top (blocks.h: qs[m] trit n is element 32n + m, qs[32 + m] trit n is 160 + 16n + m, qh[j] trit n is
    // 240 + 4n + j). Multipliers per 16-bit word (both bytes of a word share one).
    const __m256i lo32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    const __m128i hi16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32));
    uint32_t qh;
    std::memcpy(&qh, blk + 48, 4);
    __m512i src, mul;
    switch (k) {
      case 0:
        src = _mm512_broadcast_i64x4(lo32);
        mul = _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1);
        break;
      case 1:
        src = _mm512_broadcast_i64x4(lo32);
        mul = _mm512_inserti64x4(_mm512_set1_epi16(9), _mm256_set1_epi16(27), 1);
        break;
      case 2:
        src = _mm512_inserti64x4(_mm512_castsi256_si512(lo32), _mm256_broadcastsi128_si256(hi16), 1);
        mul = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81,
                               81, 81, 81, 81, 81);
        break;
      default:
        src = _mm512_inserti32x4(_mm512_broadcast_i32x4(hi16), _mm_set1_epi32(static_cast<int>(qh)), 3);
        mul = _mm512_set_epi16(27, 27, 9, 9, 3, 3, 1, 1, 81, 81, 81, 81, 81, 81, 81, 81, 27, 27, 27, 27, 27, 27, 27, 27, 9, 9,
                               9, 9, 9, 9, 9, 9);
        break;
    }
    // b * 3^n mod 256 per byte (the low byte of a 16-bit product; the high byte's own product shifted up), then the
    // trit (p * 3) >> 8 = (p >= 86) + (p >= 171).
    const __m512i m00ff = _mm512_set1_epi16(0x00FF);
    const __m512i p = _mm512_or_si512(_mm512_and_si512(_mm512_mullo_epi16(src, mul), m00ff),
                                      _mm512_mullo_epi16(_mm512_andnot_si512(m00ff, src), mul));
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i t = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(p, _mm512_set1_epi8(86)), one);
    return _mm512_mask_add_epi8(t, _mm512_cmpge_epu8_mask(p, _mm512_set1_epi8(static_cast<char>(171))), t, one);
  }
}

template <DType WT>
struct TernaryKern {
  using Block = std::conditional_t<WT == DType::TQ1_0, block_tq1_0, block_tq2_0>;
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const Q8KTile<R, C> tile(j, o, t);
    const auto &w = tile.w;
    const auto &xq = tile.xq;
    const auto &xd = tile.xd;
    const auto &xs = tile.xs;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const Block* x[R];
      for (int r = 0; r < R; ++r) {
        x[r] = reinterpret_cast<const Block*>(w[r]) + b;
        prefetch_weights(reinterpret_cast<const uint8_t*>(x[r]), (sizeof(Block) + 63) / 64);
      }
      // sum (c - 1) a = sum c a - sum a: each lane sum starts at 0 but lane 0, which starts at -sum a (the bsums)
      __m512i isum[R][C];
      for (int c = 0; c < C; ++c) {
        int sa = 0;
        for (int g = 0; g < QK_K / 16; ++g) sa += xs[c][16 * b + g];
        for (int r = 0; r < R; ++r) isum[r][c] = _mm512_maskz_set1_epi32(1, -sa);
      }
      for (int k = 0; k < 4; ++k) {
        __m512i q[R];
        for (int r = 0; r < R; ++r) q[r] = ternary_chunk<WT>(reinterpret_cast<const uint8_t*>(x[r]), k);
        for (int c = 0; c < C; ++c) {
          const __m512i xv = _mm512_loadu_si512(xq[c] + b * QK_K + 64 * k);
          for (int r = 0; r < R; ++r) isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], q[r], xv);
        }
      }
      for (int r = 0; r < R; ++r) {
        const float dw = h2f(x[r]->d);
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_set1_ps(dw * xd[c][b]), acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_tile_sums(j, o, t, r, c, acc[r][c]);
  }
};

template <class Kern, int RG, int CG>
void gemm_with(const GemmJob& j, int64_t o0, int64_t o1) {
  // GEMV: one weight row at a time, so the weights are read as one sequential stream (the hardware prefetcher
  // keeps up with it; interleaving 2-4 rows measured 2-3x slower on Zen 5).
  if (j.n_tok == 1) drive_tiles<1, 1, Kern>(j, o0, o1);
  else drive_tiles<RG, CG, Kern>(j, o0, o1);
}

bool has(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16:
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: case DType::TQ1_0: case DType::TQ2_0:
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M:
      return true;
    default:
      return false;
  }
}

void gemm(const GemmJob& j, int64_t o0, int64_t o1) {
  switch (j.wtype) {
    case DType::F32: return gemm_with<FloatKern<DType::F32>, 4, 4>(j, o0, o1);
    case DType::F16: return gemm_with<FloatKern<DType::F16>, 4, 4>(j, o0, o1);
    case DType::BF16: return gemm_with<FloatKern<DType::BF16>, 4, 4>(j, o0, o1);
    case DType::Q4_0: return gemm_with<Block32Kern<DType::Q4_0>, 2, 4>(j, o0, o1);
    case DType::Q5_0: return gemm_with<Block32Kern<DType::Q5_0>, 2, 4>(j, o0, o1);
    case DType::Q8_0: return gemm_with<Block32Kern<DType::Q8_0>, 2, 4>(j, o0, o1);
    case DType::IQ4_NL: return gemm_with<Block32Kern<DType::IQ4_NL>, 2, 4>(j, o0, o1);
    case DType::MXFP4: return gemm_with<Block32Kern<DType::MXFP4>, 2, 4>(j, o0, o1);
    case DType::IQ4_XS: return gemm_with<Iq4XsKern, 1, 4>(j, o0, o1);
    case DType::TQ1_0: return gemm_with<TernaryKern<DType::TQ1_0>, 1, 4>(j, o0, o1);
    case DType::TQ2_0: return gemm_with<TernaryKern<DType::TQ2_0>, 1, 4>(j, o0, o1);
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M:
      return gemm_iq_grid_avx512(j, o0, o1);  // matmul_iq_avx512.cpp
    // K-quants: C = 8 (Q6_K: 6) tokens per weight row decode while C int8 activation rows fit in L1 (n_in <= 4096),
    // else 4. Measured, 1 thread, 128 tokens, GFLOP/s: Q4_K 2048x2048 and 8192x2048: 1x4 256-263, 1x6 265-268,
    // 1x8 271-289; Q6_K 1x4 271-285, 1x8 291-304, 1x6 306-321; 2048x8192 (n_in 8192): Q4_K 1x8 221 vs 1x4 255.
    case DType::Q4_K:
      if (j.n_in <= 4096) return gemm_with<KQuantKern<DType::Q4_K>, 1, 8>(j, o0, o1);
      return gemm_with<KQuantKern<DType::Q4_K>, 1, 4>(j, o0, o1);
    case DType::Q5_K:
      if (j.n_in <= 4096) return gemm_with<KQuantKern<DType::Q5_K>, 1, 8>(j, o0, o1);
      return gemm_with<KQuantKern<DType::Q5_K>, 1, 4>(j, o0, o1);
    case DType::Q6_K:
      if (j.n_in <= 4096) return gemm_with<KQuantKern<DType::Q6_K>, 1, 6>(j, o0, o1);
      return gemm_with<KQuantKern<DType::Q6_K>, 1, 4>(j, o0, o1);
    default: return;
  }
}

const FastKernels kKernels = {"avx512", true, has, quantize_act_row_avx512, gemm};

}  // namespace

const FastKernels* fast_kernels_avx512() { return &kKernels; }

}  // namespace kiln::cpu::detail
