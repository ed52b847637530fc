// The 8-bit activation quantizers Q8_0, Q8_1 and Q8_K: hand-checked blocks and invariants. Bit-exactness with
// llama.cpp on real tensors is checked in test_gguf_quant_fixtures.cpp (Q8_0 against llama-quantize's output).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(QuantQ8_0, HandCheckedBlock) {
  // amax = 2.54 -> d = 0.02 (f32), id = 1/d; x = k * 0.02 quantizes to k.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 0.0f;
  x[0] = 2.54f;
  x[1] = -1.0f;   // -1/0.02 = -50
  x[2] = 0.01f;   // ~0.5 (not exactly: id is a rounded reciprocal); checked against the formula
  x[3] = -0.03f;  // -1.5 -> -2 (away from zero)
  block_q8_0 b;
  quantize_row_q8_0(x, &b, 32);
  const float d = 2.54f / 127.0f;
  const float id = 1.0f / d;
  EXPECT_EQ(b.d, f32_to_fp16(d));
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], static_cast<int8_t>(std::roundf(-1.0f * id)));
  EXPECT_EQ(b.qs[1], -50);
  EXPECT_EQ(b.qs[2], static_cast<int8_t>(std::roundf(0.01f * id)));
  EXPECT_EQ(b.qs[3], static_cast<int8_t>(std::roundf(-0.03f * id)));
  for (int j = 4; j < 32; ++j) EXPECT_EQ(b.qs[j], 0);
}

TEST(QuantQ8_0, TiesRoundAwayFromZero) {
  // amax = 127 gives d = 1, id = 1 exactly, so x*id is x: ties are visible.
  float x[32] = {};
  x[0] = 127.0f;
  x[1] = 0.5f;
  x[2] = -0.5f;
  x[3] = 2.5f;
  x[4] = -2.5f;
  block_q8_0 b;
  quantize_row_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, f32_to_fp16(1.0f));
  EXPECT_EQ(b.qs[1], 1);
  EXPECT_EQ(b.qs[2], -1);
  EXPECT_EQ(b.qs[3], 3);
  EXPECT_EQ(b.qs[4], -3);
}

TEST(QuantQ8_0, ZeroBlockAndSeveralBlocks) {
  std::vector<float> x = gaussian(96, 1);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;
  std::vector<block_q8_0> b(3);
  ASSERT_TRUE(quantize_row(DType::Q8_0, x.data(), b.data(), 96).is_ok());
  EXPECT_EQ(b[1].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b[1].qs[j], 0);
  std::vector<float> y(96);
  ASSERT_TRUE(dequantize_row(DType::Q8_0, b.data(), y.data(), 96).is_ok());
  for (int i = 0; i < 96; ++i) {
    // |error| <= d/2 (rounding) + amax * 2^-11 (f16 rounding of d, relative 2^-11, times |q| <= 127 d).
    const int blk = i / 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
    EXPECT_LE(std::fabs(y[i] - x[i]), amax / 127 * 0.5f + amax * 0x1p-11f + 1e-7f) << i;
  }
}

TEST(QuantQ8_0, HugeBlockSaturatesScaleInsteadOfInf) {
  float x[32] = {};
  x[0] = 1e10f;  // amax/127 is far beyond f16: llama.cpp would store inf
  x[1] = -5e9f;
  block_q8_0 b;
  quantize_row_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x7BFF);  // 65504
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], -127);
}

TEST(QuantQ8_1, SumInvariantAndHandChecked) {
  std::vector<float> x = gaussian(64, 2, 3.0f);
  x[5] = -9.0f;  // the block max is negative
  std::vector<block_q8_1> b(2);
  ASSERT_TRUE(quantize_row(DType::Q8_1, x.data(), b.data(), 64).is_ok());
  std::vector<block_q8_0> b0(2);
  quantize_row_q8_0(x.data(), b0.data(), 64);
  for (int i = 0; i < 2; ++i) {
    // d and q are exactly Q8_0's; s = f16(f32 d * sum(q)).
    EXPECT_EQ(b[i].d, b0[i].d);
    EXPECT_EQ(std::memcmp(b[i].qs, b0[i].qs, 32), 0);
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * i + j]));
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += b[i].qs[j];
    EXPECT_EQ(b[i].s, f32_to_fp16(static_cast<float>(sum) * (amax / 127.0f)));
  }
  EXPECT_EQ(b[0].qs[5], -127);
}

TEST(QuantQ8_K, MaxNegativeElementHandChecked) {
  // max (largest |x|, sign kept) = -2: iscale = -127/max = 63.5, q = nearest_int(63.5 x) (ties to even), clamped
  // to 127; d = 1/iscale. The max element maps to -127.
  float x[256] = {};
  x[0] = -2.0f;
  x[1] = 1.0f;          // 63.5 -> 64 (tie to even)
  x[2] = 0.5f;          // 31.75 -> 32
  x[17] = -1.0f;        // -63.5 -> -64 (tie to even)
  x[20] = 3.0f / 127;   // 1.5 (up to an ulp) -> 2 or 1; checked against the formula
  x[255] = 2.0f;        // same |x| as the max but later: the first one is max; 2 -> 127
  block_q8_K b;
  quantize_row_q8_K(x, &b, 256);
  EXPECT_EQ(b.d, 1.0f / 63.5f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], 64);
  EXPECT_EQ(b.qs[2], 32);
  EXPECT_EQ(b.qs[17], -64);
  EXPECT_EQ(b.qs[20], static_cast<int8_t>(std::nearbyint(63.5f * x[20])));
  EXPECT_EQ(b.qs[255], 127);
  EXPECT_EQ(b.bsums[0], -127 + 64 + 32);
  EXPECT_EQ(b.bsums[1], -64 + b.qs[20]);
  EXPECT_EQ(b.bsums[15], 127);
  for (int k = 2; k < 15; ++k) EXPECT_EQ(b.bsums[k], 0) << k;
}

TEST(QuantQ8_K, MaxPositiveGivesNegativeScale) {
  float x[256] = {};
  x[7] = 4.0f;    // iscale = -31.75
  x[8] = -4.0f;   // 127, not clamped
  x[9] = 1.0f;    // -31.75 -> -32
  block_q8_K b;
  quantize_row_q8_K(x, &b, 256);
  EXPECT_EQ(b.d, 1.0f / (-127.0f / 4.0f));
  EXPECT_LT(b.d, 0.0f);
  EXPECT_EQ(b.qs[7], -127);
  EXPECT_EQ(b.qs[8], 127);
  EXPECT_EQ(b.qs[9], -32);
  float y[256];
  dequantize_row_q8_K(&b, y, 256);
  EXPECT_NEAR(y[7], 4.0f, 1e-6f);
  EXPECT_NEAR(y[9], 32.0f / 31.75f, 1e-6f);
}

TEST(QuantQ8_K, ZeroBlockAndBsumsInvariant) {
  std::vector<float> x = gaussian(3 * 256, 3);
  for (int j = 256; j < 512; ++j) x[j] = 0.0f;
  std::vector<block_q8_K> b(3);
  std::memset(b.data(), 0x5A, b.size() * sizeof(block_q8_K));
  ASSERT_TRUE(quantize_row(DType::Q8_K, x.data(), b.data(), 768).is_ok());
  EXPECT_EQ(b[1].d, 0.0f);
  for (int j = 0; j < 256; ++j) ASSERT_EQ(b[1].qs[j], 0);
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 16; ++k) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * k + j];
      EXPECT_EQ(b[i].bsums[k], sum) << i << " " << k;
    }
  }
  std::vector<float> y(768);
  ASSERT_TRUE(dequantize_row(DType::Q8_K, b.data(), y.data(), 768).is_ok());
  for (int i = 0; i < 768; ++i) {
    // |error| <= |d|/2 + f32 rounding: |d| = amax/127.
    float amax = 0;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[(i / 256) * 256 + j]));
    EXPECT_LE(std::fabs(y[i] - x[i]), amax / 127 * 0.5f * 1.0001f + 1e-7f) << i;
  }
}

TEST(QuantQ8_K, DenormalMaxStillEncodes) {
  // |max| < 127/FLT_MAX: llama.cpp's f32 iscale is inf; kiln scales through double.
  float x[256] = {};
  x[0] = 1e-40f;   // denormal
  x[1] = -5e-41f;
  block_q8_K b;
  quantize_row_q8_K(x, &b, 256);
  EXPECT_TRUE(std::isfinite(b.d));
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], static_cast<int8_t>(std::nearbyint(-127.0 * -5e-41 / 1e-40)));
}

TEST(QuantQ8, RejectsBadRowLength) {
  float x[64] = {};
  block_q8_K b[1];
  EXPECT_FALSE(quantize_row(DType::Q8_K, x, b, 64).is_ok());
  EXPECT_FALSE(quantize_row(DType::Q8_0, x, b, 33).is_ok());
  EXPECT_FALSE(dequantize_row(DType::Q8_0, b, x, -32).is_ok());
  EXPECT_FALSE(dequantize_row(DType::I8, b, x, 256).is_ok());  // no dequantizer
  EXPECT_FALSE(dequantize_row(DType::Q8_0, nullptr, x, 32).is_ok());
  EXPECT_TRUE(dequantize_row(DType::Q8_0, nullptr, nullptr, 0).is_ok());
}

}  // namespace
}  // namespace kiln
