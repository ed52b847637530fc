// AVX2 (+FMA, F16C) matmul kernels for CPUs without AVX-512 VNNI: F32/F16/BF16, Q4_0/Q8_0/IQ4_NL/MXFP4, Q4_K/Q6_K,
// IQ4_XS and TQ1_0/TQ2_0; the other types take the threaded scalar path. Same tiling as matmul_avx512.cpp with 256-bit vectors
// (16 registers, so smaller tiles) and 32-element chunks.
//
// Numerics (agree with matmul_ref.cpp up to f32 summation order):
//  - F32/F16/BF16: as the AVX-512 kernels, 8 f32 lanes per (row, token).
//  - Q4_0/Q8_0/IQ4_NL/MXFP4 x Q8_0 (signed activations): w decoded to int8 in [-128, 127] (the codebook types by
//    a vpshufb table lookup of their nibbles: IQ4_NL's values, MXFP4's doubled FP4 values with half its scale);
//    vpmaddubsw(|w|, sign(a, w)) gives int16 pair sums of a*w (|a| <= 127 so the largest pair, 2*128*127, does not
//    saturate), vpmaddwd with ones widens them to int32 exactly; each block's 8 lanes are converted and fma'd with
//    d_w * d_a.
//  - Q4_K/Q6_K x Q8_K: uint8 q (Q6_K: q in [0, 63] with -32 * sum_g sc_g * bsums_g added in int32);
//    vpmaddubsw(q, a) -> int16 (max 2*63*127), vpmaddwd with the sub-block scale -> int32, exact per super-block;
//    acc += (d_w d_a) * isum - (dmin_w d_a) * summs per super-block in f32 lanes.
//  - IQ4_XS x Q8_K: w = codebook value (int8, |w| <= 127), and Q8_K's |a| <= 127: vpmaddubsw(|w|, sign(a, w))
//    pair sums stay below 2*127*127 < 2^15; vpmaddwd with the sub-block's signed scale ls - 32 widens them to int32,
//    exact over the super-block; acc += (d_w d_a) * isum.
//  - TQ1_0/TQ2_0 x Q8_K: w = c - 1 with the code c in [0, 3] as uint8; vpmaddubsw(c, a) pair sums (<= 2*3*128)
//    added in int16 over the super-block's 8 chunks (< 2^15), vpmaddwd with ones widens them, minus the sum of a
//    (bsums): isum = sum (c - 1) a, exact; acc += (d_w d_a) * isum.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/simd256.h"
#include "quant/blocks.h"

namespace kiln::cpu::detail {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline void store_sum(const GemmJob& j, int64_t o, int64_t t, int r, int c, __m256 v) {
  j.y[(t + c) * j.y_stride + o + r] = hsum256(v);
}

// ---- F32 / F16 / BF16 -----------------------------------------------------------------------------------------

template <DType WT>
inline __m256 load_w8(const uint8_t* row, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (WT == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
}

template <DType WT>
inline float load_w1(const uint8_t* row, int64_t i) {
  uint16_t h;
  if constexpr (WT == DType::F32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  }
  std::memcpy(&h, row + 2 * i, 2);
  if constexpr (WT == DType::F16) return h2f(h);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <DType WT>
struct FloatKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const uint8_t* w[R];
    const float* x[C];
    for (int r = 0; r < R; ++r) w[r] = j.w + (o + r) * j.w_row_bytes;
    for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const float*>(j.act + (t + c) * j.layout.row_bytes);
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const int64_t n = j.n_in;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 xv[C];
      for (int c = 0; c < C; ++c) xv[c] = _mm256_load_ps(x[c] + i);
      for (int r = 0; r < R; ++r) {
        if (i % 32 == 0) prefetch_weights(w[r] + i * (WT == DType::F32 ? 4 : 2), WT == DType::F32 ? 2 : 1);
        const __m256 wv = load_w8<WT>(w[r], i);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        float s = hsum256(acc[r][c]);
        for (int64_t k = i; k < n; ++k) s += load_w1<WT>(w[r], k) * x[c][k];
        j.y[(t + c) * j.y_stride + o + r] = s;
      }
  }
};

// ---- Q4_0 / Q8_0 x Q8_0 ---------------------------------------------------------------------------------------

template <DType WT>
inline constexpr size_t kB32Bytes = WT == DType::Q8_0 ? sizeof(block_q8_0)
                                    : WT == DType::Q4_0 ? sizeof(block_q4_0)
                                    : WT == DType::IQ4_NL ? sizeof(block_iq4_nl) : sizeof(block_mxfp4);

// 32 nibbles (element j: low nibble of qs[j], element j+16: high nibble) mapped through a 16-entry int8 codebook.
inline __m256i lookup_nibbles32(const uint8_t* qs, const int8_t* book) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
  const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(book)));
  return _mm256_shuffle_epi8(tbl, idx);
}

template <DType WT>
inline __m256i decode_b32(const uint8_t* row, int64_t b, float* d) {
  if constexpr (WT == DType::Q8_0) {
    const block_q8_0* x = reinterpret_cast<const block_q8_0*>(row) + b;
    *d = h2f(x->d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->qs));
  } else if constexpr (WT == DType::Q4_0) {
    const block_q4_0* x = reinterpret_cast<const block_q4_0*>(row) + b;
    *d = h2f(x->d);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x->qs));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
  } else if constexpr (WT == DType::IQ4_NL) {
    const block_iq4_nl* x = reinterpret_cast<const block_iq4_nl*>(row) + b;
    *d = h2f(x->d);
    return lookup_nibbles32(x->qs, kIq4nlValues);
  } else {  // MXFP4: doubled FP4 values, half the E8M0 scale (quant/blocks.h)
    const block_mxfp4* x = reinterpret_cast<const block_mxfp4*>(row) + b;
    *d = e8m0_half_to_f32(x->e);
    return lookup_nibbles32(x->qs, kMxfp4Values);
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
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < j.n_in / 32; ++b) {
      __m256i aw[R], wq[R];
      __m256 dw[R];
      for (int r = 0; r < R; ++r) {
        float d;
        prefetch_weights(w[r] + b * kB32Bytes<WT>, 1);
        wq[r] = decode_b32<WT>(w[r], b, &d);
        aw[r] = _mm256_sign_epi8(wq[r], wq[r]);  // |w| (-128 -> 128 as uint8)
        dw[r] = _mm256_set1_ps(d);
      }
      for (int c = 0; c < C; ++c) {
        const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[c] + 32 * b));
        const __m256 dx = _mm256_load_ps(xd[c] + 8 * b);
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wq[r]));
          const __m256i s = _mm256_madd_epi16(p, ones);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_sum(j, o, t, r, c, acc[r][c]);
  }
};

// ---- Q4_K / Q6_K x Q8_K -----------------------------------------------------------------------------------------

inline void unpack_k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int k = 0; k < 8; ++k) {
    if (k < 4) {
      sc[k] = s[k] & 63;
      mn[k] = s[k + 4] & 63;
    } else {
      sc[k] = static_cast<uint8_t>((s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4));
      mn[k] = static_cast<uint8_t>((s[k + 4] >> 4) | ((s[k] >> 6) << 4));
    }
  }
}

template <DType WT>
struct KQuantKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    constexpr size_t kBlockBytes = WT == DType::Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K);
    const Q8KTile<R, C> tile(j, o, t);
    const auto &w = tile.w;
    const auto &xq = tile.xq;
    const auto &xd = tile.xd;
    const auto &xs = tile.xs;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const uint8_t* blk[R];
      int16_t sc[R][16];
      __m256i aux[R];  // Q4_K: mins paired for vpmaddwd with bsums; Q6_K: -32 * scales
      float dw[R], dmw[R];
      for (int r = 0; r < R; ++r) {
        blk[r] = w[r] + b * kBlockBytes;
        prefetch_weights(blk[r], (kBlockBytes + 63) / 64);
        if constexpr (WT == DType::Q4_K) {
          const block_q4_K* x = reinterpret_cast<const block_q4_K*>(blk[r]);
          uint8_t s8[8], m8[8];
          unpack_k4_scales(x->scales, s8, m8);
          int16_t mp[16];
          for (int k = 0; k < 8; ++k) {
            sc[r][k] = s8[k];
            mp[2 * k] = mp[2 * k + 1] = m8[k];
          }
          aux[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp));
          dw[r] = h2f(x->d);
          dmw[r] = h2f(x->dmin);
        } else {
          const block_q6_K* x = reinterpret_cast<const block_q6_K*>(blk[r]);
          for (int k = 0; k < 16; ++k) sc[r][k] = x->scales[k];
          aux[r] = _mm256_mullo_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc[r])), _mm256_set1_epi16(-32));
          dw[r] = h2f(x->d);
          dmw[r] = 0.0f;
        }
      }
      __m256i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {  // chunk k: elements 32k..32k+31
        __m256i wq[R], scv[R];
        for (int r = 0; r < R; ++r) {
          if constexpr (WT == DType::Q4_K) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                reinterpret_cast<const block_q4_K*>(blk[r])->qs + 32 * (k / 2)));
            wq[r] = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
            scv[r] = _mm256_set1_epi16(sc[r][k]);
          } else {
            const block_q6_K* x = reinterpret_cast<const block_q6_K*>(blk[r]);
            const int h = k / 4, p = k % 4;
            const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->ql + 64 * h + 32 * (p % 2)));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->qh + 32 * h));
            const __m256i lo = _mm256_and_si256(p < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), m3);
            wq[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            scv[r] = _mm256_set_m128i(_mm_set1_epi16(sc[r][2 * k + 1]), _mm_set1_epi16(sc[r][2 * k]));
          }
        }
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + b * QK_K + 32 * k));
          for (int r = 0; r < R; ++r)
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xv), scv[r]));
        }
      }
      for (int c = 0; c < C; ++c) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c] + 16 * b));
        const float da = xd[c][b];
        for (int r = 0; r < R; ++r) {
          const __m256i m = _mm256_madd_epi16(bs, aux[r]);
          if constexpr (WT == DType::Q6_K) {
            const __m256i s = _mm256_add_epi32(isum[r][c], m);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw[r] * da), acc[r][c]);
          } else {
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(dw[r] * da), acc[r][c]);
            acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmw[r] * da), acc[r][c]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_sum(j, o, t, r, c, acc[r][c]);
  }
};

// ---- IQ4_XS x Q8_K ----------------------------------------------------------------------------------------------

// Sub-block s's signed scale ls - 32 (quant/blocks.h).
inline int iq4xs_scale(const block_iq4_xs* x, int s) {
  return (((x->scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x->scales_h >> (2 * s)) & 3) << 4)) - 32;
}

struct Iq4XsKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const Q8KTile<R, C> tile(j, o, t);
    const auto &w = tile.w;
    const auto &xq = tile.xq;
    const auto &xd = tile.xd;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const block_iq4_xs* x[R];
      for (int r = 0; r < R; ++r) {
        x[r] = reinterpret_cast<const block_iq4_xs*>(w[r]) + b;
        prefetch_weights(reinterpret_cast<const uint8_t*>(x[r]), (sizeof(block_iq4_xs) + 63) / 64);
      }
      __m256i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
      for (int s = 0; s < 8; ++s) {  // sub-block s: elements 32s..32s+31
        __m256i wq[R], aw[R], sc[R];
        for (int r = 0; r < R; ++r) {
          wq[r] = lookup_nibbles32(x[r]->qs + 16 * s, kIq4nlValues);
          aw[r] = _mm256_sign_epi8(wq[r], wq[r]);
          sc[r] = _mm256_set1_epi16(static_cast<short>(iq4xs_scale(x[r], s)));
        }
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + b * QK_K + 32 * s));
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wq[r]));
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(p, sc[r]));
          }
        }
      }
      for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r)
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(h2f(x[r]->d) * xd[c][b]), acc[r][c]);
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_sum(j, o, t, r, c, acc[r][c]);
  }
};

// ---- TQ1_0 / TQ2_0 x Q8_K ----------------------------------------------------------------------------------------

// Chunk k (elements 32k..32k+31) of a ternary block as uint8 codes c (w = c - 1; TQ2_0's code 3 included).
template <DType WT>
inline __m256i ternary_chunk(const uint8_t* blk, int k) {
  if constexpr (WT == DType::TQ2_0) {  // qs[32 (k / 4) + m] bits 2(k % 4)..+1 hold element 32k + m
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (k / 4)));
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (k % 4))), _mm256_set1_epi8(3));
  } else {
    // The bytes holding the chunk's elements and the power of 3 per 16-bit word that brings each one's trit to the
    // top (element order in blocks.h); as the AVX-512 decoder.
    static constexpr short kPow3[5] = {1, 3, 9, 27, 81};
    __m256i src, mul;
    if (k < 5) {
      src = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
      mul = _mm256_set1_epi16(kPow3[k]);
    } else {
      const __m128i hi16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32));
      uint32_t qh;
      std::memcpy(&qh, blk + 48, 4);
      if (k < 7) {
        src = _mm256_broadcastsi128_si256(hi16);
        mul = _mm256_setr_m128i(_mm_set1_epi16(kPow3[2 * (k - 5)]), _mm_set1_epi16(kPow3[2 * (k - 5) + 1]));
      } else {
        src = _mm256_setr_m128i(hi16, _mm_set1_epi32(static_cast<int>(qh)));
        mul = _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27);
      }
    }
    const __m256i m00ff = _mm256_set1_epi16(0x00FF);
    const __m256i p = _mm256_or_si256(_mm256_and_si256(_mm256_mullo_epi16(src, mul), m00ff),
                                      _mm256_mullo_epi16(_mm256_andnot_si256(m00ff, src), mul));
    // trit (p * 3) >> 8 = (p >= 86) + (p >= 171), from two all-ones compare masks (unsigned p >= v: max(p, v) == p)
    const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(p, _mm256_set1_epi8(86)), p);
    const __m256i ge171 = _mm256_cmpeq_epi8(_mm256_max_epu8(p, _mm256_set1_epi8(static_cast<char>(171))), p);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
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
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const Block* x[R];
      for (int r = 0; r < R; ++r) {
        x[r] = reinterpret_cast<const Block*>(w[r]) + b;
        prefetch_weights(reinterpret_cast<const uint8_t*>(x[r]), (sizeof(Block) + 63) / 64);
      }
      // int16 lanes: 8 chunks of vpmaddubsw pair sums c*a, |.| <= 8 * 2 * 3 * 128 < 2^15
      __m256i s16[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) s16[r][c] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        __m256i q[R];
        for (int r = 0; r < R; ++r) q[r] = ternary_chunk<WT>(reinterpret_cast<const uint8_t*>(x[r]), k);
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + b * QK_K + 32 * k));
          for (int r = 0; r < R; ++r) s16[r][c] = _mm256_add_epi16(s16[r][c], _mm256_maddubs_epi16(q[r], xv));
        }
      }
      for (int c = 0; c < C; ++c) {
        int sa = 0;  // sum (c - 1) a = sum c a - sum a (the bsums), subtracted in lane 0
        for (int g = 0; g < QK_K / 16; ++g) sa += xs[c][16 * b + g];
        const __m256i neg = _mm256_setr_epi32(-sa, 0, 0, 0, 0, 0, 0, 0);
        for (int r = 0; r < R; ++r) {
          const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s16[r][c], ones), neg);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(h2f(x[r]->d) * xd[c][b]), acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_sum(j, o, t, r, c, acc[r][c]);
  }
};

template <class Kern, int RG, int CG>
void gemm_with(const GemmJob& j, int64_t o0, int64_t o1) {
  if (j.n_tok == 1) drive_tiles<1, 1, Kern>(j, o0, o1);  // GEMV: one sequential weight stream (see avx512)
  else drive_tiles<RG, CG, Kern>(j, o0, o1);
}

bool has(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16:
    case DType::Q4_0: case DType::Q8_0: case DType::Q4_K: case DType::Q6_K:
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
    case DType::F32: return gemm_with<FloatKern<DType::F32>, 2, 4>(j, o0, o1);
    case DType::F16: return gemm_with<FloatKern<DType::F16>, 2, 4>(j, o0, o1);
    case DType::BF16: return gemm_with<FloatKern<DType::BF16>, 2, 4>(j, o0, o1);
    case DType::Q4_0: return gemm_with<Block32Kern<DType::Q4_0>, 1, 4>(j, o0, o1);
    case DType::Q8_0: return gemm_with<Block32Kern<DType::Q8_0>, 1, 4>(j, o0, o1);
    case DType::Q4_K: return gemm_with<KQuantKern<DType::Q4_K>, 1, 4>(j, o0, o1);
    case DType::Q6_K: return gemm_with<KQuantKern<DType::Q6_K>, 1, 4>(j, o0, o1);
    case DType::IQ4_NL: return gemm_with<Block32Kern<DType::IQ4_NL>, 1, 4>(j, o0, o1);
    case DType::MXFP4: return gemm_with<Block32Kern<DType::MXFP4>, 1, 4>(j, o0, o1);
    case DType::IQ4_XS: return gemm_with<Iq4XsKern, 1, 4>(j, o0, o1);
    case DType::TQ1_0: return gemm_with<TernaryKern<DType::TQ1_0>, 1, 4>(j, o0, o1);
    case DType::TQ2_0: return gemm_with<TernaryKern<DType::TQ2_0>, 1, 4>(j, o0, o1);
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M:
      return gemm_iq_grid_avx2(j, o0, o1);  // matmul_iq_avx2.cpp
    default: return;
  }
}

const FastKernels kKernels = {"avx2", false, has, quantize_act_row_scalar, gemm};

}  // namespace

const FastKernels* fast_kernels_avx2() { return &kKernels; }

}  // namespace kiln::cpu::detail
