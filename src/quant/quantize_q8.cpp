// 8-bit activation quantizers: Q8_0 and Q8_1 (blocks of 32, f16 scale) and Q8_K (blocks of 256, f32 scale).
//
// These must reproduce llama.cpp's scalar reference quantizers (ggml-quants.c quantize_row_q8_{0,1,K}_ref) bit for
// bit: the CPU matmul quantizes activations with them, and a different rounding shifts logits. So every float
// operation below is the one llama.cpp performs, in the same order, in f32 (this file is compiled as ISO C++, so
// no multiply-add contraction changes a rounding).
//
// Where llama.cpp's encoding is not finite (an f16 scale that overflows to inf, an f32 reciprocal of a denormal
// maximum), kiln saturates instead; those inputs (|x| > ~8.3e6 for Q8_0, block sums > 65504 for Q8_1's s, |max| <
// ~3.7e-37 for Q8_K) give NaN/inf in llama.cpp and never occur in its exactness fixtures.
#include <cmath>
#include <cstring>

#include "quant/reference.h"
#include "util/fp16.h"

// The roundings below must be the ones llama.cpp's scalar code performs: never fuse x*id + c into an FMA.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace kiln {

namespace {

constexpr uint16_t kF16MaxBits = 0x7BFF;  // 65504
constexpr uint16_t kF16InfBits = 0x7C00;

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5*2^23 puts the integer part in the low mantissa bits
// (the f32 addition itself does the rounding). Same results as llama.cpp's nearest_int. NaN gives a garbage int but
// no undefined behaviour (callers clamp).
inline int nearest_int(float v) {
  const float biased = v + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

// roundf (half away from zero) to int8 for values already in [-127, 127]; out-of-range saturates to +-127, NaN
// gives 0 (instead of an undefined float->int conversion).
inline int8_t round_to_i8(float v) {
  const float r = std::roundf(v);
  if (r >= 127.f) return 127;
  if (r <= -127.f) return -127;
  if (!(r == r)) return 0;
  return static_cast<int8_t>(r);
}

// Shared by Q8_0 and Q8_1: d = amax/127 (f32 division), id = d ? 1/d : 0, q = roundf(x*id). Returns d as stored
// (f16 bits, saturated to 65504 with q recomputed for that d when amax/127 rounds to f16 inf).
inline uint16_t quantize_block_32(const float* x, int8_t* q, float* d_out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;  // as ggml's MAX(amax, fabsf(v)): a NaN propagates (then d saturates)
  }
  float d = amax / 127.0f;
  uint16_t dh = f32_to_fp16(d);
  if ((dh & 0x7FFF) >= kF16InfBits) {  // |d| >= 65520: f16 inf (or amax inf)
    dh = kF16MaxBits;
    d = fp16_to_f32(kF16MaxBits);
  }
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = round_to_i8(x[j] * id);
  *d_out = d;
  return dh;
}

}  // namespace

// Q8_0, per block of 32: d = amax/127, id = d ? 1/d : 0 (f32), q[j] = roundf(x[j]*id) (ties away from zero),
// d stored as f16 (round to nearest even). Note the q are computed from the f32 d, not the f16-rounded one.
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n) {
  const int64_t nb = n / QK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    float d;
    y[i].d = quantize_block_32(x + i * QK8_0, y[i].qs, &d);
  }
}

// Q8_1, per block of 32: d and q exactly as Q8_0, plus s = f16(d * sum(q)) with d the f32 (unrounded) scale and
// the integer sum converted to f32 before the product. s saturates to +-65504 where it would be inf.
void quantize_row_q8_1(const float* x, block_q8_1* y, int64_t n) {
  const int64_t nb = n / QK8_1;
  for (int64_t i = 0; i < nb; ++i) {
    float d;
    y[i].d = quantize_block_32(x + i * QK8_1, y[i].qs, &d);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) sum += y[i].qs[j];
    uint16_t sh = f32_to_fp16(static_cast<float>(sum) * d);
    if ((sh & 0x7FFF) >= kF16InfBits) sh = static_cast<uint16_t>((sh & 0x8000) | kF16MaxBits);
    y[i].s = sh;
  }
}

// Q8_K, per block of 256: max = the element of largest |x| (the first one on ties), keeping its sign;
// iscale = -127/max (f32), q[j] = min(127, nearest_int(iscale*x[j])) (ties to even), d = 1/iscale stored as f32
// (so d has the opposite sign of max and the max element encodes as -127), bsums[k] = sum of q[16k..16k+16).
// An all-zero block gives d = 0, q = 0, bsums = 0 (llama.cpp leaves bsums unwritten there).
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      const float a = std::fabs(x[j]);
      if (a > amax) {
        amax = a;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof(y[i].qs));
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    float iscale = -127.f / max;
    float d;
    if (std::isfinite(iscale)) {
      d = 1.0f / iscale;
    } else {
      // |max| < 127/FLT_MAX: llama.cpp's iscale is inf. Scale through double so the block still encodes.
      const double is = -127.0 / static_cast<double>(max);
      d = static_cast<float>(1.0 / is);
      for (int j = 0; j < QK_K; ++j) {
        const double v = std::nearbyint(is * static_cast<double>(x[j]));
        y[i].qs[j] = static_cast<int8_t>(v > 127 ? 127 : (v < -127 ? -127 : (v == v ? v : 0)));
      }
      iscale = 0.0f;  // marks the qs as done
    }
    if (iscale != 0.0f) {
      for (int j = 0; j < QK_K; ++j) {
        int v = nearest_int(iscale * x[j]);
        if (v > 127) v = 127;
        if (v < -128) v = -128;  // only reachable for NaN/inf inputs
        y[i].qs[j] = static_cast<int8_t>(v);
      }
    }
    for (int k = 0; k < QK_K / 16; ++k) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * k + j];
      y[i].bsums[k] = static_cast<int16_t>(sum);
    }
    y[i].d = d;
  }
}

}  // namespace kiln
