// Dequantization of the ternary formats TQ1_0 and TQ2_0 (layouts in quant/blocks.h). Every value is d * (t - 1)
// with t a small integer: the same f32 values as ggml's dequantize_row_tq{1,2}_0.
#include "quant/reference.h"

#include "util/fp16.h"

namespace kiln {

// TQ1_0 (54 bytes / 256 elements): qs[48] of 5 trits, qh[4] of 4 trits, f16 d; element order in blocks.h.
void dequantize_row_tq1_0(const block_tq1_0* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 32; ++m) y[32 * t + m] = static_cast<float>(tq1_trit(x[i].qs[m], t) - 1) * d;
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 16; ++m) y[160 + 16 * t + m] = static_cast<float>(tq1_trit(x[i].qs[32 + m], t) - 1) * d;
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 4; ++j) y[240 + 4 * t + j] = static_cast<float>(tq1_trit(x[i].qh[j], t) - 1) * d;
  }
}

// TQ2_0 (66 bytes / 256 elements): qs[64] of four 2-bit codes c each, f16 d; x = (c - 1) * d.
void dequantize_row_tq2_0(const block_tq2_0* x, float* y, int64_t n) {
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m)
          y[128 * j + 32 * l + m] = static_cast<float>(((x[i].qs[32 * j + m] >> (2 * l)) & 3) - 1) * d;
  }
}

}  // namespace kiln
