// Matmul kernels of the i-quant grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K in 256-bit
// vectors, compiled twice: matmul_iq_avx2.cpp (AVX2) and matmul_iq_avx512.cpp (the same with AVX-512 BW/VL, where the
// sign bits of the weights go straight into a mask register and negate the activations with one masked subtract).
// Everything here has internal linkage: each including file gets its own copy for its instruction set.
//
// Numerics: the integer form of iq_decode.h. Per sub-block of 32 the weights are decoded to int8 magnitudes |w|
// (grid bytes gathered from the tables, 8 or 4 at a time) and a +-1 per element (from the 32 sign bits), applied
// to the activations. The grid indices, sign bits and scales of a whole super-block are unpacked with vector ops
// first (Prep), so a sub-block costs its table loads and a few broadcasts:
// vpmaddubsw(|w|, sign(a, w)) gives int16 pair sums (|w| <= 62, |a| <= 127: < 2^14), vpmaddwd with the two 16-element
// scales (2 ls + 1 <= 31) widens them to int32 (vpdpwssd where there is AVX-512 VNNI: the same sums), exact over the
// super-block (iq_decode.h bounds it below 2^26); acc += (d_w * unit * d_a) * isum in f32 lanes (unit a power of two:
// exact). Same integers as matmul_ref.cpp, and the same 8 lanes in both builds, so the same results bit for bit.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "backend/cpu/iq_decode.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/simd256.h"
#include "util/fp16.h"

namespace kiln::cpu::detail {

namespace {

// +-1 per byte from 4 sign bytes (little-endian in `bits`; bit j of byte l: element 8l + j negative), in vector
// registers (one broadcast, one shuffle, three logic ops: lighter on the shuffle port than 4 table inserts).
inline __m256i signs_of_bytes(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}
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
inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// A super-block's fields decoded with vector ops once, so that a sub-block's decode is grid loads and broadcasts:
//   sc[s]: the int16 scales of sub-block s's elements 0-15 (low half) and 16-31 (high half)
//   sg[s]: its 32 sign bits, bit j: element j negative (IQ2_XXS, IQ2_XS, IQ3_XXS); IQ1_S: delta - 1 (0 or -2) in
//          byte 0
//   idx:   grid indices of the 8-element groups in order (IQ3_S: 64 4-element groups); IQ1_S uses idx32
//   dsc:   IQ1_M's delta - 1 (0 or -2) per group, 4 bytes per sub-block, each followed by its sc
struct Prep {
  alignas(32) uint32_t sc[8];
  alignas(32) uint32_t sg[8];
  alignas(32) uint16_t idx[64];
  alignas(32) uint32_t idx32[32];
  alignas(32) uint32_t dsc[16];  // IQ1_M: per sub-block its 4 delta - 1 bytes (0 or -2), then sc[s]: one load
};

// Bytes with bit 7 clear -> bit 7 set to the parity of bits 0-6 (kIqSigns; the xor folds of each byte stay in its
// low bits, what leaks in from the byte above lands in bits that are masked off).
inline __m256i with_parity(__m256i t) {
  __m256i x = _mm256_xor_si256(t, _mm256_srli_epi32(t, 4));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 2));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 1));
  return _mm256_or_si256(t, _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi8(1)), 7));
}
// 8 dwords of 4 x 7-bit sign indices (bits 0-27) -> the 4 sign bytes of each.
inline __m256i signs_of_aux(__m256i a) {
  const __m256i m7 = _mm256_set1_epi32(0x7F);
  __m256i t = _mm256_and_si256(a, m7);
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_slli_epi32(m7, 8)));
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_slli_epi32(m7, 16)));
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_slli_epi32(m7, 24)));
  return with_parity(t);
}
// (2 lo + 1) | (2 hi + 1) << 16 from dwords lo | hi << 16.
inline __m256i odd_scales(__m256i w) { return _mm256_add_epi32(_mm256_add_epi32(w, w), _mm256_set1_epi32(0x10001)); }
// The 4-bit field at bit 28 of each dword, both halves.
inline __m256i scales_of_aux(__m256i a) {
  const __m256i s = _mm256_srli_epi32(a, 28);
  return odd_scales(_mm256_or_si256(s, _mm256_slli_epi32(s, 16)));
}
// 8 scale bytes, a nibble per 16 elements.
inline __m256i scales_of_nibbles(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return odd_scales(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(15)),
                                    _mm256_and_si256(_mm256_slli_epi32(v, 12), _mm256_set1_epi32(0xF0000))));
}
inline void store(void* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }

template <DType WT>
inline void prep(const uint8_t* blk, Prep& pp) {
  if constexpr (WT == DType::IQ2_XXS || WT == DType::IQ3_XXS) {
    __m256i aux;
    if constexpr (WT == DType::IQ2_XXS) {  // 8 x (4 index bytes, aux): the aux dwords of s0 s1 s4 s5 | s2 s3 s6 s7
      const __m256 a = _mm256_castsi256_ps(loadu256(blk + 2)), b = _mm256_castsi256_ps(loadu256(blk + 34));
      aux = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8);
    } else {
      aux = loadu256(blk + 66);
    }
    store(pp.sg, signs_of_aux(aux));
    store(pp.sc, scales_of_aux(aux));
  } else if constexpr (WT == DType::IQ2_XS) {  // 32 u16: 9-bit index, 7-bit sign index
    const __m256i a = loadu256(blk + 2), b = loadu256(blk + 34), m9 = _mm256_set1_epi16(511);
    store(pp.idx, _mm256_and_si256(a, m9));
    store(pp.idx + 16, _mm256_and_si256(b, m9));
    const __m256i s = _mm256_packus_epi16(_mm256_srli_epi16(a, 9), _mm256_srli_epi16(b, 9));
    store(pp.sg, with_parity(_mm256_permute4x64_epi64(s, 0xD8)));
    store(pp.sc, scales_of_nibbles(blk + 66));
  } else if constexpr (WT == DType::IQ2_S) {  // index = qs byte | 2 bits of qh[s] (bits 2l, 2l + 1 for group l)
    const __m128i qh = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 66));
    const __m256i mul = _mm256_set1_epi64x(0x0004001000400100LL);  // 256, 64, 16, 4: qh << (8 - 2l)
    for (int h = 0; h < 2; ++h) {
      const __m128i ctrl = h == 0 ? _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                                  : _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
      const __m256i hw = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(qh, ctrl));
      const __m256i hb = _mm256_and_si256(_mm256_mullo_epi16(hw, mul), _mm256_set1_epi16(0x300));
      store(pp.idx + 16 * h, _mm256_or_si256(_mm256_cvtepu8_epi16(loadu128(blk + 2 + 16 * h)), hb));
    }
    store(pp.sc, scales_of_nibbles(blk + 74));
  } else if constexpr (WT == DType::IQ3_S) {  // 64 groups of 4: index = qs byte | bit j % 8 of qh[j / 8]
    const __m128i qh = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 66));
    const __m128i bit = _mm_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    for (int h = 0; h < 4; ++h) {
      const __m128i ctrl = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                        _mm_set1_epi8(static_cast<char>(2 * h)));
      const __m128i t = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(qh, ctrl), bit), bit);
      const __m256i hb = _mm256_and_si256(_mm256_cvtepi8_epi16(t), _mm256_set1_epi16(0x100));
      store(pp.idx + 16 * h, _mm256_or_si256(_mm256_cvtepu8_epi16(loadu128(blk + 2 + 16 * h)), hb));
    }
    // scales: a nibble per sub-block (byte s / 2, low nibble for even s), the same for both halves
    const __m128i sb = _mm_shuffle_epi8(_mm_cvtsi32_si128(ii(load32(blk + 106))),
                                        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(sb), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)),
                                       _mm256_set1_epi32(15));
    store(pp.sc, odd_scales(_mm256_or_si256(v, _mm256_slli_epi32(v, 16))));
  } else if constexpr (WT == DType::IQ1_S) {  // qh[s]: 4 x 3 index bits, 3 scale bits, the delta sign (bit 15)
    const __m256i qhd = _mm256_cvtepu16_epi32(loadu128(blk + 34));
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
    for (int p = 0; p < 4; ++p) {
      const __m256i hp = _mm256_permutevar8x32_epi32(qhd, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
                                                                            2 * p + 1, 2 * p + 1, 2 * p + 1));
      const __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(hp, sh), _mm256_set1_epi32(7)), 8);
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * p)));
      store(pp.idx32 + 8 * p, _mm256_or_si256(q, hb));
    }
    const __m256i ls = _mm256_and_si256(_mm256_srli_epi32(qhd, 12), _mm256_set1_epi32(7));
    store(pp.sc, odd_scales(_mm256_or_si256(ls, _mm256_slli_epi32(ls, 16))));
    const __m256i neg = _mm256_srai_epi32(_mm256_slli_epi32(qhd, 16), 31);
    store(pp.sg, _mm256_add_epi32(neg, neg));
  } else {  // IQ1_M: a nibble of qh per group (3 index bits, the delta sign), 3-bit scales in 4 u16 (d in the tops)
    const __m128i qh = loadu128(blk + 32), m15 = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(qh, m15), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m15);
    const __m128i n[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};  // nibble of groups 0-15, 16-31
    for (int h = 0; h < 2; ++h) {
      const __m256i hb = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(n[h], _mm_set1_epi8(7))), 8);
      store(pp.idx + 16 * h, _mm256_or_si256(_mm256_cvtepu8_epi16(loadu128(blk + 16 * h)), hb));
    }
    const __m256i nn = _mm256_setr_m128i(n[0], n[1]), m8 = _mm256_set1_epi8(8);
    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(nn, m8), m8), db = _mm256_add_epi8(neg, neg);
    // scale field j (0-15) = bits 3 (j % 4) of u16 j / 4; j = 2s (elements 0-15), 2s + 1 (16-31)
    const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x(ll(load64(blk + 48))),
                                          _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                                           4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    const __m256i f = _mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_set1_epi64x(0x0010008004002000LL)), 13);
    const __m256i sc = _mm256_add_epi16(_mm256_add_epi16(f, f), _mm256_set1_epi16(1));
    const __m256i dl = _mm256_unpacklo_epi32(db, sc), dh = _mm256_unpackhi_epi32(db, sc);  // s 0 1 4 5 | 2 3 6 7
    store(pp.dsc, _mm256_permute2x128_si256(dl, dh, 0x20));
    store(pp.dsc + 8, _mm256_permute2x128_si256(dl, dh, 0x31));
  }
}

// Table entries into one vector: 4 of 8 bytes / 8 of 4 bytes, element k from t[i[k]]. With AVX-512 each entry after
// the first is a masked broadcast straight from memory (one uop; the AVX2 inserts cost two, plus the lane merge).
template <class I>
inline __m256i entries4(const uint64_t* t, I i0, I i1, I i2, I i3) {
#if defined(__AVX512F__) && defined(__AVX512VL__)
  __m256i v = _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + i0)));
  v = _mm256_mask_set1_epi64(v, 0x2, ll(t[i1]));
  v = _mm256_mask_set1_epi64(v, 0x4, ll(t[i2]));
  return _mm256_mask_set1_epi64(v, 0x8, ll(t[i3]));
#else
  return _mm256_setr_epi64x(ll(t[i0]), ll(t[i1]), ll(t[i2]), ll(t[i3]));
#endif
}
inline __m256i entries8(const uint32_t* t, const uint32_t (&i)[8]) {
#if defined(__AVX512F__) && defined(__AVX512VL__)
  __m256i v = _mm256_castsi128_si256(_mm_cvtsi32_si128(ii(t[i[0]])));
  for (int k = 1; k < 8; ++k) v = _mm256_mask_set1_epi32(v, static_cast<__mmask8>(1u << k), ii(t[i[k]]));
  return v;
#else
  return _mm256_setr_epi32(ii(t[i[0]]), ii(t[i[1]]), ii(t[i[2]]), ii(t[i[3]]), ii(t[i[4]]), ii(t[i[5]]), ii(t[i[6]]),
                           ii(t[i[7]]));
#endif
}
// The indices themselves come 4 or 8 per load, split in registers: these loops are bound by loads more than by
// integer ops (the empty asm keeps the compiler from turning the split back into narrow loads).
inline uint64_t load64_whole(const void* p) {
  uint64_t v = load64(p);
  asm("" : "+r"(v));
  return v;
}
inline __m256i entries4_u16(const uint64_t* t, const uint16_t* ix) {
  const uint64_t v = load64_whole(ix);
  return entries4(t, v & 0xFFFF, (v >> 16) & 0xFFFF, (v >> 32) & 0xFFFF, v >> 48);
}
inline __m256i entries4_u32(const uint64_t* t, const uint32_t* ix) {
  const uint64_t a = load64_whole(ix), b = load64_whole(ix + 2);
  return entries4(t, a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32);
}
inline __m256i entries8_u8(const uint32_t* t, const uint8_t* ix) {
  const uint64_t v = load64_whole(ix);
  uint32_t i[8];
  for (int k = 0; k < 8; ++k) i[k] = static_cast<uint32_t>((v >> (8 * k)) & 255);
  return entries8(t, i);
}
inline __m256i entries8_u16(const uint32_t* t, const uint16_t* ix) {
  const uint64_t a = load64_whole(ix), b = load64_whole(ix + 4);
  uint32_t i[8];
  for (int k = 0; k < 4; ++k) {
    i[k] = static_cast<uint32_t>((a >> (16 * k)) & 0xFFFF);
    i[k + 4] = static_cast<uint32_t>((b >> (16 * k)) & 0xFFFF);
  }
  return entries8(t, i);
}

// The types whose signs come as 32 bits per sub-block (the IQ1 types carry them in w itself).
template <DType WT>
constexpr bool kBitSigns = WT != DType::IQ1_S && WT != DType::IQ1_M;

// Sub-block s of one super-block: |w| (mag), the signs to apply to the activations (bits: bit j negates element j,
// kBitSigns types; else sgn = w itself) and the int16 scales of elements 0-15 / 16-31 (sc).
template <DType WT>
inline void decode(const uint8_t* blk, const Prep& pp, int s, __m256i& mag, __m256i& sgn, uint32_t& bits,
                   __m256i& sc) {
  const __m256i lohi = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  if constexpr (WT != DType::IQ1_M) sc = _mm256_shuffle_epi8(_mm256_set1_epi32(ii(pp.sc[s])), lohi);
  const uint16_t* ix = pp.idx + 4 * s;
  if constexpr (WT == DType::IQ2_XXS) {
    const uint32_t v = load32(blk + 2 + 8 * s);
    mag = entries4(kIq2xxsGrid, v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24);
    bits = pp.sg[s];
  } else if constexpr (WT == DType::IQ2_XS) {
    mag = entries4_u16(kIq2xsGrid, ix);
    bits = pp.sg[s];
  } else if constexpr (WT == DType::IQ2_S) {
    mag = entries4_u16(kIq2sGrid, ix);
    bits = load32(blk + 2 + 32 + 4 * s);
  } else if constexpr (WT == DType::IQ3_XXS) {
    mag = entries8_u8(kIq3xxsGrid, blk + 2 + 8 * s);
    bits = pp.sg[s];
  } else if constexpr (WT == DType::IQ3_S) {
    mag = entries8_u16(kIq3sGrid, pp.idx + 8 * s);
    bits = load32(blk + 74 + 4 * s);
  } else if constexpr (WT == DType::IQ1_S) {
    const uint64_t* t = kIq1sGrid8p1.data();  // w = t + (delta - 1)
    const __m256i w = _mm256_add_epi8(entries4_u32(t, pp.idx32 + 4 * s),
                                      _mm256_set1_epi8(static_cast<char>(pp.sg[s])));
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
  } else {  // IQ1_M
    const uint64_t* t = kIq1sGrid8p1.data();  // w = t + (delta - 1)
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i ds = _mm256_set1_epi64x(ll(load64(pp.dsc + 2 * s)));
    sc = _mm256_shuffle_epi8(ds, _mm256_add_epi8(lohi, _mm256_set1_epi8(4)));
    const __m256i w = _mm256_add_epi8(entries4_u16(t, ix), _mm256_shuffle_epi8(ds, spread));
    mag = _mm256_sign_epi8(w, w);
    sgn = w;
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
    // Super-block b + 1 is unpacked (Prep) before b is multiplied, so that its stores have long retired when its
    // sub-blocks load the fields back.
    const int64_t nb = j.n_in / QK_K;
    Prep pps[2][R];
    for (int r = 0; r < R; ++r) prep<WT>(w[r], pps[0][r]);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk[R];
      for (int r = 0; r < R; ++r) {
        blk[r] = w[r] + b * kBytes;
        prefetch_weights(blk[r], (kBytes + 63) / 64);
      }
      if (b + 1 < nb)
        for (int r = 0; r < R; ++r) prep<WT>(blk[r] + kBytes, pps[(b + 1) & 1][r]);
      const Prep* pp = pps[b & 1];
      // The sub-blocks read pp back from memory (one load per field): kept in registers instead, each index would
      // be extracted with a 2-uop vpextrd.
      asm volatile("" : : "r"(pp) : "memory");
      __m256i isum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
      for (int s = 0; s < 8; ++s) {
        __m256i mag[R], sgn[R], sc[R];
        uint32_t bits[R];
        for (int r = 0; r < R; ++r) decode<WT>(blk[r], pp[r], s, mag[r], sgn[r], bits[r], sc[r]);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        __mmask32 neg[R];
        if constexpr (kBitSigns<WT>)
          for (int r = 0; r < R; ++r) neg[r] = _cvtu32_mask32(bits[r]);
#else
        if constexpr (kBitSigns<WT>)
          for (int r = 0; r < R; ++r) sgn[r] = signs_of_bytes(bits[r]);
#endif
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + b * QK_K + 32 * s));
          for (int r = 0; r < R; ++r) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            const __m256i xs = kBitSigns<WT> ? _mm256_mask_sub_epi8(xv, neg[r], _mm256_setzero_si256(), xv)
                                             : _mm256_sign_epi8(xv, sgn[r]);
#else
            const __m256i xs = _mm256_sign_epi8(xv, sgn[r]);
#endif
            const __m256i p = _mm256_maddubs_epi16(mag[r], xs);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            isum[r][c] = _mm256_dpwssd_epi32(isum[r][c], p, sc[r]);  // the vpmaddwd + add below in one
#else
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(p, sc[r]));
#endif
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
      for (int c = 0; c < C; ++c) j.y[(t + c) * j.y_stride + o + r] = hsum256(acc[r][c]);
  }
};

template <DType WT>
void gemm_type(const GemmJob& j, int64_t o0, int64_t o1) {
  if (j.n_tok == 1) drive_tiles<1, 1, IqGridKern<WT>>(j, o0, o1);  // GEMV: one sequential weight stream
  else drive_tiles<2, 4, IqGridKern<WT>>(j, o0, o1);
}

inline void gemm_iq_grid(const GemmJob& j, int64_t o0, int64_t o1) {
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

}  // namespace

}  // namespace kiln::cpu::detail
