// AVX2 matmul kernels of the i-quant grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K,
// used by both the AVX2 and the AVX-512 kernel sets (fast_kernels_avx2 / fast_kernels_avx512 dispatch here).
//
// Numerics: the integer form of iq_decode.h. Per sub-block of 32 the weights are decoded to int8 magnitudes |w|
// (grid bytes gathered from the tables, 8 or 4 at a time) and a sign per element, applied to the activations:
// vpmaddubsw(|w|, sign(a, w)) gives int16 pair sums (|w| <= 62, |a| <= 127: < 2^14), vpmaddwd with the two 16-element
// scales (2 ls + 1 <= 31) widens them to int32, exact over the super-block (iq_decode.h bounds it below 2^26);
// acc += (d_w * unit * d_a) * isum in f32 lanes (unit a power of two: exact). Same integers as matmul_ref.cpp.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/iq_decode.h"
#include "backend/cpu/matmul_kernels.h"
#include "util/fp16.h"

namespace kiln::cpu::detail {

namespace {

inline float hsum(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// +-1 per byte from 32 sign bits (bit j of byte l: element 8l + j negative).
inline __m256i signs_pm1(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

inline uint32_t pack4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return a | (static_cast<uint32_t>(b) << 8) | (static_cast<uint32_t>(c) << 16) | (static_cast<uint32_t>(d) << 24);
}

inline __m256i grid8x4(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3) {
  return _mm256_setr_epi64x(static_cast<long long>(g0), static_cast<long long>(g1), static_cast<long long>(g2),
                            static_cast<long long>(g3));
}

inline __m256i scales16(int lo, int hi) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(lo)), _mm_set1_epi16(static_cast<short>(hi)));
}

// IQ1: w = 8 grid + delta (grid bytes in {-1, 0, 1}, delta +-1 per group as bytes).
inline __m256i iq1_w(__m256i grid, __m256i delta) {
  const __m256i g2 = _mm256_add_epi8(grid, grid), g4 = _mm256_add_epi8(g2, g2);
  return _mm256_add_epi8(_mm256_add_epi8(g4, g4), delta);
}

// Sub-block s of one super-block: |w| (mag), the signs to apply to the activations (sgn: +-1 or w itself) and the
// int16 scales of elements 0-15 / 16-31 (sc).
template <DType WT>
inline void decode(const uint8_t* blk, int s, __m256i& mag, __m256i& sgn, __m256i& sc) {
  if constexpr (WT == DType::IQ2_XXS) {
    const auto& b = *reinterpret_cast<const block_iq2_xxs*>(blk);
    uint8_t idx[4];
    uint32_t aux;
    std::memcpy(idx, b.qs + 4 * s, 4);
    std::memcpy(&aux, b.qs + 4 * s + 2, 4);
    mag = grid8x4(kIq2xxsGrid[idx[0]], kIq2xxsGrid[idx[1]], kIq2xxsGrid[idx[2]], kIq2xxsGrid[idx[3]]);
    sgn = signs_pm1(pack4(kIqSigns[aux & 127], kIqSigns[(aux >> 7) & 127], kIqSigns[(aux >> 14) & 127],
                          kIqSigns[(aux >> 21) & 127]));
    const int ls = 2 * static_cast<int>(aux >> 28) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ2_XS) {
    const auto& b = *reinterpret_cast<const block_iq2_xs*>(blk);
    const uint16_t* q = b.qs + 4 * s;
    mag = grid8x4(kIq2xsGrid[q[0] & 511], kIq2xsGrid[q[1] & 511], kIq2xsGrid[q[2] & 511], kIq2xsGrid[q[3] & 511]);
    sgn = signs_pm1(pack4(kIqSigns[q[0] >> 9], kIqSigns[q[1] >> 9], kIqSigns[q[2] >> 9], kIqSigns[q[3] >> 9]));
    sc = scales16(2 * (b.scales[s] & 0xF) + 1, 2 * (b.scales[s] >> 4) + 1);
  } else if constexpr (WT == DType::IQ2_S) {
    const auto& b = *reinterpret_cast<const block_iq2_s*>(blk);
    const uint8_t* q = b.qs + 4 * s;
    const int qh = b.qh[s];
    mag = grid8x4(kIq2sGrid[q[0] | ((qh << 8) & 0x300)], kIq2sGrid[q[1] | ((qh << 6) & 0x300)],
                  kIq2sGrid[q[2] | ((qh << 4) & 0x300)], kIq2sGrid[q[3] | ((qh << 2) & 0x300)]);
    uint32_t sb;
    std::memcpy(&sb, b.qs + 32 + 4 * s, 4);
    sgn = signs_pm1(sb);
    sc = scales16(2 * (b.scales[s] & 0xF) + 1, 2 * (b.scales[s] >> 4) + 1);
  } else if constexpr (WT == DType::IQ3_XXS) {
    const auto& b = *reinterpret_cast<const block_iq3_xxs*>(blk);
    const uint8_t* q = b.qs + 8 * s;
    uint32_t aux;
    std::memcpy(&aux, b.qs + 64 + 4 * s, 4);
    mag = _mm256_setr_epi32(static_cast<int>(kIq3xxsGrid[q[0]]), static_cast<int>(kIq3xxsGrid[q[1]]),
                            static_cast<int>(kIq3xxsGrid[q[2]]), static_cast<int>(kIq3xxsGrid[q[3]]),
                            static_cast<int>(kIq3xxsGrid[q[4]]), static_cast<int>(kIq3xxsGrid[q[5]]),
                            static_cast<int>(kIq3xxsGrid[q[6]]), static_cast<int>(kIq3xxsGrid[q[7]]));
    sgn = signs_pm1(pack4(kIqSigns[aux & 127], kIqSigns[(aux >> 7) & 127], kIqSigns[(aux >> 14) & 127],
                          kIqSigns[(aux >> 21) & 127]));
    const int ls = 2 * static_cast<int>(aux >> 28) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ3_S) {
    const auto& b = *reinterpret_cast<const block_iq3_s*>(blk);
    const uint8_t* q = b.qs + 8 * s;
    const int qh = b.qh[s];
    mag = _mm256_setr_epi32(
        static_cast<int>(kIq3sGrid[q[0] | ((qh << 8) & 256)]), static_cast<int>(kIq3sGrid[q[1] | ((qh << 7) & 256)]),
        static_cast<int>(kIq3sGrid[q[2] | ((qh << 6) & 256)]), static_cast<int>(kIq3sGrid[q[3] | ((qh << 5) & 256)]),
        static_cast<int>(kIq3sGrid[q[4] | ((qh << 4) & 256)]), static_cast<int>(kIq3sGrid[q[5] | ((qh << 3) & 256)]),
        static_cast<int>(kIq3sGrid[q[6] | ((qh << 2) & 256)]), static_cast<int>(kIq3sGrid[q[7] | ((qh << 1) & 256)]));
    uint32_t sb;
    std::memcpy(&sb, b.signs + 4 * s, 4);
    sgn = signs_pm1(sb);
    const int ls = 2 * ((b.scales[s / 2] >> (4 * (s % 2))) & 0xF) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ1_S) {
    const auto& b = *reinterpret_cast<const block_iq1_s*>(blk);
    const uint8_t* q = b.qs + 4 * s;
    const int qh = b.qh[s];
    const __m256i grid = grid8x4(kIq1sGrid[q[0] | ((qh << 8) & 0x700)], kIq1sGrid[q[1] | ((qh << 5) & 0x700)],
                                 kIq1sGrid[q[2] | ((qh << 2) & 0x700)], kIq1sGrid[q[3] | ((qh >> 1) & 0x700)]);
    const __m256i w = iq1_w(grid, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1));
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
    const int ls = 2 * ((qh >> 12) & 7) + 1;
    sc = scales16(ls, ls);
  } else {  // IQ1_M
    const auto& b = *reinterpret_cast<const block_iq1_m*>(blk);
    const uint8_t* q = b.qs + 4 * s;
    const int h0 = b.qh[2 * s], h1 = b.qh[2 * s + 1];
    const __m256i grid = grid8x4(kIq1sGrid[q[0] | ((h0 << 8) & 0x700)], kIq1sGrid[q[1] | ((h0 << 4) & 0x700)],
                                 kIq1sGrid[q[2] | ((h1 << 8) & 0x700)], kIq1sGrid[q[3] | ((h1 << 4) & 0x700)]);
    auto dl = [](int neg) { return neg ? -1LL : 0x0101010101010101LL; };  // bytes -1 or +1
    const __m256i delta = _mm256_setr_epi64x(dl(h0 & 0x08), dl(h0 & 0x80), dl(h1 & 0x08), dl(h1 & 0x80));
    const __m256i w = iq1_w(grid, delta);
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
    uint16_t scw;
    std::memcpy(&scw, b.scales + 2 * (s / 2), 2);
    const int sh = 6 * (s % 2);
    sc = scales16(2 * ((scw >> sh) & 7) + 1, 2 * ((scw >> (sh + 3)) & 7) + 1);
  }
}

template <DType WT>
struct IqGridKern {
  template <int R, int C>
  static void run(const GemmJob& j, int64_t o, int64_t t) {
    const Q8KTile<R, C> tile(j, o, t);
    const auto& w = tile.w;
    const auto& xq = tile.xq;
    const auto& xd = tile.xd;
    constexpr size_t kBytes = static_cast<size_t>(WT == DType::IQ2_XXS ? 66 : WT == DType::IQ2_XS ? 74
                                                  : WT == DType::IQ2_S   ? 82 : WT == DType::IQ3_XXS ? 98
                                                  : WT == DType::IQ3_S   ? 110 : WT == DType::IQ1_S ? 50 : 56);
    const float unit = iq_unit(WT);
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < j.n_in / QK_K; ++b) {
      const uint8_t* blk[R];
      for (int r = 0; r < R; ++r) {
        blk[r] = w[r] + b * kBytes;
        prefetch_weights(blk[r], (kBytes + 63) / 64);
      }
      __m256i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
      for (int s = 0; s < 8; ++s) {
        __m256i mag[R], sgn[R], sc[R];
        for (int r = 0; r < R; ++r) decode<WT>(blk[r], s, mag[r], sgn[r], sc[r]);
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + b * QK_K + 32 * s));
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_maddubs_epi16(mag[r], _mm256_sign_epi8(xv, sgn[r]));
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(p, sc[r]));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const float dw = _cvtsh_ss(iq_d_bits(WT, blk[r])) * unit;
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(dw * xd[c][b]), acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) j.y[(t + c) * j.y_stride + o + r] = hsum(acc[r][c]);
  }
};

template <DType WT>
void gemm_type(const GemmJob& j, int64_t o0, int64_t o1) {
  if (j.n_tok == 1) drive_tiles<1, 1, IqGridKern<WT>>(j, o0, o1);  // GEMV: one sequential weight stream
  else drive_tiles<2, 4, IqGridKern<WT>>(j, o0, o1);
}

}  // namespace

void gemm_iq_grid_avx2(const GemmJob& j, int64_t o0, int64_t o1) {
  switch (j.wtype) {
    case DType::IQ2_XXS: return gemm_type<DType::IQ2_XXS>(j, o0, o1);
    case DType::IQ2_XS: return gemm_type<DType::IQ2_XS>(j, o0, o1);
    case DType::IQ2_S: return gemm_type<DType::IQ2_S>(j, o0, o1);
    case DType::IQ3_XXS: return gemm_type<DType::IQ3_XXS>(j, o0, o1);
    case DType::IQ3_S: return gemm_type<DType::IQ3_S>(j, o0, o1);
    case DType::IQ1_S: return gemm_type<DType::IQ1_S>(j, o0, o1);
    case DType::IQ1_M: return gemm_type<DType::IQ1_M>(j, o0, o1);
    default: return;
  }
}

}  // namespace kiln::cpu::detail
