// Quantizers for the k-quant super-block formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (QK_K = 256).
//
// Method (kiln's own; it does not reproduce llama.cpp's bytes, only its error level, see
// test_gguf_quant_fixtures.cpp):
//  1. Per sub-block, fit the scale (and for the affine types the min) by a small search: for a handful of candidate
//     scales around range/levels, round every element to the nearest level, then refit the scale (and min) by
//     least squares to those levels; keep the candidate with the smallest squared error. Affine types keep the
//     offset <= 0 (the format stores value = d*sc*q - dmin*m with m >= 0), as when a sub-block is all positive.
//  2. Quantize the sub-block scales (and mins) against the super-block's largest one: 6 bits for Q3_K/Q4_K/Q5_K,
//     4 bits for Q2_K, 8 bits (int8) for Q6_K, with the super-block scale stored as f16.
//  3. Requantize every element with the scales as stored (f16 d times the integer sub-scale), so the levels are
//     optimal for what the dequantizer will actually compute.
// All-zero sub-blocks get scale 0; super-block scales saturate at the f16 maximum instead of becoming inf (values
// beyond ~6e7 for Q4_K then clamp), and scales below the f16 subnormal range flush to 0; no path yields NaN/inf.
#include <cmath>
#include <cstring>

#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {

namespace {

// Nearest integer (ties to even) clamped to [lo, hi], with a defined result for every input (NaN -> the level
// nearest 0, as from 0 * inf in a denormal block).
inline int round_clamp(float v, int lo, int hi) {
  if (v != v) return lo > 0 ? lo : (hi < 0 ? hi : 0);
  if (v <= static_cast<float>(lo)) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// f16 bits of a non-negative scale, saturated to 65504; *stored receives the value the dequantizer will see.
inline uint16_t scale_to_f16(float v, float* stored) {
  uint16_t h = f32_to_fp16(v);
  if (!(v >= 0.0f) || (h & 0x7FFF) >= 0x7C00) h = (v > 0.0f) ? 0x7BFF : 0;
  *stored = fp16_to_f32(h);
  return h;
}

// Affine fit of n values to levels 0..nmax: value ~= scale*q - m with scale >= 0, m >= 0. Writes the levels to L.
void fit_affine(const float* x, int n, int nmax, float* scale, float* m, uint8_t* L) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
  }
  if (lo > 0.0f) lo = 0.0f;  // the offset cannot be positive
  if (!(hi > lo)) {          // constant block (all zero, or all equal <= 0)
    *scale = 0.0f;
    *m = -lo;
    std::memset(L, 0, static_cast<size_t>(n));
    return;
  }
  float best_err = INFINITY, best_a = 0.0f, best_b = lo;
  uint8_t cand[32];
  // Candidates: levels spanning the range at (nmax + k/4) steps, k in -4..8 (shrinking the step clips the
  // extremes, growing it lets the refit move the offset).
  for (int k = -4; k <= 8; ++k) {
    const float iscale = (static_cast<float>(nmax) + 0.25f * static_cast<float>(k)) / (hi - lo);
    double sL = 0, sL2 = 0, sx = 0, sLx = 0;
    for (int i = 0; i < n; ++i) {
      const int q = round_clamp(iscale * (x[i] - lo), 0, nmax);
      cand[i] = static_cast<uint8_t>(q);
      sL += q;
      sL2 += static_cast<double>(q) * q;
      sx += x[i];
      sLx += static_cast<double>(q) * x[i];
    }
    // Least squares for x ~= a*q + b, then the constraint b <= 0.
    const double det = n * sL2 - sL * sL;
    double a, b;
    if (det > 0) {
      a = (n * sLx - sL * sx) / det;
      b = (sL2 * sx - sL * sLx) / det;
      if (b > 0) {
        b = 0;
        a = sLx / sL2;
      }
    } else {
      continue;  // all elements on one level: no information on the scale
    }
    if (!(a > 0)) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = a * cand[i] + b - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best_a = static_cast<float>(a);
      best_b = static_cast<float>(b);
      std::memcpy(L, cand, static_cast<size_t>(n));
    }
  }
  if (!(best_err < INFINITY)) {  // no candidate usable: plain min/max mapping
    best_a = (hi - lo) / static_cast<float>(nmax);
    best_b = lo;
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(round_clamp((x[i] - lo) / best_a, 0, nmax));
  }
  *scale = best_a;
  *m = -best_b;
}

// Symmetric fit of n values to levels qmin..qmax (qmin = -qmax - 1): value ~= scale*q; the scale may be negative
// (so the larger |level| range, -qmin, can land on either sign). Returns the scale.
float fit_symmetric(const float* x, int n, int qmin, int qmax) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (!(amax > 0.0f)) return 0.0f;
  float best_err = INFINITY, best_s = max / static_cast<float>(qmin);
  // Candidates: the max element on level qmin (scale of the sign that allows it) or on qmax, each shrunk/grown.
  for (int side = 0; side < 2; ++side) {
    const float base = side == 0 ? static_cast<float>(qmin) / max : static_cast<float>(qmax) / max;
    for (int k = -3; k <= 6; ++k) {
      const float iscale = base * (1.0f + 0.04f * static_cast<float>(k));
      double sq2 = 0, sqx = 0;
      for (int i = 0; i < n; ++i) {
        const int q = round_clamp(iscale * x[i], qmin, qmax);
        sq2 += static_cast<double>(q) * q;
        sqx += static_cast<double>(q) * x[i];
      }
      if (!(sq2 > 0)) continue;
      const double s = sqx / sq2;  // least-squares scale for these levels
      double err = 0;
      for (int i = 0; i < n; ++i) {
        const double e = s * round_clamp(iscale * x[i], qmin, qmax) - x[i];
        err += e * e;
      }
      if (err < best_err) {
        best_err = static_cast<float>(err);
        best_s = static_cast<float>(s);
      }
    }
  }
  return best_s;
}

// Shared by Q2_K/Q4_K/Q5_K: fits n_sub affine sub-blocks of `sub` elements with levels 0..nmax, quantizes the
// sub-scales and sub-mins to 0..smax against f16 super-scales, and writes the final levels to L.
struct AffineSuper {
  uint16_t d, dmin;
  uint8_t ls[16], lm[16];
  uint8_t L[QK_K];
};

void quantize_affine_super(const float* x, int n_sub, int sub, int nmax, int smax, AffineSuper* out) {
  float scales[16], mins[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < n_sub; ++j) {
    fit_affine(x + sub * j, sub, nmax, &scales[j], &mins[j], out->L + sub * j);
    max_scale = std::fmax(max_scale, scales[j]);
    max_min = std::fmax(max_min, mins[j]);
  }
  float d, dmin;
  out->d = scale_to_f16(max_scale / static_cast<float>(smax), &d);
  out->dmin = scale_to_f16(max_min / static_cast<float>(smax), &dmin);
  for (int j = 0; j < n_sub; ++j) {
    out->ls[j] = static_cast<uint8_t>(d > 0.0f ? round_clamp(scales[j] / d, 0, smax) : 0);
    out->lm[j] = static_cast<uint8_t>(dmin > 0.0f ? round_clamp(mins[j] / dmin, 0, smax) : 0);
    const float dl = d * static_cast<float>(out->ls[j]);
    const float ml = dmin * static_cast<float>(out->lm[j]);
    for (int i = 0; i < sub; ++i) {
      out->L[sub * j + i] = static_cast<uint8_t>(dl > 0.0f ? round_clamp((x[sub * j + i] + ml) / dl, 0, nmax) : 0);
    }
  }
}

// Shared by Q3_K/Q6_K: 16 symmetric sub-blocks of 16 with levels qmin..qmax, signed sub-scales in
// -smax..smax against an f16 super-scale; writes the final levels (signed) to L.
uint16_t quantize_symmetric_super(const float* x, int qmin, int qmax, int smax, int8_t* ls, int8_t* L) {
  float scales[16];
  float max_abs = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_symmetric(x + 16 * j, 16, qmin, qmax);
    max_abs = std::fmax(max_abs, std::fabs(scales[j]));
  }
  float d;
  const uint16_t dh = scale_to_f16(max_abs / static_cast<float>(smax), &d);
  for (int j = 0; j < 16; ++j) {
    ls[j] = static_cast<int8_t>(d > 0.0f ? round_clamp(scales[j] / d, -smax, smax) : 0);
    const float dl = d * static_cast<float>(ls[j]);
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(dl != 0.0f ? round_clamp(x[16 * j + i] / dl, qmin, qmax) : 0);
  }
  return dh;
}

}  // namespace

// Q2_K: 16 affine sub-blocks of 16, levels 0..3, 4-bit scales and mins (layout at dequantize_row_q2_K).
void quantize_row_q2_K(const float* x, block_q2_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    AffineSuper s;
    quantize_affine_super(x, 16, 16, 3, 15, &s);
    y[i].d = s.d;
    y[i].dmin = s.dmin;
    for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(s.ls[j] | (s.lm[j] << 4));
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      y[i].qs[32 * h + l] |= static_cast<uint8_t>(s.L[e] << (2 * k));
    }
  }
}

// Q3_K: 16 symmetric sub-blocks of 16, levels -4..3, signed 6-bit scales (-31..31 used), f16 d
// (layout at dequantize_row_q3_K, scale packing at q3k_unpack_scales).
void quantize_row_q3_K(const float* x, block_q3_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t ls[16], L[QK_K];
    y[i].d = quantize_symmetric_super(x, -4, 3, 31, ls, L);
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    for (int j = 0; j < 16; ++j) {
      const int raw = ls[j] + 32;  // 1..63
      if (j < 8) y[i].scales[j] |= static_cast<uint8_t>(raw & 0xF);
      else y[i].scales[j - 8] |= static_cast<uint8_t>((raw & 0xF) << 4);
      y[i].scales[8 + (j % 4)] |= static_cast<uint8_t>((raw >> 4) << (2 * (j / 4)));
    }
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int q = L[e] + 4;  // 0..7
      y[i].qs[32 * h + l] |= static_cast<uint8_t>((q & 3) << (2 * k));
      y[i].hmask[l] |= static_cast<uint8_t>((q >> 2) << (4 * h + k));
    }
  }
}

namespace {

// 6-bit scales and mins of 8 sub-blocks into 12 bytes (inverse of kquant_scale_min in blocks.h).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  std::memset(s, 0, K_SCALE_SIZE);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= ls[j] & 63;
      s[j + 4] |= lm[j] & 63;
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

}  // namespace

// Q4_K: 8 affine sub-blocks of 32, levels 0..15, 6-bit scales and mins (layout at dequantize_row_q4_K).
void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    AffineSuper s;
    quantize_affine_super(x, 8, 32, 15, 63, &s);
    y[i].d = s.d;
    y[i].dmin = s.dmin;
    pack_scale_min_k4(s.ls, s.lm, y[i].scales);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        y[i].qs[32 * c + l] = static_cast<uint8_t>(s.L[64 * c + l] | (s.L[64 * c + 32 + l] << 4));
  }
}

// Q5_K: 8 affine sub-blocks of 32, levels 0..31, 6-bit scales and mins (layout at dequantize_row_q5_K).
void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    AffineSuper s;
    quantize_affine_super(x, 8, 32, 31, 63, &s);
    y[i].d = s.d;
    y[i].dmin = s.dmin;
    pack_scale_min_k4(s.ls, s.lm, y[i].scales);
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        y[i].qs[32 * c + l] = static_cast<uint8_t>((s.L[64 * c + l] & 0xF) | ((s.L[64 * c + 32 + l] & 0xF) << 4));
    for (int sb = 0; sb < 8; ++sb)
      for (int l = 0; l < 32; ++l) y[i].qh[l] |= static_cast<uint8_t>((s.L[32 * sb + l] >> 4) << sb);
  }
}

// Q6_K: 16 symmetric sub-blocks of 16, levels -32..31, int8 scales (-127..127 used), f16 d
// (layout at dequantize_row_q6_K).
void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t ls[16], L[QK_K];
    y[i].d = quantize_symmetric_super(x, -32, 31, 127, ls, L);
    std::memcpy(y[i].scales, ls, 16);
    std::memset(y[i].ql, 0, sizeof(y[i].ql));
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int q = L[e] + 32;  // 0..63
      y[i].ql[64 * h + l + 32 * (k % 2)] |= static_cast<uint8_t>((q & 0xF) << (4 * (k / 2)));
      y[i].qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
    }
  }
}

}  // namespace kiln
