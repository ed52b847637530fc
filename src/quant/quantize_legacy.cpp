// Quantizers for the legacy 32-element formats Q4_0, Q4_1, Q5_0, Q5_1: llama.cpp's reference rounding
// (quantize_row_q{4,5}_{0,1}_ref, used by llama-quantize without an imatrix), reproduced operation for operation,
// so kiln writes the same bytes as llama.cpp for every block whose llama.cpp encoding is finite.
//
//   symmetric (_0):  max = the element of largest |x| keeping its sign, d = max / -2^(b-1), id = d ? 1/d : 0,
//                    q = min(2^b - 1, trunc(x*id + 2^(b-1) + 0.5))   (the max element lands on q = 0)
//   affine (_1):     d = (max - min) / (2^b - 1), id = d ? 1/d : 0, m = min,
//                    q = min(2^b - 1, trunc((x - min)*id + 0.5))
//
// d and m are stored as f16 (round to nearest even) but q is computed from the f32 values. Where d would round to
// f16 inf (|max| > ~5.2e5 for Q4_0), d saturates to +-65504 and q clamps; m saturates likewise.
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

constexpr uint16_t kF16InfBits = 0x7C00;
constexpr uint16_t kF16MaxBits = 0x7BFF;

// f16 bits of v, saturated to +-65504 instead of inf (NaN becomes +65504).
inline uint16_t to_f16_sat(float v, float* rounded) {
  uint16_t h = f32_to_fp16(v);
  if ((h & 0x7FFF) >= kF16InfBits) h = static_cast<uint16_t>(((h & 0x7FFF) == kF16InfBits ? (h & 0x8000) : 0) | kF16MaxBits);
  if (rounded) *rounded = fp16_to_f32(h);
  return h;
}

// trunc(v) clamped to [0, hi] (ggml's MIN(hi, (int8_t)v) for the in-range values it sees; NaN -> 0).
inline int trunc_clamp(float v, int hi) {
  if (!(v >= 0.0f)) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// Symmetric b-bit block of 32: fills q[32] in 0..2^b-1 and returns the stored f16 d.
template <int kBits>
uint16_t quantize_symmetric_32(const float* x, uint8_t* q) {
  constexpr int kHalf = 1 << (kBits - 1);
  constexpr int kMaxQ = (1 << kBits) - 1;
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    if (amax < a) {
      amax = a;
      max = x[j];
    }
  }
  float d = max / static_cast<float>(-kHalf);
  float d_stored;
  const uint16_t dh = to_f16_sat(d, &d_stored);
  if (!(std::fabs(d) < 65520.0f)) d = d_stored;  // saturated (or NaN, which saturates too): quantize with it
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(trunc_clamp(x[j] * id + (static_cast<float>(kHalf) + 0.5f), kMaxQ));
  return dh;
}

// Affine b-bit block of 32: fills q[32] in 0..2^b-1, returns the stored f16 d and sets *mh to the stored f16 min.
template <int kBits>
uint16_t quantize_affine_32(const float* x, uint8_t* q, uint16_t* mh) {
  constexpr int kMaxQ = (1 << kBits) - 1;
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  float d = (max - min) / static_cast<float>(kMaxQ);
  float d_stored;
  const uint16_t dh = to_f16_sat(d, &d_stored);
  if (!(d < 65520.0f)) d = d_stored;  // saturated (or NaN, which saturates too)
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *mh = to_f16_sat(min, nullptr);
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(trunc_clamp((x[j] - min) * id + 0.5f, kMaxQ));
  return dh;
}

// Element j (< 16) goes to the low nibble of qs[j], element j + 16 to the high nibble.
inline void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}

// Bit j of the little-endian u32 = bit 4 of element j.
inline void pack_fifth_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 32; ++j) h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &h, 4);
}

}  // namespace

void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK4_0; ++i) {
    uint8_t q[32];
    y[i].d = quantize_symmetric_32<4>(x + i * QK4_0, q);
    pack_nibbles(q, y[i].qs);
  }
}

void quantize_row_q4_1(const float* x, block_q4_1* y, int64_t n) {
  for (int64_t i = 0; i < n / QK4_1; ++i) {
    uint8_t q[32];
    y[i].d = quantize_affine_32<4>(x + i * QK4_1, q, &y[i].m);
    pack_nibbles(q, y[i].qs);
  }
}

void quantize_row_q5_0(const float* x, block_q5_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK5_0; ++i) {
    uint8_t q[32];
    y[i].d = quantize_symmetric_32<5>(x + i * QK5_0, q);
    pack_nibbles(q, y[i].qs);
    pack_fifth_bits(q, y[i].qh);
  }
}

void quantize_row_q5_1(const float* x, block_q5_1* y, int64_t n) {
  for (int64_t i = 0; i < n / QK5_1; ++i) {
    uint8_t q[32];
    y[i].d = quantize_affine_32<5>(x + i * QK5_1, q, &y[i].m);
    pack_nibbles(q, y[i].qs);
    pack_fifth_bits(q, y[i].qh);
  }
}

}  // namespace kiln
