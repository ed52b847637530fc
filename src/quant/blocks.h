// Block layouts of the quantized types, byte for byte as in GGUF files (ggml's block_* structs).
// Scales `d`/`m`/`dmin` are IEEE half stored as uint16_t (util/fp16.h converts). QK_K = 256 super-blocks carry
// 6-bit packed sub-block scales in 12 bytes (K_SCALE_SIZE) for q4_K/q5_K, 4+4-bit scales for q2_K, and 6-bit
// scales packed in 12 bytes for q3_K; q6_K has int8 scales per 16 elements.
#pragma once

#include <cstdint>

namespace kiln {

inline constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
inline constexpr int QK_K = 256;
inline constexpr int K_SCALE_SIZE = 12;

struct block_q4_0 {
  uint16_t d;             // delta
  uint8_t qs[QK4_0 / 2];  // nibbles: element j in low nibble of qs[j], element j+16 in high nibble; x = d*(q-8)
};
static_assert(sizeof(block_q4_0) == 18);

struct block_q4_1 {
  uint16_t d, m;          // x = d*q + m
  uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];          // 5th bit of each of the 32 elements (little-endian uint32)
  uint8_t qs[QK5_0 / 2];  // x = d*(q-16)
};
static_assert(sizeof(block_q5_0) == 22);

struct block_q5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];  // x = d*q + m
};
static_assert(sizeof(block_q5_1) == 24);

struct block_q8_0 {
  uint16_t d;
  int8_t qs[QK8_0];       // x = d*q
};
static_assert(sizeof(block_q8_0) == 34);

struct block_q8_1 {
  uint16_t d;             // delta
  uint16_t s;             // d * sum(qs)
  int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36);

struct block_q2_K {
  uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min, per 16 elements
  uint8_t qs[QK_K / 4];       // 2-bit quants
  uint16_t d, dmin;           // super-block scales for the quantized scales / mins
};
static_assert(sizeof(block_q2_K) == 84);

struct block_q3_K {
  uint8_t hmask[QK_K / 8];  // high bit of the 3-bit quants
  uint8_t qs[QK_K / 4];     // low 2 bits
  uint8_t scales[12];       // 16 scales, 6 bits each
  uint16_t d;
};
static_assert(sizeof(block_q3_K) == 110);

struct block_q4_K {
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];  // 8 scales + 8 mins, 6 bits each
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 144);

struct block_q5_K {
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 176);

struct block_q6_K {
  uint8_t ql[QK_K / 2];       // low 4 bits
  uint8_t qh[QK_K / 4];       // high 2 bits
  int8_t scales[QK_K / 16];   // 8-bit scales per 16 elements
  uint16_t d;
};
static_assert(sizeof(block_q6_K) == 210);

// Activation type for k-quant dot products (never stored in model files by llama.cpp's tools).
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];  // sum of qs per 16 elements
};
static_assert(sizeof(block_q8_K) == 292);

// ---- non-linear 4-bit codebooks ---------------------------------------------------------------------------------
// IQ4_NL / IQ4_XS: a 4-bit index q selects kIq4nlValues[q] (a fixed non-uniform grid, denser near 0), times the
// block scale. The 16 values are part of the format (GGUF files store only the indices).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// MXFP4 (OCP microscaling FP4, E2M1): the 16 codes are the FP4 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their
// negatives (code 8 is -0), stored here doubled so that they are integers; the block scale is halved to match.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline constexpr int QK4_NL = 32, QK_MXFP4 = 32;

struct block_iq4_nl {
  uint16_t d;              // f16 scale
  uint8_t qs[QK4_NL / 2];  // indices: element j (0..15) low nibble of qs[j], element j+16 high nibble;
};                         // x = d * kIq4nlValues[q]
static_assert(sizeof(block_iq4_nl) == 18);

// 8 sub-blocks of 32, each with a 6-bit scale ls (stored biased: value ls - 32) split into a low nibble
// (scales_l[s/2] >> 4*(s%2)) and 2 high bits (scales_h >> 2*s). Sub-block s: qs[16s..16s+15] as IQ4_NL's nibbles.
// x = d * (ls - 32) * kIq4nlValues[q].
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_iq4_xs) == 136);

// One E8M0 exponent byte e (scale 2^(e-127)) and 32 FP4 codes, nibbles as IQ4_NL. x = 2^(e-127) * fp4(q)
// = e8m0_half(e) * kMxfp4Values[q]. Blocks are 17 bytes: no alignment beyond 1.
struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[QK_MXFP4 / 2];
};
static_assert(sizeof(block_mxfp4) == 17);

// 2^(e-128) as f32 (half the E8M0 scale, the factor of the doubled codes above), exact for every e: e >= 2 is the
// normal number with exponent field e-1, e = 1 and e = 0 are the subnormals 2^-127 and 2^-128.
inline float e8m0_half_to_f32(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// ---- ternary (BitNet b1.58 / TriLM weights): values {-1, 0, 1} times one f16 scale per 256 ----------------------
// TQ2_0: 2-bit codes c, x = d * (c - 1); qs[32j + m] holds elements 128j + 32l + m (j = 0, 1; m = 0..31) in bits
// 2l..2l+1 (l = 0..3). llama.cpp's quantizer writes c in {0, 1, 2}; code 3 decodes to 2d, as ggml's does.
struct block_tq2_0 {
  uint8_t qs[QK_K / 4];
  uint16_t d;
};
static_assert(sizeof(block_tq2_0) == 66);

// TQ1_0: 5 trits per byte in qs, 4 in qh. A byte b holds trits t_0 (most significant) .. t_{k-1} as the fixed
// point fraction b = ceil(256 * sum_n t_n 3^(4-n) / 243); trit n is ((uint8_t)(b * 3^n) * 3) >> 8, x = d * (t - 1).
// Element order: qs[m] (m < 32) trit n is element 32n + m (0..159); qs[32 + m] (m < 16) trit n is element
// 160 + 16n + m (160..239); qh[j] (j < 4) trit n (n < 4; its fifth trit is 0) is element 240 + 4n + j.
struct block_tq1_0 {
  uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];  // 48
  uint8_t qh[QK_K / 64];                   // 4
  uint16_t d;
};
static_assert(sizeof(block_tq1_0) == 54);

// Trit n (0..4) of a TQ1_0 byte: 0, 1 or 2.
inline int tq1_trit(uint8_t b, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = static_cast<uint8_t>(b * kPow3[n]);
  return (q * 3) >> 8;
}

// ---- i-quants: groups of 8 (or 4) values from a fixed grid (quant/iq_grids.h) ------------------------------------
// A super-block of 256 holds 8 sub-blocks of 32; each sub-block is 4 groups of 8 elements (IQ3: 8 groups of 4).
// A group stores a grid index (its magnitudes) and 8 sign bits (bit j set: element j negative). The 7-bit packed
// signs (IQ2_XXS, IQ2_XS, IQ3_XXS) are an index into kIqSigns (the 8th bit is the parity of the 7). f16 d.
// Value = d * scale * grid * sign with the scale per type below. kiln decodes these and has no quantizer for them
// (making them needs an importance matrix and a grid search; llama-quantize writes them); `kiln synth` writes random
// codes of four of them (cli/synth_fill.cpp).

// IQ2_XXS (2.06 bpw): qs[4s..4s+3] (as 8 bytes) of sub-block s: bytes 0-3 are the grid indices (kIq2xxsGrid) of
// groups 0-3, the u32 of bytes 4-7 holds the 7-bit sign indices of group l at bits 7l..7l+6 and the scale nibble
// ls at bits 28-31. Value = d * (0.5 + ls) * 0.25 * grid * sign = d/8 * (2 ls + 1) * grid * sign.
struct block_iq2_xxs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
};
static_assert(sizeof(block_iq2_xxs) == 66);

// IQ2_XS (2.31 bpw): qs[4s + l] of group l of sub-block s: bits 0-8 the grid index (kIq2xsGrid), bits 9-15 the
// sign index. scales[s]: low nibble for groups 0-1, high nibble for groups 2-3. Value = d/8 * (2 ls + 1) * grid * sign.
struct block_iq2_xs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
  uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_xs) == 74);

// IQ2_S (2.56 bpw): group l of sub-block s: grid index (kIq2sGrid) qs[4s + l] | ((qh[s] >> 2l) & 3) << 8, sign
// bits qs[32 + 4s + l] (8 explicit bits). scales[s] as IQ2_XS. Value = d/8 * (2 ls + 1) * grid * sign.
struct block_iq2_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];  // 32 index bytes, then 32 sign bytes
  uint8_t qh[QK_K / 32];
  uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_s) == 82);

// IQ3_XXS (3.06 bpw): qs[8s + 2l], qs[8s + 2l + 1] are the grid indices (kIq3xxsGrid, 4 elements each) of elements
// 8l..8l+3 and 8l+4..8l+7 of sub-block s; the u32 at qs[64 + 4s] holds the 7-bit sign index of the 8 elements 8l..
// at bits 7l..7l+6 and the scale nibble ls at bits 28-31. Value = d * (0.5 + ls) * 0.5 * grid * sign
// = d/4 * (2 ls + 1) * grid * sign.
struct block_iq3_xxs {
  uint16_t d;
  uint8_t qs[3 * QK_K / 8];
};
static_assert(sizeof(block_iq3_xxs) == 98);

// IQ3_S (3.44 bpw): sub-block s, elements 8l..8l+7: grid indices (kIq3sGrid, 9 bits) qs[8s + 2l + h] |
// ((qh[s] >> (2l + h)) & 1) << 8 for the halves h = 0, 1; sign bits signs[4s + l]. Scale nibble ls of sub-block s:
// scales[s/2] >> 4*(s%2). Value = d * (1 + 2 ls) * grid * sign.
struct block_iq3_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t signs[QK_K / 8];
  uint8_t scales[QK_K / 64];
};
static_assert(sizeof(block_iq3_s) == 110);

// Shift of the IQ1 grids' values: each group's {-1, 0, 1} values move by +-1/8 (the sign is a stored bit).
inline constexpr float kIq1Delta = 0.125f;

// IQ1_S (1.56 bpw): group l of sub-block s: grid index (kIq1sGrid) qs[4s + l] | ((qh[s] >> 3l) & 7) << 8; qh[s]
// bits 12-14: scale ls, bit 15: delta sign (set: -1/8). Value = d * (2 ls + 1) * (grid +- 1/8).
struct block_iq1_s {
  uint16_t d;
  uint8_t qs[QK_K / 8];
  uint16_t qh[QK_K / 32];
};
static_assert(sizeof(block_iq1_s) == 50);

// IQ1_M (1.75 bpw): no separate d: the f16 d is the top nibbles of the 4 u16 in scales (bits 0-3 from scales u16 0,
// bits 4-7 from u16 1, ...). Group l of sub-block s: grid index qs[4s + l] | ((qh[2s + l/2] >> 4(l%2)) & 7) << 8,
// delta sign bit 3 of that nibble. Scales: 3 bits each, for elements 0-15 and 16-31 of sub-block s, at bits
// 6(s%2) and 6(s%2) + 3 of scales u16 s/2. Value = d * (2 ls + 1) * (grid +- 1/8).
struct block_iq1_m {
  uint8_t qs[QK_K / 8];
  uint8_t qh[QK_K / 16];
  uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq1_m) == 56);

// IQ1_M's f16 d from the top nibbles of its 4 scale words.
inline uint16_t iq1m_d_bits(const block_iq1_m& b) {
  uint16_t sc[4];
  __builtin_memcpy(sc, b.scales, 8);
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

// ---- packed sub-block scales -----------------------------------------------------------------------------------
// q4_K / q5_K: 8 sub-blocks of 32, each with a 6-bit scale sc[j] and a 6-bit min m[j], packed in 12 bytes:
//   j < 4:  sc[j] = s[j] & 63,                          m[j] = s[j+4] & 63
//   j >= 4: sc[j] = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m[j] = (s[j+4] >> 4) | ((s[j] >> 6) << 4)
// i.e. bytes 0-3 hold sc[0..3] + the top 2 bits of sc[4..7], bytes 4-7 hold m[0..3] + the top 2 bits of m[4..7],
// bytes 8-11 hold the low nibbles of sc[4..7] (low) and m[4..7] (high). Element value = d*sc[j]*q - dmin*m[j].
inline void kquant_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// q3_K: 16 sub-blocks of 16, each with a 6-bit scale stored biased by 32 (signed value = raw - 32), in 12 bytes:
// the low 4 bits of scale j are nibble (j % 8) of bytes 0-7 (j < 8: low nibble of byte j; j >= 8: high nibble of
// byte j-8), the high 2 bits of scale j are bits 2*(j / 4)..+1 of byte 8 + (j % 4).
inline void q3k_unpack_scales(const uint8_t* s, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (j < 8) ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

}  // namespace kiln
