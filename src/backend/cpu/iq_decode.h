// The i-quant grid types (quant/blocks.h) as integers, for the dot products: sub-block s (elements 32s..32s+31)
// of a super-block is w[e] * sc[e / 16] * unit * d with int8 w and small odd integer scales sc:
//   IQ2_XXS / IQ2_XS / IQ2_S: w = +-grid (8, 25, 43), sc = 2 ls + 1 (1..31), unit 1/8
//   IQ3_XXS: w = +-grid (4..62), sc = 2 ls + 1, unit 1/4;  IQ3_S: w = +-grid (1..15), sc = 2 ls + 1, unit 1
//   IQ1_S / IQ1_M: w = 8 grid +- 1 (grid in {-1, 0, 1}: |w| <= 9, the +-1/8 shift times 8), sc = 2 ls + 1, unit 1/8
// which is each format's value exactly (d * (0.5 + ls) * 0.25 = d/8 * (2 ls + 1), and so on). With Q8_K
// activations (|a| <= 127) a super-block's sum_e w_e sc_e a_e is below 256 * 62 * 31 * 127 < 2^26: exact in int32.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/dtype.h"
#include "quant/iq_grids.h"

namespace kiln::cpu::detail {

inline bool is_iq_grid_type(DType t) {
  return t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ3_XXS ||
         t == DType::IQ3_S || t == DType::IQ1_S || t == DType::IQ1_M;
}

// unit of the integer form above.
inline float iq_unit(DType t) {
  return t == DType::IQ3_S ? 1.f : t == DType::IQ3_XXS ? 0.25f : 0.125f;
}

// The f16 bits of super-block `blk`'s d.
inline uint16_t iq_d_bits(DType t, const uint8_t* blk) {
  if (t == DType::IQ1_M) return iq1m_d_bits(*reinterpret_cast<const block_iq1_m*>(blk));
  uint16_t d;
  std::memcpy(&d, blk, 2);
  return d;
}

namespace iq_impl {
inline void signed8(int8_t* w, uint64_t grid, uint8_t signs) {
  for (int j = 0; j < 8; ++j) {
    const int g = static_cast<uint8_t>(grid >> (8 * j));
    w[j] = static_cast<int8_t>((signs >> j) & 1 ? -g : g);
  }
}
inline void signed4x2(int8_t* w, uint32_t g0, uint32_t g1, uint8_t signs) {
  signed8(w, static_cast<uint64_t>(g0) | (static_cast<uint64_t>(g1) << 32), signs);
}
inline void iq1_8(int8_t* w, uint64_t grid, bool neg) {
  for (int j = 0; j < 8; ++j) w[j] = static_cast<int8_t>(8 * static_cast<int8_t>(grid >> (8 * j)) + (neg ? -1 : 1));
}
}  // namespace iq_impl

// Sub-block s of super-block `blk` of type t: w[0..32) and the scales of elements 0-15 (sc[0]) and 16-31 (sc[1]).
inline void iq_decode_sub(DType t, const uint8_t* blk, int s, int8_t w[32], int sc[2]) {
  using namespace iq_impl;
  switch (t) {
    case DType::IQ2_XXS: {
      const auto& b = *reinterpret_cast<const block_iq2_xxs*>(blk);
      uint8_t idx[4];
      uint32_t aux;
      std::memcpy(idx, b.qs + 4 * s, 4);
      std::memcpy(&aux, b.qs + 4 * s + 2, 4);
      sc[0] = sc[1] = 2 * static_cast<int>(aux >> 28) + 1;
      for (int l = 0; l < 4; ++l) signed8(w + 8 * l, kIq2xxsGrid[idx[l]], kIqSigns[(aux >> (7 * l)) & 127]);
      return;
    }
    case DType::IQ2_XS: {
      const auto& b = *reinterpret_cast<const block_iq2_xs*>(blk);
      sc[0] = 2 * (b.scales[s] & 0xF) + 1;
      sc[1] = 2 * (b.scales[s] >> 4) + 1;
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = b.qs[4 * s + l];
        signed8(w + 8 * l, kIq2xsGrid[q & 511], kIqSigns[q >> 9]);
      }
      return;
    }
    case DType::IQ2_S: {
      const auto& b = *reinterpret_cast<const block_iq2_s*>(blk);
      sc[0] = 2 * (b.scales[s] & 0xF) + 1;
      sc[1] = 2 * (b.scales[s] >> 4) + 1;
      for (int l = 0; l < 4; ++l)
        signed8(w + 8 * l, kIq2sGrid[b.qs[4 * s + l] | (((b.qh[s] >> (2 * l)) & 3) << 8)], b.qs[32 + 4 * s + l]);
      return;
    }
    case DType::IQ3_XXS: {
      const auto& b = *reinterpret_cast<const block_iq3_xxs*>(blk);
      uint32_t aux;
      std::memcpy(&aux, b.qs + 64 + 4 * s, 4);
      sc[0] = sc[1] = 2 * static_cast<int>(aux >> 28) + 1;
      const uint8_t* qs = b.qs + 8 * s;
      for (int l = 0; l < 4; ++l)
        signed4x2(w + 8 * l, kIq3xxsGrid[qs[2 * l]], kIq3xxsGrid[qs[2 * l + 1]], kIqSigns[(aux >> (7 * l)) & 127]);
      return;
    }
    case DType::IQ3_S: {
      const auto& b = *reinterpret_cast<const block_iq3_s*>(blk);
      sc[0] = sc[1] = 2 * ((b.scales[s / 2] >> (4 * (s % 2))) & 0xF) + 1;
      const uint8_t* qs = b.qs + 8 * s;
      const int qh = b.qh[s];
      for (int l = 0; l < 4; ++l)
        signed4x2(w + 8 * l, kIq3sGrid[qs[2 * l] | (((qh >> (2 * l)) & 1) << 8)],
                  kIq3sGrid[qs[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)], b.signs[4 * s + l]);
      return;
    }
    case DType::IQ1_S: {
      const auto& b = *reinterpret_cast<const block_iq1_s*>(blk);
      const int qh = b.qh[s];
      sc[0] = sc[1] = 2 * ((qh >> 12) & 7) + 1;
      for (int l = 0; l < 4; ++l)
        iq1_8(w + 8 * l, kIq1sGrid[b.qs[4 * s + l] | (((qh >> (3 * l)) & 7) << 8)], (qh & 0x8000) != 0);
      return;
    }
    case DType::IQ1_M: {
      const auto& b = *reinterpret_cast<const block_iq1_m*>(blk);
      uint16_t scw[4];
      std::memcpy(scw, b.scales, 8);
      sc[0] = 2 * ((scw[s / 2] >> (6 * (s % 2))) & 7) + 1;
      sc[1] = 2 * ((scw[s / 2] >> (6 * (s % 2) + 3)) & 7) + 1;
      for (int l = 0; l < 4; ++l) {
        const int nib = (b.qh[2 * s + l / 2] >> (4 * (l % 2))) & 0xF;
        iq1_8(w + 8 * l, kIq1sGrid[b.qs[4 * s + l] | ((nib & 7) << 8)], (nib & 8) != 0);
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace kiln::cpu::detail
