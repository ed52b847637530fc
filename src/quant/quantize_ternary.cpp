// Quantizers of the ternary formats TQ1_0 and TQ2_0 (layouts in quant/blocks.h): llama.cpp's reference rounding
// (quantize_row_tq{1,2}_0_ref, what llama-quantize writes), so kiln writes the same bytes for every block whose
// scale is a finite f16. Per block of 256: d = amax (the largest |x|), each element the nearest of {-1, 0, 1} after
// multiplying by 1/amax, halves away from zero (lroundf); d is stored as f16, saturated to +-65504 where llama.cpp's
// conversion would give inf (the trits are unchanged). An element that is NaN, or whose x/amax is (inf or NaN: a
// block of denormals whose 1/amax overflows) rounds like any other value: NaN to 0.
#include <cmath>

#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {

namespace {

// The block's amax (NaN elements are skipped) and its stored f16 scale; *id = 1/amax (0 for an all-zero block).
uint16_t ternary_scale(const float* x, float* id) {
  float amax = 0.0f;
  for (int j = 0; j < QK_K; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]);
  *id = amax != 0.0f ? 1.0f / amax : 0.0f;
  return f32_to_fp16(std::fmin(amax, 65504.0f));
}

// lroundf(v) + 1 for v in [-1, 1] (and 0 -> 1 for NaN): the code of the nearest of {-1, 0, 1}.
inline int trit(float v) { return v >= 0.5f ? 2 : v <= -0.5f ? 0 : 1; }

// Packs k trits (first most significant) of base-3 number q into the byte ceil(q * 256 / 243) (k = 5; four trits
// are shifted up one place first, so the byte's fifth trit is 0).
inline uint8_t pack_trits(int q) { return static_cast<uint8_t>((q * 256 + 242) / 243); }

}  // namespace

void quantize_row_tq1_0(const float* x, block_tq1_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float id;
    y[i].d = ternary_scale(x, &id);
    for (int m = 0; m < 32; ++m) {  // elements 32t + m
      int q = 0;
      for (int t = 0; t < 5; ++t) q = 3 * q + trit(x[32 * t + m] * id);
      y[i].qs[m] = pack_trits(q);
    }
    for (int m = 0; m < 16; ++m) {  // elements 160 + 16t + m
      int q = 0;
      for (int t = 0; t < 5; ++t) q = 3 * q + trit(x[160 + 16 * t + m] * id);
      y[i].qs[32 + m] = pack_trits(q);
    }
    for (int j = 0; j < 4; ++j) {  // elements 240 + 4t + j
      int q = 0;
      for (int t = 0; t < 4; ++t) q = 3 * q + trit(x[240 + 4 * t + j] * id);
      y[i].qh[j] = pack_trits(3 * q);
    }
  }
}

void quantize_row_tq2_0(const float* x, block_tq2_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float id;
    y[i].d = ternary_scale(x, &id);
    for (int j = 0; j < 2; ++j)
      for (int m = 0; m < 32; ++m) {
        int q = 0;
        for (int l = 0; l < 4; ++l) q |= trit(x[128 * j + 32 * l + m] * id) << (2 * l);
        y[i].qs[32 * j + m] = static_cast<uint8_t>(q);
      }
  }
}

}  // namespace kiln
