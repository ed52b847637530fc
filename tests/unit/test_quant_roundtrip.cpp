// Round trips quantize_row -> dequantize_row for every type kiln quantizes, on gaussian and uniform data, plus edge
// cases (zeros, one huge outlier, huge and denormal magnitudes, one block, several blocks).
//
// Error model (the thresholds): rounding to a grid of step s leaves an error uniform in [-s/2, s/2], RMS s/sqrt(12).
// For each type the test computes, from the data itself, the step the format's simple min/max scaling gives per
// (sub-)block, and predicts rel RMSE = sqrt(sum over blocks of n_b s_b^2/12 / sum x^2):
//   Q8_0/Q8_1/Q8_K  s = amax/127         Q4_0 s = amax/8     Q5_0 s = amax/16
//   Q4_1 s = (max-min)/15                Q5_1 s = (max-min)/31
//   Q4_K s = (max-min0)/15 per 32, Q5_K /31 per 32, Q2_K /3 per 16 (min0 = min(min, 0): the offset is never > 0)
//   Q6_K s = amax/32 per 16              Q3_K s = amax/4 per 16
// The codebook types have no uniform grid; their prediction is the error of their simplest scaling, computed
// element by element here: IQ4_NL / IQ4_XS (group 32) d = max / -127 (the element of largest |x| on the codebook's
// end value -127), every element at its nearest codebook value d * v; MXFP4 the OCP rule (scale 2^(floor(log2
// amax) - 2), nearest E2M1 value). kiln's IQ4 quantizers try that scale among others and refit it (bound 1.1 covers
// the f16 rounding of d and IQ4_XS's 6-bit sub-block scales); MXFP4 is exactly that rule (ratio 1). TQ1_0 / TQ2_0
// (group 256) are exactly theirs too: d = amax, every element at the nearest of {-d, 0, d} (ratio 1, up to the f16
// rounding of d).
// The legacy types and Q8_* are exactly that scheme: measured / predicted ~ 1 (16k samples: ~1% statistical
// spread; f16 rounding of d adds ~2^-11 relative), bound 1.1. The k-quants search for better scales than min/max
// (measured 0.75-0.95x of the prediction) but then round the sub-block scales to 6 bits (4 bits for Q2_K), which can
// coarsen the step by up to 1/(2*63) (1/(2*15)): bound 1.1 for them too, which the 4-bit-scale Q2_K still meets
// because its scale search gains far more than that on 4-level blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "quant/iq_grids.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {
namespace {

enum class Scheme { kSymmetric, kAffine, kAffineMin0, kPerElement, kIq4, kFp4, kTernary };

struct TypeModel {
  DType type;
  int group;       // elements sharing one step
  Scheme scheme;
  float levels;    // step = amax/levels (symmetric), range/levels (affine), |x|*levels (per element); kIq4 / kFp4:
                   // amax/levels bounds the largest rounding error near the block's amax (OneHugeOutlier); kTernary
                   // the same (half the step d = amax)
};

const TypeModel kModels[] = {
    {DType::F16, 1, Scheme::kPerElement, 0x1p-11f},  {DType::BF16, 1, Scheme::kPerElement, 0x1p-8f},
    {DType::Q8_0, 32, Scheme::kSymmetric, 127},      {DType::Q8_1, 32, Scheme::kSymmetric, 127},
    {DType::Q8_K, 256, Scheme::kSymmetric, 127},     {DType::Q4_0, 32, Scheme::kSymmetric, 8},
    {DType::Q5_0, 32, Scheme::kSymmetric, 16},       {DType::Q4_1, 32, Scheme::kAffine, 15},
    {DType::Q5_1, 32, Scheme::kAffine, 31},          {DType::Q2_K, 16, Scheme::kAffineMin0, 3},
    {DType::Q4_K, 32, Scheme::kAffineMin0, 15},      {DType::Q5_K, 32, Scheme::kAffineMin0, 31},
    {DType::Q3_K, 16, Scheme::kSymmetric, 4},        {DType::Q6_K, 16, Scheme::kSymmetric, 32},
    // IQ4: half the codebook's widest gap (24 of 127) ~ amax/10.6; MXFP4: values in (6, 8) x scale round to 6,
    // up to a quarter of amax
    {DType::IQ4_NL, 32, Scheme::kIq4, 8},            {DType::IQ4_XS, 32, Scheme::kIq4, 8},
    {DType::MXFP4, 32, Scheme::kFp4, 3.5f},
    {DType::TQ1_0, 256, Scheme::kTernary, 2},       {DType::TQ2_0, 256, Scheme::kTernary, 2},
};

// How GoogleTest prints the parameter (test listings, failures): readable, not the struct's bytes.
void PrintTo(const TypeModel& m, std::ostream* os) {
  static const char* const kSchemes[] = {"symmetric", "affine", "affine-min0", "per-element", "iq4", "fp4", "ternary"};
  *os << dtype_name(m.type) << " (group " << m.group << ", " << kSchemes[static_cast<int>(m.scheme)] << ", levels "
      << m.levels << ")";
}

std::string type_label(const testing::TestParamInfo<TypeModel>& info) {
  std::string s = dtype_name(info.param.type);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Squared error of one group rounded on a codebook (the simplest scaling, header comment).
double codebook_err2(Scheme scheme, const float* x, int n) {
  static const double kIq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  static const double kFp4[15] = {-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6};
  static const double kTernary[3] = {-1, 0, 1};
  double amax = 0, max = 0;
  for (int j = 0; j < n; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  if (amax == 0) return 0;
  const double d = scheme == Scheme::kIq4       ? max / -127.0
                   : scheme == Scheme::kTernary ? amax
                                                : std::ldexp(1.0, static_cast<int>(std::floor(std::log2(amax))) - 2);
  const double* book = scheme == Scheme::kIq4 ? kIq4 : scheme == Scheme::kTernary ? kTernary : kFp4;
  const int nb = scheme == Scheme::kIq4 ? 16 : scheme == Scheme::kTernary ? 3 : 15;
  double e2 = 0;
  for (int j = 0; j < n; ++j) {
    double best = 1e300;
    for (int k = 0; k < nb; ++k) best = std::min(best, std::fabs(x[j] - d * book[k]));
    e2 += best * best;
  }
  return e2;
}

// Predicted rel RMSE of the min/max grid (see the header comment).
double predicted_rel_rmse(const TypeModel& m, const std::vector<float>& x) {
  double err2 = 0, sig2 = 0;
  for (size_t b = 0; b < x.size(); b += static_cast<size_t>(m.group)) {
    float lo = x[b], hi = x[b], amax = 0;
    for (int j = 0; j < m.group; ++j) {
      const float v = x[b + j];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      amax = std::max(amax, std::fabs(v));
      sig2 += static_cast<double>(v) * v;
      if (m.scheme == Scheme::kPerElement) {
        const double s = std::fabs(v) * m.levels * 2;  // spacing of f16/bf16 values near v: 2 ulp-halves
        err2 += s * s / 12;
      }
    }
    if (m.scheme == Scheme::kIq4 || m.scheme == Scheme::kFp4 || m.scheme == Scheme::kTernary) {
      err2 += codebook_err2(m.scheme, x.data() + b, m.group);
      continue;
    }
    double step = 0;
    if (m.scheme == Scheme::kSymmetric) step = amax / m.levels;
    if (m.scheme == Scheme::kAffine) step = (hi - lo) / m.levels;
    if (m.scheme == Scheme::kAffineMin0) step = (hi - std::min(lo, 0.0f)) / m.levels;
    if (m.scheme != Scheme::kPerElement) err2 += m.group * step * step / 12;
  }
  return std::sqrt(err2 / sig2);
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  auto bytes = dtype_row_bytes(t, n);
  EXPECT_TRUE(bytes.is_ok());
  std::vector<uint8_t> q(bytes.is_ok() ? *bytes : 0);
  std::vector<float> y(x.size(), NAN);
  EXPECT_TRUE(quantize_row(t, x.data(), q.data(), n).is_ok());
  EXPECT_TRUE(dequantize_row(t, q.data(), y.data(), n).is_ok());
  return y;
}

double rel_rmse(const std::vector<float>& y, const std::vector<float>& x) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    s += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

class QuantRoundTrip : public testing::TestWithParam<TypeModel> {};

TEST_P(QuantRoundTrip, GaussianWithinModel) {
  const TypeModel& m = GetParam();
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.02f);  // weight-like magnitude
  std::vector<float> x(64 * 256);
  for (auto& v : x) v = dist(rng);
  const std::vector<float> y = round_trip(m.type, x);
  const double got = rel_rmse(y, x), pred = predicted_rel_rmse(m, x);
  std::printf("%-5s gaussian rel RMSE %.6f (min/max grid model %.6f, ratio %.3f)\n", dtype_name(m.type), got, pred,
              got / pred);
  EXPECT_LE(got, 1.1 * pred);
  EXPECT_GT(got, 0.0);
}

TEST_P(QuantRoundTrip, UniformWithOffsetWithinModel) {
  const TypeModel& m = GetParam();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 3.0f);  // not centered: exercises the mins
  std::vector<float> x(64 * 256);
  for (auto& v : x) v = dist(rng);
  const std::vector<float> y = round_trip(m.type, x);
  const double got = rel_rmse(y, x), pred = predicted_rel_rmse(m, x);
  std::printf("%-5s uniform  rel RMSE %.6f (min/max grid model %.6f, ratio %.3f)\n", dtype_name(m.type), got, pred,
              got / pred);
  EXPECT_LE(got, 1.1 * pred);
}

TEST_P(QuantRoundTrip, ZerosStayZero) {
  const TypeModel& m = GetParam();
  const int64_t bs = dtype_block_size(m.type);
  for (int64_t n : {bs, 3 * bs}) {
    std::vector<float> x(static_cast<size_t>(std::max<int64_t>(n, 256)), 0.0f);
    x.resize(static_cast<size_t>(n));
    const std::vector<float> y = round_trip(m.type, x);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], 0.0f) << i;
  }
}

// One block of 256 (or one per type block) with an outlier 1e3x the rest: the outlier is kept to the format's
// relative step (it sets the scale), everything stays finite, and the other elements are off by at most the
// outlier's step (they are rounded on its grid, possibly to 0).
TEST_P(QuantRoundTrip, OneHugeOutlier) {
  const TypeModel& m = GetParam();
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(512);
  for (auto& v : x) v = dist(rng);
  x[37] = 1000.0f;
  const std::vector<float> y = round_trip(m.type, x);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
  const float rel_step = m.scheme == Scheme::kPerElement ? m.levels : 1.0f / m.levels;
  // Affine formats: the range is max-min ~ 1000 + 3; the 6-bit (4-bit Q2_K) min quantization can add ~1 step.
  EXPECT_NEAR(y[37], 1000.0f, 1000.0f * rel_step * 1.1f + 4.0f * (m.scheme == Scheme::kAffineMin0));
  for (size_t i = 0; i < y.size(); ++i) {
    if (i == 37) continue;
    ASSERT_LE(std::fabs(y[i] - x[i]), std::max(1004.0f * rel_step * 1.1f, 4.0f)) << i;
  }
}

// Magnitudes near the top of f16's range for the scales (amax ~ 3e4 per element) and far beyond it (1e12): no
// NaN/inf, and within range the usual relative accuracy.
TEST_P(QuantRoundTrip, HugeMagnitudes) {
  const TypeModel& m = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(512);
  for (auto& v : x) v = 1e4f * dist(rng);
  std::vector<float> y = round_trip(m.type, x);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
  EXPECT_LE(rel_rmse(y, x), 1.1 * predicted_rel_rmse(m, x));
  if (m.type == DType::F16) return;  // plain f16 cannot hold 1e12 (inf is the correct encoding)
  for (auto& v : x) v *= 1e8f;
  y = round_trip(m.type, x);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
}

// Denormal and tiny inputs: finite output, never larger than the input's magnitude scale (f16 scales flush
// values below ~1e-7 to zero; the f32 formats keep them).
TEST_P(QuantRoundTrip, DenormalsAndTiny) {
  const TypeModel& m = GetParam();
  for (float scale : {1e-40f, 1e-30f, 1e-9f}) {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(512);
    float amax = 0;
    for (auto& v : x) {
      v = scale * dist(rng);
      amax = std::max(amax, std::fabs(v));
    }
    const std::vector<float> y = round_trip(m.type, x);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << scale << " " << i;
      ASSERT_LE(std::fabs(y[i]), 2 * amax) << scale << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantRoundTrip, testing::ValuesIn(kModels), type_label);

TEST(QuantRoundTrip, F32IsIdentityAndF16BF16ExactOnRepresentable) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-24f, 3.140625f};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<float> v = x;
    if (t == DType::BF16) v = {0.0f, 1.0f, -2.5f, 3.140625f, 0x1p100f, -0x1p-130f, 0.0f};
    const std::vector<float> y = round_trip(t, v);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(y[i], v[i]) << dtype_name(t) << " " << i;
  }
}

TEST(QuantRoundTrip, CanQuantizeMatchesCanDequantize) {
  for (uint32_t id = 0; id < kDTypeIdLimit; ++id) {
    if (!dtype_is_valid(id)) continue;
    const DType t = static_cast<DType>(id);
    EXPECT_EQ(can_dequantize(t), dtype_traits(t).has_reference) << dtype_name(t);
    EXPECT_EQ(can_quantize(t), can_dequantize(t) && !is_iquant_grid(t)) << dtype_name(t);
  }
}

// The ternary formats hold {-d, 0, d} exactly: blocks of random trits times an f16-exact d (each block has its
// +-d, so amax = d) come back bit for bit, through every byte position and most of TQ1_0's 243 byte values.
TEST(QuantRoundTrip, TernaryExactOnTernaryValues) {
  std::mt19937 rng(17);
  std::vector<float> x(64 * 256);
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = 0.75f * static_cast<float>(1 + i / 256 % 4);
    x[i] = i % 256 == 0 ? -d : d * static_cast<float>(static_cast<int>(rng() % 3) - 1);
  }
  for (DType t : {DType::TQ1_0, DType::TQ2_0}) {
    const std::vector<float> y = round_trip(t, x);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i]) << dtype_name(t) << " " << i;
  }
}

// llama.cpp's bytes (quantize_row_tq1_0_ref / quantize_row_tq2_0_ref of libggml, recorded) for one block of
// multiples of 1/16 whose amax is 42/16: x / amax = +-1/2 ties round away from zero, as lroundf does.
TEST(QuantRoundTrip, TernaryBytesAsLlamaCpp) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i)
    x[i] = static_cast<float>((i * 37 + 11) % 29 - 14) * static_cast<float>(1 + i % 3) * 0.0625f;
  const struct {
    DType t;
    const char* hex;
  } cases[] = {
      {DType::TQ1_0,
       "5a80d56d7ad19c897e7f89837fd5118180475a7dd5647ad19c897e7f348381d59bd2899b83898180802b769c6034756788f12a7f4041"},
      {DType::TQ2_0,
       "415556618516596515556595555690555558411556518516596515556495555615596515556495555650455554610556598515596595"
       "555495555658415556614041"},
  };
  for (const auto& c : cases) {
    std::vector<uint8_t> q(dtype_type_size(c.t));
    ASSERT_TRUE(quantize_row(c.t, x.data(), q.data(), 256).is_ok());
    std::string hex;
    for (uint8_t b : q) {
      static const char* const kDigits = "0123456789abcdef";
      hex += kDigits[b >> 4];
      hex += kDigits[b & 15];
    }
    EXPECT_EQ(hex, c.hex) << dtype_name(c.t);
  }
}

// TQ2_0's code 3 (never written by the quantizer) decodes to +2d, as ggml's dequantizer does; a zero scale gives 0.
TEST(QuantRoundTrip, Tq2Code3IsTwoD) {
  block_tq2_0 b;
  std::memset(b.qs, 0xFF, sizeof(b.qs));  // every code 3
  b.d = f32_to_fp16(0.5f);
  std::vector<float> y(256);
  ASSERT_TRUE(dequantize_row(DType::TQ2_0, &b, y.data(), 256).is_ok());
  for (float v : y) ASSERT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Invariants of the i-quant tables (quant/iq_grids.h, generated from llama.cpp's decoder): entry counts, the value
// set of each grid, no duplicate entries, and the sign patterns' even-parity rule.
template <class T, size_t N>
void check_grid(const T (&grid)[N], int bytes, std::vector<int> values, const char* name) {
  std::vector<T> sorted(grid, grid + N);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << name << ": duplicate entries";
  std::vector<int> seen;
  for (size_t i = 0; i < N; ++i)
    for (int j = 0; j < bytes; ++j) {
      const int v = static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint64_t>(grid[i]) >> (8 * j)));
      const int u = values.front() < 0 ? v : static_cast<uint8_t>(v);
      ASSERT_NE(std::find(values.begin(), values.end(), u), values.end()) << name << "[" << i << "] byte " << j << " = " << u;
      if (std::find(seen.begin(), seen.end(), u) == seen.end()) seen.push_back(u);
    }
  EXPECT_EQ(seen.size(), values.size()) << name << ": not every grid value is used";
}

TEST(IqGrids, ValueSetsCountsAndNoDuplicates) {
  check_grid(kIq2xxsGrid, 8, {8, 25, 43}, "iq2xxs");
  check_grid(kIq2xsGrid, 8, {8, 25, 43}, "iq2xs");
  check_grid(kIq2sGrid, 8, {8, 25, 43}, "iq2s");
  check_grid(kIq3xxsGrid, 4, {4, 12, 20, 28, 36, 44, 52, 62}, "iq3xxs");
  check_grid(kIq3sGrid, 4, {1, 3, 5, 7, 9, 11, 13, 15}, "iq3s");
  check_grid(kIq1sGrid, 8, {-1, 0, 1}, "iq1s");
  static_assert(sizeof(kIq2xxsGrid) / 8 == 256 && sizeof(kIq2xsGrid) / 8 == 512 && sizeof(kIq2sGrid) / 8 == 1024);
  static_assert(sizeof(kIq3xxsGrid) / 4 == 256 && sizeof(kIq3sGrid) / 4 == 512 && sizeof(kIq1sGrid) / 8 == 2048);
  for (int k = 0; k < 128; ++k) {
    EXPECT_EQ(kIqSigns[k] & 127, k);
    EXPECT_EQ(__builtin_popcount(kIqSigns[k]) % 2, 0) << k;
  }
}

// Element order and scales of each layout (quant/blocks.h), independent of the tables' contents: one group of a
// zeroed block gets a grid index, signs and a scale; its 8 outputs must land at its position with that scale.
TEST(IqGrids, DequantizePlacesOneGroup) {
  const int s = 5, l = 2, e0 = 32 * s + 8 * l;  // sub-block 5, group 2
  const uint16_t one = f32_to_fp16(1.0f);
  auto run = [](DType t, const std::vector<uint8_t>& b) {
    std::vector<float> y(256);
    EXPECT_TRUE(dequantize_row(t, b.data(), y.data(), 256).is_ok());
    return y;
  };
  auto expect_group = [&](const std::vector<float>& y, const std::function<float(int)>& want, const char* name) {
    for (int e = 0; e < 256; ++e) {
      if (e >= e0 && e < e0 + 8) {
        EXPECT_EQ(y[e], want(e - e0)) << name << " element " << e;
      }
    }
  };
  auto g8 = [](uint64_t g, int j) { return static_cast<float>(static_cast<uint8_t>(g >> (8 * j))); };
  auto sgn = [](uint8_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; };
  {  // IQ2_XXS: index 77, sign index 5, scale 3 -> (0.5 + 3) / 4
    std::vector<uint8_t> b(66, 0);
    std::memcpy(b.data(), &one, 2);
    b[2 + 8 * s + l] = 77;
    const uint32_t aux = (5u << (7 * l)) | (3u << 28);
    std::memcpy(b.data() + 2 + 8 * s + 4, &aux, 4);
    expect_group(run(DType::IQ2_XXS, b), [&](int j) { return 0.875f * g8(kIq2xxsGrid[77], j) * sgn(kIqSigns[5], j); },
                 "iq2_xxs");
  }
  {  // IQ2_XS: index 300, sign index 9, high scale nibble 6 (groups 2-3)
    std::vector<uint8_t> b(74, 0);
    std::memcpy(b.data(), &one, 2);
    const uint16_t q = 300 | (9 << 9);
    std::memcpy(b.data() + 2 + 2 * (4 * s + l), &q, 2);
    b[66 + s] = 0x61;
    expect_group(run(DType::IQ2_XS, b), [&](int j) { return 1.625f * g8(kIq2xsGrid[300], j) * sgn(kIqSigns[9], j); },
                 "iq2_xs");
  }
  {  // IQ2_S: index 0x2A5 (qh bits 2l..2l+1 = 2), sign byte 0x5A, high scale nibble 2
    std::vector<uint8_t> b(82, 0);
    std::memcpy(b.data(), &one, 2);
    b[2 + 4 * s + l] = 0xA5;
    b[2 + 32 + 4 * s + l] = 0x5A;
    b[66 + s] = static_cast<uint8_t>(2 << (2 * l));
    b[74 + s] = 0x20;
    expect_group(run(DType::IQ2_S, b), [&](int j) { return 0.625f * g8(kIq2sGrid[0x2A5], j) * sgn(0x5A, j); }, "iq2_s");
  }
  {  // IQ3_XXS: indices 200 (elements 0-3) and 17 (4-7), sign index 100, scale 1 -> (0.5 + 1) / 2
    std::vector<uint8_t> b(98, 0);
    std::memcpy(b.data(), &one, 2);
    b[2 + 8 * s + 2 * l] = 200;
    b[2 + 8 * s + 2 * l + 1] = 17;
    const uint32_t aux = (100u << (7 * l)) | (1u << 28);
    std::memcpy(b.data() + 2 + 64 + 4 * s, &aux, 4);
    expect_group(run(DType::IQ3_XXS, b), [&](int j) {
      return 0.75f * g8(j < 4 ? kIq3xxsGrid[200] : kIq3xxsGrid[17], j % 4) * sgn(kIqSigns[100], j);
    }, "iq3_xxs");
  }
  {  // IQ3_S: indices 0x1FE / 0x003 (qh bit 2l set, 2l+1 clear), sign byte 0xC3, scale nibble of odd s = 4 -> 9
    std::vector<uint8_t> b(110, 0);
    std::memcpy(b.data(), &one, 2);
    b[2 + 8 * s + 2 * l] = 0xFE;
    b[2 + 8 * s + 2 * l + 1] = 0x03;
    b[66 + s] = static_cast<uint8_t>(1 << (2 * l));
    b[74 + 4 * s + l] = 0xC3;
    b[106 + s / 2] = 0x40;
    expect_group(run(DType::IQ3_S, b), [&](int j) {
      return 9.f * g8(j < 4 ? kIq3sGrid[0x1FE] : kIq3sGrid[3], j % 4) * sgn(0xC3, j);
    }, "iq3_s");
  }
  auto i8 = [](uint64_t g, int j) { return static_cast<float>(static_cast<int8_t>(g >> (8 * j))); };
  {  // IQ1_S: index 0x5C3 (qh bits 3l..3l+2 = 5), scale 2 -> 5, negative delta
    std::vector<uint8_t> b(50, 0);
    std::memcpy(b.data(), &one, 2);
    b[2 + 4 * s + l] = 0xC3;
    const uint16_t qh = static_cast<uint16_t>((5 << (3 * l)) | (2 << 12) | 0x8000);
    std::memcpy(b.data() + 34 + 2 * s, &qh, 2);
    expect_group(run(DType::IQ1_S, b), [&](int j) { return 5.f * (i8(kIq1sGrid[0x5C3], j) - 0.125f); }, "iq1_s");
  }
  {  // IQ1_M: d = 2 in the scale words' top nibbles, index 0x3A0 (qh low nibble of byte 2s+1 = 3), positive
     // delta, scale of elements 16-31 of odd s = 6 -> 13
    std::vector<uint8_t> b(56, 0);
    const uint16_t two = f32_to_fp16(2.0f);
    uint16_t sc[4] = {};
    for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(((two >> (4 * k)) & 0xF) << 12);
    sc[s / 2] |= static_cast<uint16_t>(6 << (6 * (s % 2) + 3));
    std::memcpy(b.data() + 48, sc, 8);
    b[4 * s + l] = 0xA0;
    b[32 + 2 * s + 1] = 3;
    expect_group(run(DType::IQ1_M, b), [&](int j) { return 26.f * (i8(kIq1sGrid[0x3A0], j) + 0.125f); }, "iq1_m");
  }
}

TEST(IqGrids, QuantizeRefusesWithAClearError) {
  std::vector<float> x(256, 1.f);
  std::vector<uint8_t> out(256);
  for (DType t : {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S,
                  DType::IQ1_M}) {
    EXPECT_TRUE(can_dequantize(t)) << dtype_name(t);
    EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
    const Status st = quantize_row(t, x.data(), out.data(), 256);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.to_string().find("importance matrix"), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace kiln
