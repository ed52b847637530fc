// Dequantization of the k-quant super-block formats (QK_K = 256 elements): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
// Each function is the executable spec of its block layout (structs in quant/blocks.h). Values equal ggml's
// dequantize_row_* (same f32 operations: the per-sub-block scale d*sc is formed first, then multiplied by q; ggml
// may fuse the "- dmin*m" into an FMA, a difference of at most 1 ulp).
#include "quant/reference.h"

#include "util/fp16.h"

namespace kiln {

// Q2_K (84 bytes / 256): scales[16], qs[64], f16 d, f16 dmin. 16 sub-blocks of 16 elements; scales[s] holds the
// 4-bit scale (low nibble) and 4-bit min (high nibble) of sub-block s. 2-bit quants: the block is two halves of 128;
// in half h, element 128h + 32k + l (k = 0..3, l = 0..31) is bits 2k..2k+1 of qs[32h + l].
// Value = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), s = element / 16, q in 0..3.
void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int q = (x[i].qs[32 * h + l] >> (2 * k)) & 3;
      const uint8_t sc = x[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = dmin * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q3_K (110 bytes / 256): hmask[32], qs[64], scales[12], f16 d. 16 sub-blocks of 16 with signed 6-bit scales
// (packing in q3k_unpack_scales, blocks.h). Low 2 bits as Q2_K: element 128h + 32k + l is bits 2k..2k+1 of
// qs[32h + l]; its high bit is bit (4h + k) of hmask[l]. q = low2 - (high bit set ? 0 : 4), in -4..3.
// Value = d * scale[element / 16] * q.
void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    int8_t sc[16];
    q3k_unpack_scales(x[i].scales, sc);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int lo = (x[i].qs[32 * h + l] >> (2 * k)) & 3;
      const int hi = (x[i].hmask[l] >> (4 * h + k)) & 1;
      const float dl = d * static_cast<float>(sc[e / 16]);
      y[e] = dl * static_cast<float>(lo - (hi ? 0 : 4));
    }
  }
}

// Q4_K (144 bytes / 256): f16 d, f16 dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min, see kquant_scale_min),
// qs[128]. 8 sub-blocks of 32; in chunk c (64 elements), element 64c + l (l < 32) is the low nibble of qs[32c + l]
// (sub-block 2c) and element 64c + 32 + l its high nibble (sub-block 2c + 1).
// Value = d * sc[s] * q - dmin * m[s], q in 0..15.
void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      kquant_scale_min(s, x[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t* q = x[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) y[32 * s + l] = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
    }
  }
}

// Q5_K (176 bytes / 256): f16 d, f16 dmin, scales[12] (as Q4_K), qh[32], qs[128]. Low 4 bits as Q4_K; the 5th bit
// of element 32s + l (sub-block s, l < 32) is bit s of qh[l]. Value = d * sc[s] * q - dmin * m[s], q in 0..31.
void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      kquant_scale_min(s, x[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t* q = x[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0xF) | (((x[i].qh[l] >> s) & 1) << 4);
        y[32 * s + l] = dl * static_cast<float>(v) - ml;
      }
    }
  }
}

// Q6_K (210 bytes / 256): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 elements),
// f16 d. In half h (128 elements), with L = ql + 64h, H = qh + 32h, element 128h + 32k + l (k = 0..3, l < 32) has
// low 4 bits = nibble (k / 2) of L[l + 32 * (k % 2)] and high 2 bits = bits 2k..2k+1 of H[l].
// Value = d * scales[element / 16] * (q - 32), q in 0..63.
void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t lo_byte = x[i].ql[64 * h + l + 32 * (k % 2)];
      const int lo = (k / 2) ? (lo_byte >> 4) : (lo_byte & 0xF);
      const int hi = (x[i].qh[32 * h + l] >> (2 * k)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      y[e] = d * static_cast<float>(x[i].scales[e / 16]) * static_cast<float>(q);
    }
  }
}

// Q8_K (292 bytes / 256): f32 d, int8 qs[256], int16 bsums[16] (dot-product helper, not needed here).
// Value = d * q.
void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

}  // namespace kiln
