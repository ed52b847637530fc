// Dequantization of the "legacy" 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
// Each function is the executable spec of its block layout (quant/blocks.h has the structs). Values equal ggml's
// dequantize_row_* (same f32 operations; ggml may fuse q*d + m into one FMA, a difference of at most 1 ulp).
#include "quant/reference.h"

#include <cstring>

#include "util/fp16.h"

namespace kiln {

namespace {

inline uint32_t load_u32_le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // GGUF is little-endian and so are the hosts kiln supports
  return v;
}

}  // namespace

// Q4_0 (18 bytes / 32 elements): f16 d, then 16 bytes of nibbles. Element j (0..15) is the low nibble of qs[j],
// element j+16 the high nibble of qs[j]. Value = d * (q - 8), q in 0..15.
void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n) {
  const int64_t nb = n / QK4_0;
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// Q4_1 (20 bytes / 32 elements): f16 d, f16 m, nibbles as Q4_0. Value = d * q + m, q in 0..15.
void dequantize_row_q4_1(const block_q4_1* x, float* y, int64_t n) {
  const int64_t nb = n / QK4_1;
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[j + QK4_1 / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0 (22 bytes / 32 elements): f16 d, u32 qh (little-endian; bit j = 5th bit of element j), nibbles as Q4_0
// for the low 4 bits. Value = d * (q - 16), q in 0..31.
void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n) {
  const int64_t nb = n / QK5_0;
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_u32_le(x[i].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int q0 = (x[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
      const int q1 = (x[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(q0 - 16) * d;
      y[j + QK5_0 / 2] = static_cast<float>(q1 - 16) * d;
    }
  }
}

// Q5_1 (24 bytes / 32 elements): f16 d, f16 m, u32 qh, nibbles, bit layout as Q5_0. Value = d * q + m, q in 0..31.
void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n) {
  const int64_t nb = n / QK5_1;
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_u32_le(x[i].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int q0 = (x[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
      const int q1 = (x[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(q0) * d + m;
      y[j + QK5_1 / 2] = static_cast<float>(q1) * d + m;
    }
  }
}

// Q8_0 (34 bytes / 32 elements): f16 d, 32 int8 q in element order. Value = d * q.
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n) {
  const int64_t nb = n / QK8_0;
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// Q8_1 (36 bytes / 32 elements): f16 d, f16 s (= d * sum(q), only used by dot products), 32 int8 q.
// Value = d * q.
void dequantize_row_q8_1(const block_q8_1* x, float* y, int64_t n) {
  const int64_t nb = n / QK8_1;
  for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK8_1; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

}  // namespace kiln
