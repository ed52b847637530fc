// Device-side decoding of the GGUF weight blocks (layouts: quant/blocks.h; the executable specs are
// quant/dequant_*.cpp). One function per type decodes one sub-block of 32 elements into
//   q[8]     32 int8 quants packed 4 per int, in element order (signed where the type has an implicit offset:
//            Q4_0 q-8, Q5_0 q-16, Q3_K q-4.., Q6_K q-32, so that every value is  d[h] * q + m[h])
//   d[2] m[2] the affine scale and offset of elements 0..15 (h = 0) and 16..31 (h = 1): one pair per 32 for the
//            types with 32-element scales, two for Q2_K, Q3_K and Q6_K (16-element scales)
// The same decode feeds get_rows (value = d*q + m, the CPU's f32 operations: dl*q - ml), the integer GEMV (mmvq:
// d * d_a * sum(q*q_a) + m * d_a * sum(q_a)) and the tiled GEMM (dequantized to shared memory), so the three agree
// on what a block means. Alignment assumed of a block start: Q4_K/Q5_K 16 bytes (144/176-byte blocks in rows that
// start 16-aligned), Q4_1/Q5_1/Q2_K/IQ4_XS 4, MXFP4 none (17-byte blocks: byte loads), the others (TQ1_0's 54- and
// TQ2_0's 66-byte blocks included) 2.
// The codebook types (IQ4_NL, IQ4_XS: kIq4nlValues; MXFP4: kMxfp4Values, the doubled FP4 values with half the
// E8M0 scale as d) decode to their int8 codebook values, so every path sees them as d * q with m = 0; the ternary
// types (TQ1_0, TQ2_0) to their trits minus one (-1..1; TQ2_0's unused code 3 to 2, as the reference); the i-quant
// grid types to their signed grid values (their decode32 and device tables are in quant_iq.cuh, included only by
// the files that instantiate them: gemm.cu, gemm_blas.cu, getrows.cu and their mmvq instances).
#pragma once

#include <type_traits>

#include "backend/cuda/common.cuh"
#include "quant/blocks.h"
#include "quant/dtype.h"

namespace kiln::cuda {

template <DType T> struct QTraits;
template <> struct QTraits<DType::Q4_0> { static constexpr int kElems = 32, kBytes = 18; };
template <> struct QTraits<DType::Q4_1> { static constexpr int kElems = 32, kBytes = 20; };
template <> struct QTraits<DType::Q5_0> { static constexpr int kElems = 32, kBytes = 22; };
template <> struct QTraits<DType::Q5_1> { static constexpr int kElems = 32, kBytes = 24; };
template <> struct QTraits<DType::Q8_0> { static constexpr int kElems = 32, kBytes = 34; };
template <> struct QTraits<DType::Q2_K> { static constexpr int kElems = 256, kBytes = 84; };
template <> struct QTraits<DType::Q3_K> { static constexpr int kElems = 256, kBytes = 110; };
template <> struct QTraits<DType::Q4_K> { static constexpr int kElems = 256, kBytes = 144; };
template <> struct QTraits<DType::Q5_K> { static constexpr int kElems = 256, kBytes = 176; };
template <> struct QTraits<DType::Q6_K> { static constexpr int kElems = 256, kBytes = 210; };
template <> struct QTraits<DType::IQ4_NL> { static constexpr int kElems = 32, kBytes = 18; };
template <> struct QTraits<DType::IQ4_XS> { static constexpr int kElems = 256, kBytes = 136; };
template <> struct QTraits<DType::MXFP4> { static constexpr int kElems = 32, kBytes = 17; };
template <> struct QTraits<DType::TQ1_0> { static constexpr int kElems = 256, kBytes = 54; };
template <> struct QTraits<DType::TQ2_0> { static constexpr int kElems = 256, kBytes = 66; };
template <> struct QTraits<DType::IQ2_XXS> { static constexpr int kElems = 256, kBytes = 66; };
template <> struct QTraits<DType::IQ2_XS> { static constexpr int kElems = 256, kBytes = 74; };
template <> struct QTraits<DType::IQ2_S> { static constexpr int kElems = 256, kBytes = 82; };
template <> struct QTraits<DType::IQ3_XXS> { static constexpr int kElems = 256, kBytes = 98; };
template <> struct QTraits<DType::IQ3_S> { static constexpr int kElems = 256, kBytes = 110; };
template <> struct QTraits<DType::IQ1_S> { static constexpr int kElems = 256, kBytes = 50; };
template <> struct QTraits<DType::IQ1_M> { static constexpr int kElems = 256, kBytes = 56; };

// 4 bits b0..b3 -> bit 4 of bytes 0..3 (the 5th bit of Q5 quants).
__device__ __forceinline__ uint32_t spread4_bit4(uint32_t b) {
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// q4_K / q5_K 6-bit scale and min of sub-block j (blocks.h kquant_scale_min), from the 12 scale bytes as three
// little-endian words (shifts only: no local-memory byte array).
__device__ __forceinline__ void kq_scale_min(int j, uint32_t w0, uint32_t w1, uint32_t w2, int* sc, int* m) {
  const int sh = 8 * (j & 3);
  const int b0 = (w0 >> sh) & 0xFF, b1 = (w1 >> sh) & 0xFF, b2 = (w2 >> sh) & 0xFF;
  if (j < 4) {
    *sc = b0 & 63;
    *m = b1 & 63;
  } else {
    *sc = (b2 & 0xF) | ((b0 >> 6) << 4);
    *m = (b2 >> 4) | ((b1 >> 6) << 4);
  }
}

// A 16-entry int8 codebook as four little-endian words (entries 4w..4w+3 in word w), built at compile time.
struct Book16 {
  uint32_t w[4];
};
__host__ __device__ constexpr Book16 make_book16(const int8_t (&v)[16]) {
  Book16 b{};
  for (int i = 0; i < 16; ++i) b.w[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(v[i])) << (8 * (i % 4));
  return b;
}

// Four indices (one per byte of idx, each 0..15) -> their four codebook bytes, packed the same way. __byte_perm
// picks bytes out of an 8-byte pair by 3-bit selectors: the low 3 bits of each index select within words {0, 1}
// and within {2, 3}, then bit 3 selects between the two picks.
__device__ __forceinline__ uint32_t book_lookup4(uint32_t idx, const Book16& t) {
  const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(t.w[0], t.w[1], sel);
  const uint32_t hi = __byte_perm(t.w[2], t.w[3], sel);
  const uint32_t h = (idx >> 1) & 0x04040404u;  // bit 3 of each index, moved to bit 2 of its byte
  const uint32_t hsel = (h & 0x4u) | ((h >> 4) & 0x40u) | ((h >> 8) & 0x400u) | ((h >> 12) & 0x4000u);
  return __byte_perm(lo, hi, 0x3210u | hsel);  // byte n: lo's n, or hi's (selector 4 + n) where the bit is set
}

// 32 nibble indices of an IQ4_NL-style block (element j: low nibble of byte j, element j+16: high nibble) from
// the 16 index bytes as four words, into q[8] as codebook values.
__device__ __forceinline__ void book_decode32(const uint32_t (&w)[4], const Book16& t, int (&q)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = static_cast<int>(book_lookup4(w[i] & 0x0F0F0F0Fu, t));
    q[i + 4] = static_cast<int>(book_lookup4((w[i] >> 4) & 0x0F0F0F0Fu, t));
  }
}

template <DType T>
__device__ __forceinline__ void decode32(const uint8_t* b, int s, int (&q)[8], float (&d)[2], float (&m)[2]);

template <>
__device__ __forceinline__ void decode32<DType::Q4_0>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const float dd = h2f(ld_u16(b));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld_u32_a2(b + 2 + 4 * i);
    q[i] = static_cast<int>(__vsub4(w & 0x0F0F0F0Fu, 0x08080808u));
    q[i + 4] = static_cast<int>(__vsub4((w >> 4) & 0x0F0F0F0Fu, 0x08080808u));
  }
  d[0] = d[1] = dd;
  m[0] = m[1] = 0.0f;
}

template <>
__device__ __forceinline__ void decode32<DType::Q4_1>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const uint32_t dm = ld_u32_a4(b);
  const float dd = h2f(static_cast<uint16_t>(dm)), mm = h2f(static_cast<uint16_t>(dm >> 16));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld_u32_a4(b + 4 + 4 * i);
    q[i] = static_cast<int>(w & 0x0F0F0F0Fu);
    q[i + 4] = static_cast<int>((w >> 4) & 0x0F0F0F0Fu);
  }
  d[0] = d[1] = dd;
  m[0] = m[1] = mm;
}

template <>
__device__ __forceinline__ void decode32<DType::Q5_0>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const float dd = h2f(ld_u16(b));
  const uint32_t qh = ld_u32_a2(b + 2);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld_u32_a2(b + 6 + 4 * i);
    const uint32_t lo = (w & 0x0F0F0F0Fu) | spread4_bit4((qh >> (4 * i)) & 0xF);
    const uint32_t hi = ((w >> 4) & 0x0F0F0F0Fu) | spread4_bit4((qh >> (16 + 4 * i)) & 0xF);
    q[i] = static_cast<int>(__vsub4(lo, 0x10101010u));
    q[i + 4] = static_cast<int>(__vsub4(hi, 0x10101010u));
  }
  d[0] = d[1] = dd;
  m[0] = m[1] = 0.0f;
}

template <>
__device__ __forceinline__ void decode32<DType::Q5_1>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const uint32_t dm = ld_u32_a4(b);
  const float dd = h2f(static_cast<uint16_t>(dm)), mm = h2f(static_cast<uint16_t>(dm >> 16));
  const uint32_t qh = ld_u32_a4(b + 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld_u32_a4(b + 8 + 4 * i);
    q[i] = static_cast<int>((w & 0x0F0F0F0Fu) | spread4_bit4((qh >> (4 * i)) & 0xF));
    q[i + 4] = static_cast<int>(((w >> 4) & 0x0F0F0F0Fu) | spread4_bit4((qh >> (16 + 4 * i)) & 0xF));
  }
  d[0] = d[1] = dd;
  m[0] = m[1] = mm;
}

template <>
__device__ __forceinline__ void decode32<DType::Q8_0>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const float dd = h2f(ld_u16(b));
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(ld_u32_a2(b + 2 + 4 * i));
  d[0] = d[1] = dd;
  m[0] = m[1] = 0.0f;
}

// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82. Sub-block s = half h = s/4, shift k = s%4.
template <>
__device__ __forceinline__ void decode32<DType::Q2_K>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const int h = s >> 2, k = s & 3;
  const uint32_t dm = ld_u32_a4(b + 80);
  const float dd = h2f(static_cast<uint16_t>(dm)), dmin = h2f(static_cast<uint16_t>(dm >> 16));
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = static_cast<int>((ld_u32_a4(b + 16 + 32 * h + 4 * i) >> (2 * k)) & 0x03030303u);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int sc = b[2 * s + hf];
    d[hf] = dd * static_cast<float>(sc & 0xF);
    m[hf] = -(dmin * static_cast<float>(sc >> 4));
  }
}

// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108.
template <>
__device__ __forceinline__ void decode32<DType::Q3_K>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const int h = s >> 2, k = s & 3;
  const float dd = h2f(ld_u16(b + 108));
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (ld_u32_a2(b + 32 + 32 * h + 4 * i) >> (2 * k)) & 0x03030303u;
    const uint32_t hb = (ld_u32_a2(b + 4 * i) >> (4 * h + k)) & 0x01010101u;
    q[i] = static_cast<int>(__vsub4(lo, (hb ^ 0x01010101u) << 2));
  }
  const uint8_t* sc = b + 96;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int j = 2 * s + hf;
    const int lo4 = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
    const int hi2 = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    d[hf] = dd * static_cast<float>((lo4 | (hi2 << 4)) - 32);
    m[hf] = 0.0f;
  }
}

// Q4_K: d, dmin @0, scales[12] @4, qs[128] @16 (16-byte aligned).
template <>
__device__ __forceinline__ void decode32<DType::Q4_K>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const uint4 hdr = *reinterpret_cast<const uint4*>(b);
  const uint4 w0 = *reinterpret_cast<const uint4*>(b + 16 + 32 * (s >> 1));
  const uint4 w1 = *reinterpret_cast<const uint4*>(b + 32 + 32 * (s >> 1));
  const int sh = 4 * (s & 1);
  const uint32_t ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = static_cast<int>((ws[i] >> sh) & 0x0F0F0F0Fu);
  int sc, mn;
  kq_scale_min(s, hdr.y, hdr.z, hdr.w, &sc, &mn);
  const float dd = h2f(static_cast<uint16_t>(hdr.x)), dmin = h2f(static_cast<uint16_t>(hdr.x >> 16));
  d[0] = d[1] = dd * static_cast<float>(sc);
  m[0] = m[1] = -(dmin * static_cast<float>(mn));
}

// Q5_K: d, dmin @0, scales[12] @4, qh[32] @16, qs[128] @48 (16-byte aligned).
template <>
__device__ __forceinline__ void decode32<DType::Q5_K>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const uint4 hdr = *reinterpret_cast<const uint4*>(b);
  const uint4 h0 = *reinterpret_cast<const uint4*>(b + 16);
  const uint4 h1 = *reinterpret_cast<const uint4*>(b + 32);
  const uint4 w0 = *reinterpret_cast<const uint4*>(b + 48 + 32 * (s >> 1));
  const uint4 w1 = *reinterpret_cast<const uint4*>(b + 64 + 32 * (s >> 1));
  const int sh = 4 * (s & 1);
  const uint32_t ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  const uint32_t hs[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    q[i] = static_cast<int>(((ws[i] >> sh) & 0x0F0F0F0Fu) | (((hs[i] >> s) & 0x01010101u) << 4));
  int sc, mn;
  kq_scale_min(s, hdr.y, hdr.z, hdr.w, &sc, &mn);
  const float dd = h2f(static_cast<uint16_t>(hdr.x)), dmin = h2f(static_cast<uint16_t>(hdr.x >> 16));
  d[0] = d[1] = dd * static_cast<float>(sc);
  m[0] = m[1] = -(dmin * static_cast<float>(mn));
}

// Q6_K: ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208 (2-byte aligned).
template <>
__device__ __forceinline__ void decode32<DType::Q6_K>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                      float (&m)[2]) {
  const int h = s >> 2, k = s & 3;
  const uint8_t* ql = b + 64 * h + 32 * (k & 1);
  const uint8_t* qh = b + 128 + 32 * h;
  const int lsh = 4 * (k >> 1);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (ld_u32_a2(ql + 4 * i) >> lsh) & 0x0F0F0F0Fu;
    const uint32_t hi = ((ld_u32_a2(qh + 4 * i) >> (2 * k)) & 0x03030303u) << 4;
    q[i] = static_cast<int>(__vsub4(lo | hi, 0x20202020u));
  }
  const float dd = h2f(ld_u16(b + 208));
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  d[0] = dd * static_cast<float>(sc[2 * s]);
  d[1] = dd * static_cast<float>(sc[2 * s + 1]);
  m[0] = m[1] = 0.0f;
}

// IQ4_NL: d @0, qs[16] @2 (2-byte aligned).
template <>
__device__ __forceinline__ void decode32<DType::IQ4_NL>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                        float (&m)[2]) {
  constexpr Book16 kBook = make_book16(kIq4nlValues);
  const uint32_t w[4] = {ld_u32_a2(b + 2), ld_u32_a2(b + 6), ld_u32_a2(b + 10), ld_u32_a2(b + 14)};
  book_decode32(w, kBook, q);
  d[0] = d[1] = h2f(ld_u16(b));
  m[0] = m[1] = 0.0f;
}

// IQ4_XS: d @0, scales_h @2, scales_l[4] @4, qs[128] @8 (4-byte aligned); sub-block s: qs[16s..16s+15] as one
// IQ4_NL block, scale d * (ls - 32) (quant/blocks.h).
template <>
__device__ __forceinline__ void decode32<DType::IQ4_XS>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                        float (&m)[2]) {
  constexpr Book16 kBook = make_book16(kIq4nlValues);
  const uint32_t hdr = ld_u32_a4(b), sl = ld_u32_a4(b + 4);
  const uint8_t* qs = b + 8 + 16 * s;
  const uint32_t w[4] = {ld_u32_a4(qs), ld_u32_a4(qs + 4), ld_u32_a4(qs + 8), ld_u32_a4(qs + 12)};
  book_decode32(w, kBook, q);
  const int ls = static_cast<int>(((sl >> (4 * s)) & 0xFu) | (((hdr >> (16 + 2 * s)) & 3u) << 4));
  d[0] = d[1] = h2f(static_cast<uint16_t>(hdr)) * static_cast<float>(ls - 32);
  m[0] = m[1] = 0.0f;
}

// MXFP4: E8M0 e @0, qs[16] @1 (17-byte blocks: byte loads). d = 2^(e-128), the half scale of the doubled codes.
template <>
__device__ __forceinline__ void decode32<DType::MXFP4>(const uint8_t* b, int, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  constexpr Book16 kBook = make_book16(kMxfp4Values);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* p = b + 1 + 4 * i;
    w[i] = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
  }
  book_decode32(w, kBook, q);
  const uint32_t e = b[0];
  d[0] = d[1] = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));  // e8m0_half_to_f32 (blocks.h)
  m[0] = m[1] = 0.0f;
}

// TQ2_0: qs[64] @0, d @64 (2-byte aligned). Sub-block s = elements 128j + 32l + m (j = s / 4, l = s % 4,
// m = 0..31): bits 2l..2l+1 of qs[32j + m]; value d * (c - 1).
template <>
__device__ __forceinline__ void decode32<DType::TQ2_0>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  const uint8_t* qs = b + 32 * (s >> 2);
  const int sh = 2 * (s & 3);
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(__vsub4((ld_u32_a2(qs + 4 * i) >> sh) & 0x03030303u, 0x01010101u));
  d[0] = d[1] = h2f(ld_u16(b + 64));
  m[0] = m[1] = 0.0f;
}

__device__ __forceinline__ uint32_t tq1_pow3(int n) { return n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u; }

// Trit n of each byte of w (blocks.h tq1_trit: ((uint8_t)(byte * 3^n) * 3) >> 8), minus 1, as packed int8.
__device__ __forceinline__ uint32_t tq1_trits4(uint32_t w, uint32_t pow3) {
  uint32_t r = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t t = ((((w >> (8 * k)) & 0xFFu) * pow3 & 0xFFu) * 3u) >> 8;
    r |= t << (8 * k);
  }
  return __vsub4(r, 0x01010101u);
}

// TQ1_0: qs[48] @0, qh[4] @48, d @52 (2-byte aligned); element order in blocks.h. Sub-blocks 0..4: trit s of
// qs[0..31]; 5, 6: trits 2(s-5) and 2(s-5)+1 of qs[32..47] (16 elements each); 7: trit 4 of qs[32..47], then
// trits 0..3 of qh[0..3] (elements 240 + 4n + j).
template <>
__device__ __forceinline__ void decode32<DType::TQ1_0>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  if (s < 5) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(tq1_trits4(ld_u32_a2(b + 4 * i), tq1_pow3(s)));
  } else {
    const int n0 = 2 * (s - 5);  // s = 7: trit 4 of qs[32..47], then qh
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = static_cast<int>(tq1_trits4(ld_u32_a2(b + 32 + 4 * i), tq1_pow3(n0)));
    if (s < 7) {
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i + 4] = static_cast<int>(tq1_trits4(ld_u32_a2(b + 32 + 4 * i), tq1_pow3(n0 + 1)));
    } else {
      const uint32_t qh = ld_u32_a2(b + 48);
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i + 4] = static_cast<int>(tq1_trits4(qh, tq1_pow3(i)));
    }
  }
  d[0] = d[1] = h2f(ld_u16(b + 52));
  m[0] = m[1] = 0.0f;
}

// Sub-block `s` (32 elements from element 32*s) of a quantized row, as f32 (value = d*q + m, as the reference
// dequantizers compute it).
template <DType T>
__device__ __forceinline__ void dequant32(const uint8_t* row, int s, float (&out)[32]) {
  constexpr int kSubs = QTraits<T>::kElems / 32;
  int q[8];
  float d[2], m[2];
  decode32<T>(row + static_cast<size_t>(s / kSubs) * QTraits<T>::kBytes, s % kSubs, q, d, m);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int hf = i >> 2;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int v = static_cast<int8_t>(static_cast<uint32_t>(q[i]) >> (8 * j));
      out[4 * i + j] = m[hf] == 0.0f ? d[hf] * static_cast<float>(v) : fmaf(d[hf], static_cast<float>(v), m[hf]);
    }
  }
}

// The one list of the types whose blocks decode32 reads (the q8_1 kernels: mmvq, the experts' GEMV, gemm's quantized
// weights): f(std::integral_constant<DType, T>{}) for t, or kUnsupported naming `what` for any other type. The
// i-quant grid types' decode32 is in quant_iq.cuh, which a caller instantiating them includes.
template <class F>
Status dispatch_decode32_type(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::Q4_0: return f(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q4_1: return f(std::integral_constant<DType, DType::Q4_1>{});
    case DType::Q5_0: return f(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1: return f(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q8_0: return f(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q2_K: return f(std::integral_constant<DType, DType::Q2_K>{});
    case DType::Q3_K: return f(std::integral_constant<DType, DType::Q3_K>{});
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K: return f(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q6_K: return f(std::integral_constant<DType, DType::Q6_K>{});
    case DType::IQ4_NL: return f(std::integral_constant<DType, DType::IQ4_NL>{});
    case DType::IQ4_XS: return f(std::integral_constant<DType, DType::IQ4_XS>{});
    case DType::MXFP4: return f(std::integral_constant<DType, DType::MXFP4>{});
    case DType::TQ1_0: return f(std::integral_constant<DType, DType::TQ1_0>{});
    case DType::TQ2_0: return f(std::integral_constant<DType, DType::TQ2_0>{});
    case DType::IQ2_XXS: return f(std::integral_constant<DType, DType::IQ2_XXS>{});
    case DType::IQ2_XS: return f(std::integral_constant<DType, DType::IQ2_XS>{});
    case DType::IQ2_S: return f(std::integral_constant<DType, DType::IQ2_S>{});
    case DType::IQ3_XXS: return f(std::integral_constant<DType, DType::IQ3_XXS>{});
    case DType::IQ3_S: return f(std::integral_constant<DType, DType::IQ3_S>{});
    case DType::IQ1_S: return f(std::integral_constant<DType, DType::IQ1_S>{});
    case DType::IQ1_M: return f(std::integral_constant<DType, DType::IQ1_M>{});
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "%s: weight type %s", what, dtype_name(t));
}

}  // namespace kiln::cuda
