// Device decoding of the i-quant grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) into the shared
// decode32 form of quant.cuh: q[8] = 32 int8 values of sub-block s in element order, d[2] the scale of elements 0..15
// and 16..31, m = 0. Layouts: quant/blocks.h; executable specs: quant/dequant_iquants.cpp; grids: iq_grids.cuh.
//   IQ2 / IQ3: q = grid magnitude (8..62) with the group's sign, d = the sub-block scale computed with the spec's
//              f32 operations in its order, so d * q is the spec's value bit for bit.
//   IQ1:       the spec's value is dl * (g + delta) with g in {-1, 0, 1} and delta = +-1/8 per group of 8: here
//              q = 8 g + 8 delta (-9..9) and d = dl / 8 (exact: a power of two), so d * q = dl * (g + delta) with
//              the same single rounding.
// Blocks are 2-byte aligned (50..110-byte blocks): 16-bit loads, or ld_u32_a2.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/iq_grids.cuh"
#include "backend/cuda/quant.cuh"

namespace kiln::cuda {

// Byte j of the result: byte j of v negated where bit j of `neg` is set (4 bytes, wrap-around int8 arithmetic).
__device__ __forceinline__ uint32_t iq_sign4(uint32_t v, uint32_t neg) {
  const uint32_t m = ((neg & 1u) * 0xFFu) | (((neg >> 1) & 1u) * 0xFF00u) | (((neg >> 2) & 1u) * 0xFF0000u) |
                     (((neg >> 3) & 1u) * 0xFF000000u);
  return __vsub4(v ^ m, m);
}

// A group of 8 from a 64-bit grid entry and 8 sign bits, into q[2l], q[2l + 1].
__device__ __forceinline__ void iq_group8(uint64_t g, uint32_t signs, int (&q)[8], int l) {
  q[2 * l] = static_cast<int>(iq_sign4(static_cast<uint32_t>(g), signs & 0xF));
  q[2 * l + 1] = static_cast<int>(iq_sign4(static_cast<uint32_t>(g >> 32), (signs >> 4) & 0xF));
}

// IQ1: 8 grid bytes (int8 -1/0/1) as 8 g + delta8 (delta8 = +-1) in q[2l], q[2l + 1].
__device__ __forceinline__ void iq1_group8(uint64_t g, int delta8, int (&q)[8], int l) {
  const uint32_t dd = static_cast<uint32_t>(delta8 & 0xFF) * 0x01010101u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t w = static_cast<uint32_t>(g >> (32 * h));  // bytes 0xFF, 0x00, 0x01
    // 8 g per byte (0xF8, 0, 8): the shift carries 0xFF's top bits into bits 0-2 of the next byte; the mask drops them
    q[2 * l + h] = static_cast<int>(__vadd4((w << 3) & 0xF8F8F8F8u, dd));
  }
}

__device__ __forceinline__ uint32_t ld_u16v(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// IQ2_XXS (66 bytes): d @0, then per sub-block 8 bytes @2 + 8s: 4 grid indices, a u32 of 4 sign indices + ls.
template <>
__device__ __forceinline__ void decode32<DType::IQ2_XXS>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                         float (&m)[2]) {
  const uint8_t* p = b + 2 + 8 * s;
  const uint32_t idx = ld_u32_a2(p), aux = ld_u32_a2(p + 4);
#pragma unroll
  for (int l = 0; l < 4; ++l) iq_group8(kDevIq2xxsGrid[(idx >> (8 * l)) & 0xFF], kDevIqSigns[(aux >> (7 * l)) & 127], q, l);
  d[0] = d[1] = h2f(ld_u16(b)) * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
  m[0] = m[1] = 0.0f;
}

// IQ2_XS (74 bytes): d @0, qs[32] u16 @2 (9-bit grid index | 7-bit sign index << 9), scales[8] @66.
template <>
__device__ __forceinline__ void decode32<DType::IQ2_XS>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                        float (&m)[2]) {
  const uint8_t* p = b + 2 + 8 * s;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t v = ld_u16v(p + 2 * l);
    iq_group8(kDevIq2xsGrid[v & 511], kDevIqSigns[v >> 9], q, l);
  }
  const float dd = h2f(ld_u16(b));
  const uint32_t sc = b[66 + s];
  d[0] = dd * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f;
  d[1] = dd * (0.5f + static_cast<float>(sc >> 4)) * 0.25f;
  m[0] = m[1] = 0.0f;
}

// IQ2_S (82 bytes): d @0, qs[64] @2 (32 index bytes, 32 sign bytes), qh[8] @66, scales[8] @74.
template <>
__device__ __forceinline__ void decode32<DType::IQ2_S>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  const uint32_t idx = ld_u32_a2(b + 2 + 4 * s), sg = ld_u32_a2(b + 34 + 4 * s), qh = b[66 + s];
#pragma unroll
  for (int l = 0; l < 4; ++l)
    iq_group8(kDevIq2sGrid[((idx >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3) << 8)], (sg >> (8 * l)) & 0xFF, q, l);
  const float dd = h2f(ld_u16(b));
  const uint32_t sc = b[74 + s];
  d[0] = dd * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f;
  d[1] = dd * (0.5f + static_cast<float>(sc >> 4)) * 0.25f;
  m[0] = m[1] = 0.0f;
}

// IQ3_XXS (98 bytes): d @0, qs[64] @2 (8 grid indices of 4 elements per sub-block), a u32 per sub-block @66 + 4s
// (4 sign indices + ls).
template <>
__device__ __forceinline__ void decode32<DType::IQ3_XXS>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                         float (&m)[2]) {
  const uint8_t* p = b + 2 + 8 * s;
  const uint32_t i0 = ld_u32_a2(p), i1 = ld_u32_a2(p + 4), aux = ld_u32_a2(b + 66 + 4 * s);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t w = l < 2 ? i0 : i1, sh = 16 * (l & 1);
    const uint64_t g = static_cast<uint64_t>(kDevIq3xxsGrid[(w >> sh) & 0xFF]) |
                       (static_cast<uint64_t>(kDevIq3xxsGrid[(w >> (sh + 8)) & 0xFF]) << 32);
    iq_group8(g, kDevIqSigns[(aux >> (7 * l)) & 127], q, l);
  }
  d[0] = d[1] = h2f(ld_u16(b)) * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
  m[0] = m[1] = 0.0f;
}

// IQ3_S (110 bytes): d @0, qs[64] @2, qh[8] @66, signs[32] @74, scales[4] @106.
template <>
__device__ __forceinline__ void decode32<DType::IQ3_S>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  const uint8_t* p = b + 2 + 8 * s;
  const uint32_t i0 = ld_u32_a2(p), i1 = ld_u32_a2(p + 4), qh = b[66 + s], sg = ld_u32_a2(b + 74 + 4 * s);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t w = l < 2 ? i0 : i1, sh = 16 * (l & 1);
    const uint32_t a = ((w >> sh) & 0xFF) | (((qh >> (2 * l)) & 1) << 8);
    const uint32_t c = ((w >> (sh + 8)) & 0xFF) | (((qh >> (2 * l + 1)) & 1) << 8);
    const uint64_t g = static_cast<uint64_t>(kDevIq3sGrid[a]) | (static_cast<uint64_t>(kDevIq3sGrid[c]) << 32);
    iq_group8(g, (sg >> (8 * l)) & 0xFF, q, l);
  }
  d[0] = d[1] = h2f(ld_u16(b)) * static_cast<float>(1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 0xF));
  m[0] = m[1] = 0.0f;
}

// IQ1_S (50 bytes): d @0, qs[32] @2, qh[8] u16 @34 (3 index bits per group, ls at bits 12-14, delta sign bit 15).
template <>
__device__ __forceinline__ void decode32<DType::IQ1_S>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  const uint32_t idx = ld_u32_a2(b + 2 + 4 * s), qh = ld_u16v(b + 34 + 2 * s);
  const int delta8 = qh & 0x8000u ? -1 : 1;
#pragma unroll
  for (int l = 0; l < 4; ++l) iq1_group8(kDevIq1sGrid[((idx >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8)], delta8, q, l);
  d[0] = d[1] = h2f(ld_u16(b)) * static_cast<float>(2 * ((qh >> 12) & 7) + 1) * 0.125f;
  m[0] = m[1] = 0.0f;
}

// IQ1_M (56 bytes): qs[32] @0, qh[16] @32 (a nibble per group: 3 index bits, delta sign bit 3), scales[8] @48 (4
// u16: 3-bit scales per 16 elements, the f16 d in their top nibbles).
template <>
__device__ __forceinline__ void decode32<DType::IQ1_M>(const uint8_t* b, int s, int (&q)[8], float (&d)[2],
                                                       float (&m)[2]) {
  const uint32_t idx = ld_u32_a2(b + 4 * s), qh = ld_u16v(b + 32 + 2 * s);
  const uint32_t s0 = ld_u16v(b + 48), s1 = ld_u16v(b + 50), s2 = ld_u16v(b + 52), s3 = ld_u16v(b + 54);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t nib = (qh >> (4 * l)) & 0xF;
    iq1_group8(kDevIq1sGrid[((idx >> (8 * l)) & 0xFF) | ((nib & 7) << 8)], nib & 8 ? -1 : 1, q, l);
  }
  const float dd = h2f(static_cast<uint16_t>((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)));
  const uint32_t sc = ld_u16v(b + 48 + 2 * (s / 2)) >> (6 * (s % 2));
  d[0] = dd * static_cast<float>(2 * (sc & 7) + 1) * 0.125f;
  d[1] = dd * static_cast<float>(2 * ((sc >> 3) & 7) + 1) * 0.125f;
  m[0] = m[1] = 0.0f;
}

}  // namespace kiln::cuda
