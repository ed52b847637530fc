// Quantizers for the codebook formats IQ4_NL, IQ4_XS and MXFP4 (layouts and codebooks in quant/blocks.h).
//
// IQ4_NL / IQ4_XS (kiln's method; not byte-compatible with llama-quantize, whose search weights each error by x^2):
// per block of 32, scale candidates put the element of largest |x| (`max`, with its sign) on or near either end of
// the codebook (index * scale = max for the target values -127 + t and 113 + t, t in -6..6 step 2; the codebook is
// asymmetric, so both ends are tried); for each candidate every element takes its nearest codebook value and the
// scale is refit by least squares, d = sum(v x) / sum(v^2); the candidate with the smallest squared error wins, then
// one more nearest-value / refit pass with its scale. IQ4_XS then stores the 8 sub-block scales as 6-bit
// multiples ls - 32 of one f16 super-block scale D = -max_d / 32 (max_d the sub-block scale of largest magnitude:
// -32 is the one code with no positive twin), tries ls-32 = round(d_s / D) and its two neighbours with the rounded D,
// re-assigning the nearest values for each, and keeps the one with the smallest error.
//
// MXFP4: llama.cpp's reference rounding (quantize_row_mxfp4_ref, what llama-quantize writes): e = floor(log2(amax))
// - 2 + 127 (so amax / 2^(e-127) lies in [4, 8): the largest code is 6), each element the code whose value is
// nearest (first of equals in code order), so kiln writes the same bytes for every finite block; e is clamped to
// 0..255 where llama.cpp's conversion would leave the byte range.
#include <cmath>
#include <cstring>

#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {

namespace {

// Index of the codebook value nearest to v (kIq4nlValues is ascending; ties and NaN go to the lower index).
inline int nearest_iq4nl(float v) {
  int i = 0;
  for (int k = 0; k < 15; ++k)
    i += v > 0.5f * static_cast<float>(kIq4nlValues[k] + kIq4nlValues[k + 1]) ? 1 : 0;
  return i;
}

// Nearest indices for x[0..32) at inverse scale id; returns sum(v x) and sum(v^2) through the pointers.
inline void assign_iq4nl(const float* x, float id, uint8_t* L, double* sumvx, double* sumv2) {
  double vx = 0, v2 = 0;
  for (int j = 0; j < 32; ++j) {
    L[j] = static_cast<uint8_t>(nearest_iq4nl(id * x[j]));
    const double v = kIq4nlValues[L[j]];
    vx += v * x[j];
    v2 += v * v;
  }
  *sumvx = vx, *sumv2 = v2;
}

// Best f32 scale for one block of 32 (method in the header). 0 for an all-zero (or non-finite) block.
float best_scale_iq4nl(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  if (!(amax > 1e-30f) || !std::isfinite(amax)) return 0.0f;
  double best_gain = -1, best_d = 0;  // gain = sum(vx)^2 / sum(v^2): the error is sum(x^2) - gain
  uint8_t L[32];
  for (const int end : {-127, 113})
    for (int t = -6; t <= 6; t += 2) {
      double vx, v2;
      assign_iq4nl(x, static_cast<float>(end + t) / max, L, &vx, &v2);
      if (v2 > 0 && vx * vx / v2 > best_gain) best_gain = vx * vx / v2, best_d = vx / v2;
    }
  double vx, v2;
  assign_iq4nl(x, static_cast<float>(1.0 / best_d), L, &vx, &v2);
  return static_cast<float>(v2 > 0 && vx * vx / v2 >= best_gain ? vx / v2 : best_d);
}

inline void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

// Squared error of x[0..32) against dl * codebook at the nearest indices (written to L).
inline double error_at(const float* x, float dl, uint8_t* L) {
  const float id = dl != 0.0f ? 1.0f / dl : 0.0f;
  double e = 0;
  for (int j = 0; j < 32; ++j) {
    L[j] = static_cast<uint8_t>(nearest_iq4nl(id * x[j]));
    const double r = static_cast<double>(x[j]) - static_cast<double>(dl) * kIq4nlValues[L[j]];
    e += r * r;
  }
  return e;
}

// f16 bits of v, saturated to +-65504 (NaN -> 0).
inline uint16_t f16_sat(float v) {
  if (!(v == v)) return 0;
  if (v > 65504.0f) v = 65504.0f;
  if (v < -65504.0f) v = -65504.0f;
  return f32_to_fp16(v);
}

}  // namespace

void quantize_row_iq4_nl(const float* x, block_iq4_nl* y, int64_t n) {
  uint8_t L[32];
  for (int64_t i = 0; i < n / QK4_NL; ++i, x += QK4_NL) {
    y[i].d = f16_sat(best_scale_iq4nl(x));
    (void)error_at(x, fp16_to_f32(y[i].d), L);  // the indices for the stored (rounded) scale
    pack_nibbles(L, y[i].qs);
  }
}

void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, int64_t n) {
  uint8_t L[32];
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float ds[8], max_d = 0.0f;
    for (int s = 0; s < 8; ++s) {
      ds[s] = best_scale_iq4nl(x + 32 * s);
      if (std::fabs(ds[s]) > std::fabs(max_d)) max_d = ds[s];
    }
    y[i].d = f16_sat(-max_d / 32.0f);
    const float D = fp16_to_f32(y[i].d);
    const float iD = D != 0.0f ? 1.0f / D : 0.0f;
    y[i].scales_h = 0;
    std::memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
    for (int s = 0; s < 8; ++s) {
      const float r = ds[s] * iD;
      const int l0 = std::isfinite(r) ? static_cast<int>(std::lround(std::fmax(-40.0f, std::fmin(40.0f, r)))) : 0;
      int best_l = 0;
      double best_e = -1;
      for (int l = l0 - 1; l <= l0 + 1; ++l) {
        if (l < -32 || l > 31) continue;
        const double e = error_at(x + 32 * s, D * static_cast<float>(l), L);
        if (best_e < 0 || e < best_e) best_e = e, best_l = l;
      }
      if (best_e < 0) best_l = l0 < -32 ? -32 : 31;  // l0 - 1 > 31 or l0 + 1 < -32: clamp
      (void)error_at(x + 32 * s, D * static_cast<float>(best_l), L);
      pack_nibbles(L, y[i].qs + 16 * s);
      const int ls = best_l + 32;
      y[i].scales_l[s / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (s % 2)));
      y[i].scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * s));
    }
  }
}

void quantize_row_mxfp4(const float* x, block_mxfp4* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_MXFP4; ++i, x += QK_MXFP4) {
    float amax = 0.0f;
    for (int j = 0; j < QK_MXFP4; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    int e = 0;
    if (amax > 0.0f) {
      // log2f as llama.cpp calls it (its rounding just below a power of two decides e there)
      const float l = std::floor(std::log2(amax)) - 2.0f + 127.0f;
      e = !(l >= 0.0f) ? 0 : l > 255.0f ? 255 : static_cast<int>(l);
    }
    y[i].e = static_cast<uint8_t>(e);
    const float d = e8m0_half_to_f32(y[i].e);
    uint8_t L[QK_MXFP4];
    for (int j = 0; j < QK_MXFP4; ++j) {
      int best = 0;
      float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - x[j]);
      for (int k = 1; k < 16; ++k) {
        const float err = std::fabs(static_cast<float>(kMxfp4Values[k]) * d - x[j]);
        if (err < best_err) best = k, best_err = err;
      }
      L[j] = static_cast<uint8_t>(best);
    }
    pack_nibbles(L, y[i].qs);
  }
}

}  // namespace kiln
