// The scalar executable spec of the CPU matmul: activations quantized with quant/reference.h, then one scalar dot
// product per (weight row, activation row), mirroring llama.cpp's scalar ggml_vec_dot_* formulas.
//
// Numerics common to the quantized types: within one block the products weight-quant x activation-quant are
// summed in int32 (exact: the largest, q6_K's |sum_j sc_j * sum_16 (q-32) a| <= 256*32*127*128, is < 2^31); each
// block's integer sums are then converted to f32 and scaled by f32 products of the block scales, and the blocks
// are accumulated in one f32 in order. The SIMD kernels compute the same integers per block and differ only in how
// the f32 per-block terms are summed (lanes, FMA).
#include <cstring>
#include <vector>

#include "backend/cpu/iq_decode.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln::cpu {
namespace detail {

namespace {

inline float h2f(uint16_t h) { return fp16_to_f32(h); }

// F32 / F16 / BF16: the activation was rounded to the weight type (F16: f32 -> f16 -> f32 is what llama.cpp's
// ggml_vec_dot_f16 sees). Each product of two f16 (or two bf16, or two f32) values is exact in double, and the sum
// runs in double, rounded to f32 once: the reference is within 1 ulp of the exact dot of the rounded inputs.
float dot_f32(const void* w, const void* a, int64_t n) {
  const float* x = static_cast<const float*>(w);
  const float* y = static_cast<const float*>(a);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * y[i];
  return static_cast<float>(s);
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const uint16_t* y = static_cast<const uint16_t*>(a);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(h2f(x[i])) * h2f(y[i]);
  return static_cast<float>(s);
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const uint16_t* y = static_cast<const uint16_t*>(a);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(bf16_to_f32(x[i])) * bf16_to_f32(y[i]);
  return static_cast<float>(s);
}

// Q4_0 x Q8_0, per block of 32: isum = sum_j (q_j - 8) * a_j;  acc += (d_w * d_a) * isum.
float dot_q4_0(const void* w, const void* a, int64_t n) {
  const block_q4_0* x = static_cast<const block_q4_0*>(w);
  const block_q8_0* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
      isum += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + 16];
    }
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// Q4_1 x Q8_1, per block: isum = sum_j q_j * a_j;  acc += (d_w * d_a) * isum + m_w * s_a  (s_a = d_a * sum a_j,
// stored in the Q8_1 block as f16).
float dot_q4_1(const void* w, const void* a, int64_t n) {
  const block_q4_1* x = static_cast<const block_q4_1*>(w);
  const block_q8_1* y = static_cast<const block_q8_1*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK4_1; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += (x[b].qs[j] & 0xF) * y[b].qs[j];
      isum += (x[b].qs[j] >> 4) * y[b].qs[j + 16];
    }
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum) + h2f(x[b].m) * h2f(y[b].s);
  }
  return acc;
}

inline uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// Q5_0 x Q8_0: q_j = nibble | (bit j of qh) << 4, isum = sum (q_j - 16) * a_j;  acc += (d_w * d_a) * isum.
float dot_q5_0(const void* w, const void* a, int64_t n) {
  const block_q5_0* x = static_cast<const block_q5_0*>(w);
  const block_q8_0* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK5_0; ++b) {
    const uint32_t qh = load_qh(x[b].qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (x[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += (q0 - 16) * y[b].qs[j] + (q1 - 16) * y[b].qs[j + 16];
    }
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// Q5_1 x Q8_1: as Q5_0 without the -16, plus m_w * s_a as Q4_1.
float dot_q5_1(const void* w, const void* a, int64_t n) {
  const block_q5_1* x = static_cast<const block_q5_1*>(w);
  const block_q8_1* y = static_cast<const block_q8_1*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK5_1; ++b) {
    const uint32_t qh = load_qh(x[b].qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (x[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += q0 * y[b].qs[j] + q1 * y[b].qs[j + 16];
    }
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum) + h2f(x[b].m) * h2f(y[b].s);
  }
  return acc;
}

// Q8_0 x Q8_0: isum = sum q_j * a_j;  acc += (d_w * d_a) * isum.
float dot_q8_0(const void* w, const void* a, int64_t n) {
  const block_q8_0* x = static_cast<const block_q8_0*>(w);
  const block_q8_0* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += x[b].qs[j] * y[b].qs[j];
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// Q2_K x Q8_K, per super-block of 256 (16 groups of 16, element e in group e/16): q_e = 2-bit field
// (qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3, scale sc_g = scales[g] & 15, min m_g = scales[g] >> 4.
// isum = sum_g sc_g * sum_{e in g} q_e * a_e;  summs = sum_g m_g * bsums_g;
// acc += (d_a * d_w) * isum - (d_a * dmin_w) * summs.
float dot_q2_K(const void* w, const void* a, int64_t n) {
  const block_q2_K* x = static_cast<const block_q2_K*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, summs = 0;
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int k = 0; k < 16; ++k) {
        const int e = g * 16 + k;
        const int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        gs += q * y[b].qs[e];
      }
      isum += (x[b].scales[g] & 0xF) * gs;
      summs += (x[b].scales[g] >> 4) * y[b].bsums[g];
    }
    acc += (y[b].d * h2f(x[b].d)) * static_cast<float>(isum) - (y[b].d * h2f(x[b].dmin)) * static_cast<float>(summs);
  }
  return acc;
}

// Q3_K x Q8_K: q_e = ((qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3) - (hmask[e%32] bit (e/32) ? 0 : 4), in
// [-4, 3]; 16 six-bit scales (low 4 bits in scales[0..7] nibbles, high 2 bits in scales[8..11]) minus 32.
// isum = sum_g sc_g * sum_{e in g} q_e * a_e;  acc += (d_w * d_a) * isum.
float dot_q3_K(const void* w, const void* a, int64_t n) {
  const block_q3_K* x = static_cast<const block_q3_K*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const uint8_t* s = x[b].scales;
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      const int lo = g < 8 ? (s[g] & 0xF) : (s[g - 8] >> 4);
      const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
      const int sc = (lo | (hi << 4)) - 32;
      int gs = 0;
      for (int k = 0; k < 16; ++k) {
        const int e = g * 16 + k;
        const int q2 = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int q = q2 - ((x[b].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
        gs += q * y[b].qs[e];
      }
      isum += sc * gs;
    }
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return acc;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block (12 packed bytes).
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K x Q8_K: 8 sub-blocks of 32; element e: q_e = nibble (e%64 < 32 ? low : high) of qs[32*(e/64) + e%32].
// isum = sum_j sc_j * sum_{e in j} q_e * a_e;  summs = sum_j m_j * (bsums_{2j} + bsums_{2j+1});
// acc += (d_w * d_a) * isum - (dmin_w * d_a) * summs.
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const block_q4_K* x = static_cast<const block_q4_K*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, summs = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(j, x[b].scales, &sc, &m);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = x[b].qs[32 * (j / 2) + l];
        s += ((j & 1) ? (byte >> 4) : (byte & 0xF)) * y[b].qs[32 * j + l];
      }
      isum += sc * s;
      summs += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum) - (h2f(x[b].dmin) * y[b].d) * static_cast<float>(summs);
  }
  return acc;
}

// Q5_K x Q8_K: as Q4_K with a fifth bit: q_e += 16 * (qh[e%32] bit (e/32)).
float dot_q5_K(const void* w, const void* a, int64_t n) {
  const block_q5_K* x = static_cast<const block_q5_K*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, summs = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(j, x[b].scales, &sc, &m);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = x[b].qs[32 * (j / 2) + l];
        const int q = ((j & 1) ? (byte >> 4) : (byte & 0xF)) | (((x[b].qh[l] >> j) & 1) << 4);
        s += q * y[b].qs[32 * j + l];
      }
      isum += sc * s;
      summs += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum) - (h2f(x[b].dmin) * y[b].d) * static_cast<float>(summs);
  }
  return acc;
}

// Q6_K x Q8_K: per half h (128 elements), l in 0..31: q[l] = ql[l]&15 | (qh[l]&3)<<4, q[l+32] = ql[l+32]&15 |
// (qh[l]>>2&3)<<4, q[l+64] = ql[l]>>4 | (qh[l]>>4&3)<<4, q[l+96] = ql[l+32]>>4 | (qh[l]>>6)<<4 (ql/qh advanced
// by 64/32 per half); 16 int8 scales per 16 elements.  isum = sum_g sc_g * sum_{e in g} (q_e - 32) * a_e;
// acc += (d_w * d_a) * isum.
float dot_q6_K(const void* w, const void* a, int64_t n) {
  const block_q6_K* x = static_cast<const block_q6_K*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int q[QK_K];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      int* o = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        o[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
        o[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int k = 0; k < 16; ++k) s += (q[16 * g + k] - 32) * y[b].qs[16 * g + k];
      isum += x[b].scales[g] * s;
    }
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return acc;
}

// IQ4_NL x Q8_0 (llama.cpp's activation type for it): per block, isum = sum_j kIq4nlValues[q_j] * a_j;
// acc += (d_w * d_a) * isum.
float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(w);
  const block_q8_0* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK4_NL; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += kIq4nlValues[x[b].qs[j] & 0xF] * y[b].qs[j];
      isum += kIq4nlValues[x[b].qs[j] >> 4] * y[b].qs[j + 16];
    }
    acc += (h2f(x[b].d) * h2f(y[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// IQ4_XS x Q8_K (llama.cpp's activation type for it): sub-block s has the signed scale ls_s - 32 (blocks.h);
// isum = sum_s (ls_s - 32) * sum_{e in s} kIq4nlValues[q_e] * a_e, exact in int32 (|isum| <= 8*32*32*127*127);
// acc += (d_w * d_a) * isum per super-block, as llama.cpp's x86 kernels sum it (its generic C code scales each
// sub-block in f32 instead: the same value up to f32 rounding).
float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const block_iq4_xs* x = static_cast<const block_iq4_xs*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int s = 0; s < 8; ++s) {
      const int ls = ((x[b].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x[b].scales_h >> (2 * s)) & 3) << 4);
      const uint8_t* qs = x[b].qs + 16 * s;
      const int8_t* q8 = y[b].qs + 32 * s;
      int sub = 0;
      for (int j = 0; j < 16; ++j) sub += kIq4nlValues[qs[j] & 0xF] * q8[j] + kIq4nlValues[qs[j] >> 4] * q8[j + 16];
      isum += (ls - 32) * sub;
    }
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return acc;
}

// MXFP4 x Q8_0 (llama.cpp's activation type for it): per block, isum = sum_j kMxfp4Values[q_j] * a_j (doubled FP4
// values); acc += (d_a * 2^(e-128)) * isum.
float dot_mxfp4(const void* w, const void* a, int64_t n) {
  const block_mxfp4* x = static_cast<const block_mxfp4*>(w);
  const block_q8_0* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_MXFP4; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += kMxfp4Values[x[b].qs[j] & 0xF] * y[b].qs[j];
      isum += kMxfp4Values[x[b].qs[j] >> 4] * y[b].qs[j + 16];
    }
    acc += (h2f(y[b].d) * e8m0_half_to_f32(x[b].e)) * static_cast<float>(isum);
  }
  return acc;
}

// TQ1_0 / TQ2_0 x Q8_K (llama.cpp's activation type for them): isum = sum_e (t_e - 1) * a_e over the super-block,
// t_e the element's trit (TQ2_0: its 2-bit code, 3 included); acc += (d_w * d_a) * isum.
float dot_tq1_0(const void* w, const void* a, int64_t n) {
  const block_tq1_0* x = static_cast<const block_tq1_0*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int isum = 0;
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 32; ++m) isum += (tq1_trit(x[b].qs[m], t) - 1) * q8[32 * t + m];
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 16; ++m) isum += (tq1_trit(x[b].qs[32 + m], t) - 1) * q8[160 + 16 * t + m];
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 4; ++j) isum += (tq1_trit(x[b].qh[j], t) - 1) * q8[240 + 4 * t + j];
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return acc;
}

float dot_tq2_0(const void* w, const void* a, int64_t n) {
  const block_tq2_0* x = static_cast<const block_tq2_0*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m)
          isum += (((x[b].qs[32 * j + m] >> (2 * l)) & 3) - 1) * y[b].qs[128 * j + 32 * l + m];
    acc += (h2f(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return acc;
}

// I-quant grid types x Q8_K (llama.cpp's activation type for them), in the integer form of iq_decode.h:
// isum = sum_s sum_e w_e sc_e a_e per super-block, exact in int32; acc += (d_w * d_a) * isum; the result times the
// type's unit (llama.cpp's formula: its x86 kernels sum the same integers; IQ1's +-1/8 shift is in w here and a
// bsums term there, the same integer).
template <DType WT>
float dot_iq_grid(const void* w, const void* a, int64_t n) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  const block_q8_K* y = static_cast<const block_q8_K*>(a);
  const int64_t ts = dtype_type_size(WT);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const uint8_t* blk = x + b * ts;
    int isum = 0;
    for (int s = 0; s < 8; ++s) {
      int8_t q[32];
      int sc[2];
      iq_decode_sub(WT, blk, s, q, sc);
      const int8_t* q8 = y[b].qs + 32 * s;
      int lo = 0, hi = 0;
      for (int e = 0; e < 16; ++e) lo += q[e] * q8[e], hi += q[e + 16] * q8[e + 16];
      isum += sc[0] * lo + sc[1] * hi;
    }
    acc += (h2f(iq_d_bits(WT, blk)) * y[b].d) * static_cast<float>(isum);
  }
  return iq_unit(WT) * acc;
}

}  // namespace

DType act_type(DType wtype) {
  switch (wtype) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::MXFP4: return DType::Q8_0;
    case DType::Q4_1: case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_XS:
    case DType::TQ1_0: case DType::TQ2_0: case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S:
    case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S: case DType::IQ1_M:
      return DType::Q8_K;
    default: return wtype;
  }
}

VecDotFn ref_vec_dot(DType wtype) {
  switch (wtype) {
    case DType::F32: return dot_f32;
    case DType::F16: return dot_f16;
    case DType::BF16: return dot_bf16;
    case DType::Q4_0: return dot_q4_0;
    case DType::Q4_1: return dot_q4_1;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q5_1: return dot_q5_1;
    case DType::Q8_0: return dot_q8_0;
    case DType::Q2_K: return dot_q2_K;
    case DType::Q3_K: return dot_q3_K;
    case DType::Q4_K: return dot_q4_K;
    case DType::Q5_K: return dot_q5_K;
    case DType::Q6_K: return dot_q6_K;
    case DType::IQ4_NL: return dot_iq4_nl;
    case DType::IQ4_XS: return dot_iq4_xs;
    case DType::MXFP4: return dot_mxfp4;
    case DType::TQ1_0: return dot_tq1_0;
    case DType::TQ2_0: return dot_tq2_0;
    case DType::IQ2_XXS: return dot_iq_grid<DType::IQ2_XXS>;
    case DType::IQ2_XS: return dot_iq_grid<DType::IQ2_XS>;
    case DType::IQ2_S: return dot_iq_grid<DType::IQ2_S>;
    case DType::IQ3_XXS: return dot_iq_grid<DType::IQ3_XXS>;
    case DType::IQ3_S: return dot_iq_grid<DType::IQ3_S>;
    case DType::IQ1_S: return dot_iq_grid<DType::IQ1_S>;
    case DType::IQ1_M: return dot_iq_grid<DType::IQ1_M>;
    default: return nullptr;
  }
}

}  // namespace detail

Status matmul_ref(const MatmulArgs& a) {
  KILN_TRY(matmul_check(a));
  const DType at = detail::act_type(a.wtype);
  const detail::VecDotFn dot = detail::ref_vec_dot(a.wtype);
  const size_t act_bytes = static_cast<size_t>(dtype_row_bytes(at, a.n_in).value());
  std::vector<uint8_t> act(act_bytes);
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  for (int64_t t = 0; t < a.n_tok; ++t) {
    KILN_TRY(quantize_row(at, a.x + t * a.x_stride, act.data(), a.n_in));
    for (int64_t o = 0; o < a.n_out; ++o) a.y[t * a.y_stride + o] = dot(w + o * a.w_row_bytes, act.data(), a.n_in);
  }
  return Status::ok();
}

}  // namespace kiln::cpu
