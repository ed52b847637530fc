// Dequantization of the codebook formats: IQ4_NL, IQ4_XS (4-bit indices into kIq4nlValues) and MXFP4 (4-bit E2M1
// codes with a shared power-of-two scale). Each function is the executable spec of its block layout (structs and
// codebooks in quant/blocks.h). Values equal ggml's dequantize_row_* (the same f32 products in the same order: the
// sub-block scale d * (ls - 32) is formed first, then multiplied by the codebook value).
#include "quant/reference.h"

#include "util/fp16.h"

namespace kiln {

// IQ4_NL (18 bytes / 32 elements): f16 d, then 16 bytes of indices. Element j (0..15) is the low nibble of qs[j],
// element j+16 the high nibble. Value = d * kIq4nlValues[q].
void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, int64_t n) {
  const int64_t nb = n / QK4_NL;
  for (int64_t i = 0; i < nb; ++i, y += QK4_NL) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[x[i].qs[j] & 0xF]);
      y[j + QK4_NL / 2] = d * static_cast<float>(kIq4nlValues[x[i].qs[j] >> 4]);
    }
  }
}

// IQ4_XS (136 bytes / 256 elements): f16 d, u16 scales_h, scales_l[4], qs[128]. Sub-block s (elements 32s..32s+31)
// has the 6-bit scale ls = ((scales_l[s/2] >> 4*(s%2)) & 15) | (((scales_h >> 2s) & 3) << 4) and its 32 indices in
// qs[16s..16s+15] laid out as one IQ4_NL block. Value = (d * (ls - 32)) * kIq4nlValues[q].
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int s = 0; s < QK_K / 32; ++s, y += 32) {
      const int ls = ((x[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x[i].scales_h >> (2 * s)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* qs = x[i].qs + 16 * s;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

// MXFP4 (17 bytes / 32 elements): E8M0 exponent e, then 16 bytes of FP4 codes, nibbles as IQ4_NL.
// Value = kMxfp4Values[q] * 2^(e-128) (the doubled E2M1 value times half the scale: a small integer times a power
// of two, so exact unless it overflows: codes >= 3 of e = 255 are inf, as in ggml).
void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n) {
  const int64_t nb = n / QK_MXFP4;
  for (int64_t i = 0; i < nb; ++i, y += QK_MXFP4) {
    const float d = e8m0_half_to_f32(x[i].e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[x[i].qs[j] & 0xF]) * d;
      y[j + QK_MXFP4 / 2] = static_cast<float>(kMxfp4Values[x[i].qs[j] >> 4]) * d;
    }
  }
}

}  // namespace kiln
