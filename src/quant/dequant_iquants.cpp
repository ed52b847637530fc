// Dequantization of the i-quant grid formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (block layouts in
// quant/blocks.h, grids in quant/iq_grids.h). Each function is the executable spec of its layout. Values equal
// ggml's dequantize_row_* (the same f32 operations in the same order: the group scale first, then times the grid
// magnitude, then the sign; for IQ1 the scale times (grid + delta)). kiln has no quantizer for these types.
#include <cstring>

#include "quant/iq_grids.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {

namespace {

inline uint8_t grid_byte(uint64_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }
inline uint8_t grid_byte(uint32_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }

// 8 elements: y[j] = dl * grid[j], negated where bit j of `signs` is set.
inline void put8(float* y, float dl, uint64_t grid, uint8_t signs) {
  for (int j = 0; j < 8; ++j) y[j] = dl * static_cast<float>(grid_byte(grid, j)) * ((signs >> j) & 1 ? -1.f : 1.f);
}

// 8 elements from two 4-element IQ3 grid entries.
inline void put4x2(float* y, float dl, uint32_t g0, uint32_t g1, uint8_t signs) {
  for (int j = 0; j < 4; ++j) {
    y[j] = dl * static_cast<float>(grid_byte(g0, j)) * ((signs >> j) & 1 ? -1.f : 1.f);
    y[j + 4] = dl * static_cast<float>(grid_byte(g1, j)) * ((signs >> (j + 4)) & 1 ? -1.f : 1.f);
  }
}

// 8 IQ1 elements: dl * (grid[j] + delta), grid values int8 in {-1, 0, 1}.
inline void put_iq1(float* y, float dl, uint64_t grid, float delta) {
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(static_cast<int8_t>(grid_byte(grid, j))) + delta);
}

// The scales of groups 0-1 and 2-3 of an IQ2_XS / IQ2_S sub-block (the low and high nibble of its scale byte).
struct Iq2Scales {
  float v[2];
  Iq2Scales(float d, uint8_t sc)
      : v{d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f, d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f} {}
  float operator[](int h) const { return v[h]; }
};

}  // namespace

void dequantize_row_iq2_xxs(const block_iq2_xxs* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      uint8_t idx[4];
      uint32_t aux;
      std::memcpy(idx, x[i].qs + 4 * s, 4);
      std::memcpy(&aux, x[i].qs + 4 * s + 2, 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) put8(y, db, kIq2xxsGrid[idx[l]], kIqSigns[(aux >> (7 * l)) & 127]);
    }
  }
}

void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      const Iq2Scales db(d, x[i].scales[s]);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = x[i].qs[4 * s + l];
        put8(y, db[l / 2], kIq2xsGrid[q & 511], kIqSigns[q >> 9]);
      }
    }
  }
}

void dequantize_row_iq2_s(const block_iq2_s* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      const Iq2Scales db(d, x[i].scales[s]);
      for (int l = 0; l < 4; ++l, y += 8) {
        const int idx = x[i].qs[4 * s + l] | (((x[i].qh[s] >> (2 * l)) & 3) << 8);
        put8(y, db[l / 2], kIq2sGrid[idx], x[i].qs[QK_K / 8 + 4 * s + l]);
      }
    }
  }
}

void dequantize_row_iq3_xxs(const block_iq3_xxs* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      uint32_t aux;
      std::memcpy(&aux, x[i].qs + QK_K / 4 + 4 * s, 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      const uint8_t* qs = x[i].qs + 8 * s;
      for (int l = 0; l < 4; ++l, y += 8)
        put4x2(y, db, kIq3xxsGrid[qs[2 * l]], kIq3xxsGrid[qs[2 * l + 1]], kIqSigns[(aux >> (7 * l)) & 127]);
    }
  }
}

void dequantize_row_iq3_s(const block_iq3_s* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      const float db = d * static_cast<float>(1 + 2 * ((x[i].scales[s / 2] >> (4 * (s % 2))) & 0xF));
      const uint8_t* qs = x[i].qs + 8 * s;
      const int qh = x[i].qh[s];
      for (int l = 0; l < 4; ++l, y += 8) {
        const int i0 = qs[2 * l] | (((qh >> (2 * l)) & 1) << 8);
        const int i1 = qs[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
        put4x2(y, db, kIq3sGrid[i0], kIq3sGrid[i1], x[i].signs[4 * s + l]);
      }
    }
  }
}

void dequantize_row_iq1_s(const block_iq1_s* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s) {
      const int qh = x[i].qh[s];
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8)
        put_iq1(y, dl, kIq1sGrid[x[i].qs[4 * s + l] | (((qh >> (3 * l)) & 7) << 8)], delta);
    }
  }
}

void dequantize_row_iq1_m(const block_iq1_m* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(iq1m_d_bits(x[i]));
    uint16_t sc[4];
    std::memcpy(sc, x[i].scales, 8);
    for (int s = 0; s < QK_K / 32; ++s) {
      const float dl[2] = {d * static_cast<float>(2 * ((sc[s / 2] >> (6 * (s % 2))) & 7) + 1),
                           d * static_cast<float>(2 * ((sc[s / 2] >> (6 * (s % 2) + 3)) & 7) + 1)};
      for (int l = 0; l < 4; ++l, y += 8) {
        const int nib = (x[i].qh[2 * s + l / 2] >> (4 * (l % 2))) & 0xF;
        put_iq1(y, dl[l / 2], kIq1sGrid[x[i].qs[4 * s + l] | ((nib & 7) << 8)], nib & 8 ? -kIq1Delta : kIq1Delta);
      }
    }
  }
}

}  // namespace kiln
