// AVX2 matmul kernels of the i-quant grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K,
// used by both the AVX2 and the AVX-512 kernel sets (fast_kernels_avx2 / fast_kernels_avx512 dispatch here).
//
// Numerics: the integer form of iq_decode.h. Per sub-block of 32 the weights are decoded to int8 magnitudes |w|
// (grid bytes gathered from the tables, 8 or 4 at a time) and a +-1 per element (8 at a time from a table of
// sign-byte expansions), applied to the activations:
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

// Sign bytes +-1 (0x01 / 0xFF) of the 8 elements of a group by its 7-bit packed sign index (through kIqSigns;
// by_byte: the expansion of every sign byte), built once from the format's tables.
struct SignTables {
  uint64_t by_byte[256];
  uint64_t by_index[128];
};
SignTables make_sign_tables() {
  SignTables t{};
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t.by_byte[b] |= static_cast<uint64_t>((b >> j) & 1 ? 0xFF : 0x01) << (8 * j);
  for (int k = 0; k < 128; ++k) t.by_index[k] = t.by_byte[kIqSigns[k]];
  return t;
}
const SignTables kSignTab = make_sign_tables();  // kIqSigns is constant-initialized: ready before this runs

// +-1 per byte from 4 sign bytes (little-endian in `bits`; bit j of byte l: element 8l + j negative), in vector
// registers (one broadcast, one shuffle, three logic ops: lighter on the shuffle port than 4 table inserts).
inline __m256i signs_of_bytes(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}
inline __m256i signs_of_index7(uint32_t aux) {
  const uint64_t* t = kSignTab.by_index;
  return _mm256_setr_epi64x(static_cast<long long>(t[aux & 127]), static_cast<long long>(t[(aux >> 7) & 127]),
                            static_cast<long long>(t[(aux >> 14) & 127]), static_cast<long long>(t[(aux >> 21) & 127]));
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
inline uint64_t load64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline long long ll(uint64_t v) { return static_cast<long long>(v); }
inline int ii(uint32_t v) { return static_cast<int>(v); }

// Sub-block s of one super-block: |w| (mag), the signs to apply to the activations (sgn: +-1 or w itself) and the
// int16 scales of elements 0-15 / 16-31 (sc). The index fields are read with one wide load each and split in
// registers (per-field narrow loads made the compiler round-trip them through the stack).
template <DType WT>
inline void decode(const uint8_t* blk, int s, __m256i& mag, __m256i& sgn, __m256i& sc) {
  if constexpr (WT == DType::IQ2_XXS) {
    const uint64_t v = load64(blk + 2 + 8 * s);  // 4 index bytes, then signs / scale
    const uint32_t aux = static_cast<uint32_t>(v >> 32);
    mag = _mm256_setr_epi64x(ll(kIq2xxsGrid[v & 255]), ll(kIq2xxsGrid[(v >> 8) & 255]),
                             ll(kIq2xxsGrid[(v >> 16) & 255]), ll(kIq2xxsGrid[(v >> 24) & 255]));
    sgn = signs_of_index7(aux);
    const int ls = 2 * static_cast<int>(aux >> 28) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ2_XS) {
    const uint64_t v = load64(blk + 2 + 8 * s);  // 4 u16: 9-bit index, 7-bit sign index
    const uint64_t* t = kSignTab.by_index;
    mag = _mm256_setr_epi64x(ll(kIq2xsGrid[v & 511]), ll(kIq2xsGrid[(v >> 16) & 511]),
                             ll(kIq2xsGrid[(v >> 32) & 511]), ll(kIq2xsGrid[(v >> 48) & 511]));
    sgn = _mm256_setr_epi64x(ll(t[(v >> 9) & 127]), ll(t[(v >> 25) & 127]), ll(t[(v >> 41) & 127]),
                             ll(t[(v >> 57) & 127]));
    const int sb = blk[66 + s];
    sc = scales16(2 * (sb & 0xF) + 1, 2 * (sb >> 4) + 1);
  } else if constexpr (WT == DType::IQ2_S) {
    const uint32_t q = load32(blk + 2 + 4 * s);
    const uint32_t qh = blk[66 + s];
    mag = _mm256_setr_epi64x(ll(kIq2sGrid[(q & 255) | ((qh << 8) & 0x300)]),
                             ll(kIq2sGrid[((q >> 8) & 255) | ((qh << 6) & 0x300)]),
                             ll(kIq2sGrid[((q >> 16) & 255) | ((qh << 4) & 0x300)]),
                             ll(kIq2sGrid[(q >> 24) | ((qh << 2) & 0x300)]));
    sgn = signs_of_bytes(load32(blk + 2 + 32 + 4 * s));
    const int sb = blk[74 + s];
    sc = scales16(2 * (sb & 0xF) + 1, 2 * (sb >> 4) + 1);
  } else if constexpr (WT == DType::IQ3_XXS) {
    const uint64_t q = load64(blk + 2 + 8 * s);
    const uint32_t aux = load32(blk + 2 + 64 + 4 * s);
    mag = _mm256_setr_epi32(ii(kIq3xxsGrid[q & 255]), ii(kIq3xxsGrid[(q >> 8) & 255]),
                            ii(kIq3xxsGrid[(q >> 16) & 255]), ii(kIq3xxsGrid[(q >> 24) & 255]),
                            ii(kIq3xxsGrid[(q >> 32) & 255]), ii(kIq3xxsGrid[(q >> 40) & 255]),
                            ii(kIq3xxsGrid[(q >> 48) & 255]), ii(kIq3xxsGrid[q >> 56]));
    sgn = signs_of_index7(aux);
    const int ls = 2 * static_cast<int>(aux >> 28) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ3_S) {
    const uint64_t q = load64(blk + 2 + 8 * s);
    const uint64_t qh = blk[66 + s];
    // element group k's 9th index bit is bit k of qh: spread to bit 8 of each index
    mag = _mm256_setr_epi32(ii(kIq3sGrid[(q & 255) | ((qh << 8) & 256)]),
                            ii(kIq3sGrid[((q >> 8) & 255) | ((qh << 7) & 256)]),
                            ii(kIq3sGrid[((q >> 16) & 255) | ((qh << 6) & 256)]),
                            ii(kIq3sGrid[((q >> 24) & 255) | ((qh << 5) & 256)]),
                            ii(kIq3sGrid[((q >> 32) & 255) | ((qh << 4) & 256)]),
                            ii(kIq3sGrid[((q >> 40) & 255) | ((qh << 3) & 256)]),
                            ii(kIq3sGrid[((q >> 48) & 255) | ((qh << 2) & 256)]),
                            ii(kIq3sGrid[(q >> 56) | ((qh << 1) & 256)]));
    sgn = signs_of_bytes(load32(blk + 74 + 4 * s));
    const int ls = 2 * ((blk[106 + s / 2] >> (4 * (s % 2))) & 0xF) + 1;
    sc = scales16(ls, ls);
  } else if constexpr (WT == DType::IQ1_S) {
    const uint32_t q = load32(blk + 2 + 4 * s);
    uint16_t qh16;
    std::memcpy(&qh16, blk + 34 + 2 * s, 2);
    const uint32_t qh = qh16;
    const __m256i grid = _mm256_setr_epi64x(ll(kIq1sGrid[(q & 255) | ((qh << 8) & 0x700)]),
                                            ll(kIq1sGrid[((q >> 8) & 255) | ((qh << 5) & 0x700)]),
                                            ll(kIq1sGrid[((q >> 16) & 255) | ((qh << 2) & 0x700)]),
                                            ll(kIq1sGrid[(q >> 24) | ((qh >> 1) & 0x700)]));
    const __m256i w = iq1_w(grid, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1));
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
    const int ls = 2 * ((qh >> 12) & 7) + 1;
    sc = scales16(ls, ls);
  } else {  // IQ1_M
    const uint32_t q = load32(blk + 4 * s);
    uint16_t h16;
    std::memcpy(&h16, blk + 32 + 2 * s, 2);
    const uint32_t h = h16;  // qh[2s] low byte, qh[2s + 1] high byte: a nibble per group
    const __m256i grid = _mm256_setr_epi64x(ll(kIq1sGrid[(q & 255) | ((h << 8) & 0x700)]),
                                            ll(kIq1sGrid[((q >> 8) & 255) | ((h << 4) & 0x700)]),
                                            ll(kIq1sGrid[((q >> 16) & 255) | (h & 0x700)]),
                                            ll(kIq1sGrid[(q >> 24) | ((h >> 4) & 0x700)]));
    // delta bytes: -1 where group g's sign bit (bit 4g + 3 of h) is set, else +1
    const __m256i m = _mm256_setr_epi64x(0x0008000800080008LL, 0x0080008000800080LL, 0x0800080008000800LL,
                                         static_cast<long long>(0x8000800080008000ULL));
    const __m256i neg = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(static_cast<short>(h)), m), m);
    const __m256i delta = _mm256_or_si256(neg, _mm256_set1_epi8(1));
    const __m256i w = iq1_w(grid, delta);
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
    uint16_t scw;
    std::memcpy(&scw, blk + 48 + 2 * (s / 2), 2);
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
