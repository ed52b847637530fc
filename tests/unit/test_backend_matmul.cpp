// CPU matmul: every SIMD level against the scalar spec (matmul_ref), matmul_ref against a double-precision product
// of the dequantized weights, the fast path's activation quantizers against quant/reference.h byte for byte, and
// argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/iq_decode.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "common/test_util.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln::cpu {
namespace {

const DType kTypes[] = {DType::F32,     DType::F16,    DType::BF16,   DType::Q4_0,    DType::Q4_1,
                        DType::Q5_0,    DType::Q5_1,   DType::Q8_0,   DType::Q2_K,    DType::Q3_K,
                        DType::Q4_K,    DType::Q5_K,   DType::Q6_K,   DType::IQ4_NL,  DType::IQ4_XS,
                        DType::MXFP4,   DType::TQ1_0,  DType::TQ2_0,  DType::IQ2_XXS, DType::IQ2_XS,
                        DType::IQ2_S,   DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S,   DType::IQ1_M};

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> v = {SimdLevel::kScalar};
  if (cpu_simd_level() >= SimdLevel::kAvx2) v.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() >= SimdLevel::kAvx512) v.push_back(SimdLevel::kAvx512);
  return v;
}

// Byte offsets of the f16 scale fields of one block (set to sane values after the random fill).
std::vector<int> scale_offsets(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::IQ4_XS: return {0};
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S:
      return {0};
    case DType::Q4_1: case DType::Q5_1: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q6_K: return {208};
    case DType::TQ1_0: return {52};
    case DType::TQ2_0: return {64};
    default: return {};
  }
}

// Random weights: quantized types get uniformly random bytes (every quant/scale bit pattern, including q8_0's
// -128 and q6_K's scale -128) with f16 scales in +-[1e-3, 1e-2] (MXFP4: E8M0 exponents for 2^-10..2^-4, the
// doubled codes' half scale 2^-11..2^-5); float types get N(0, 1) values.
std::vector<uint8_t> random_weights(DType t, int64_t n_out, int64_t n_in, size_t row_bytes, std::mt19937& rng) {
  std::vector<uint8_t> w(row_bytes * n_out + 64);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> sd(1e-3f, 1e-2f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const int64_t bs = dtype_block_size(t), ts = dtype_type_size(t);
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* row = w.data() + o * row_bytes;
    if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
      for (int64_t i = 0; i < n_in; ++i) {
        const float v = nd(rng);
        if (t == DType::F32) std::memcpy(row + 4 * i, &v, 4);
        const uint16_t h = t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
        if (t != DType::F32) std::memcpy(row + 2 * i, &h, 2);
      }
      continue;
    }
    if (t == DType::MXFP4)
      for (int64_t b = 0; b < n_in / bs; ++b) row[b * ts] = static_cast<uint8_t>(117 + byte(rng) % 7);
    for (int64_t b = 0; b < n_in / bs; ++b)
      for (int off : scale_offsets(t)) {
        const uint16_t h = f32_to_fp16(byte(rng) & 1 ? sd(rng) : -sd(rng));
        std::memcpy(row + b * ts + off, &h, 2);
      }
    if (t == DType::IQ1_M)  // d in the top nibbles of the 4 scale words (bytes 48..55)
      for (int64_t b = 0; b < n_in / bs; ++b) {
        const uint16_t h = f32_to_fp16(byte(rng) & 1 ? sd(rng) : -sd(rng));
        for (int k = 0; k < 4; ++k) {
          uint8_t& hi = row[b * ts + 48 + 2 * k + 1];
          hi = static_cast<uint8_t>((hi & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
        }
      }
  }
  return w;
}

// Activations: N(0, s_t) per row with the row scale s_t spread over 1e-2..1e2; odd rows also carry 20x outliers
// (every 97th element), and the first 32 elements of row 0 are zero (the zero-scale case of the quantizers).
std::vector<float> random_x(int64_t n_tok, int64_t n_in, size_t stride, std::mt19937& rng) {
  std::vector<float> x(stride * n_tok + 1, 0.f);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float s = std::pow(10.f, static_cast<float>(t % 5) - 2.f);
    for (int64_t i = 0; i < n_in; ++i) x[t * stride + i] = s * nd(rng) * (t % 2 == 1 && i % 97 == 5 ? 20.f : 1.f);
  }
  for (int64_t i = 0; i < 32 && i < n_in && n_in >= 64; ++i) x[i] = 0.f;
  return x;
}

// The arguments of one product: n_tok rows of x (stride xs floats) times the n_out rows of w (rb bytes apart) into y
// (stride ys floats).
MatmulArgs product(DType t, const uint8_t* w, size_t rb, int64_t n_out, int64_t n_in, const float* x, size_t xs,
                   int64_t n_tok, float* y, size_t ys) {
  MatmulArgs a;
  a.wtype = t;
  a.w = w;
  a.w_row_bytes = rb;
  a.n_out = n_out;
  a.n_in = n_in;
  a.x = x;
  a.x_stride = xs;
  a.n_tok = n_tok;
  a.y = y;
  a.y_stride = ys;
  return a;
}

// matmul_ref against the exact (double) product of the dequantized weights with the unrounded activations.
// The spec's only approximation is the rounding of each activation x_i to the activation type, so per output
//   |y_ref - y_exact| <= sum_i |w_i| h_i + (f32 accumulation, <= 1e-5 sum_i |w_i x_i| for these sizes)
// with h_i the worst rounding error of x_i:
//   Q8_0/Q8_1: the quants are round(x / d) with d = amax/127 in f32 but dequantize with f16(d):
//              |x - q f16(d)| <= d/2 + 127 d 2^-11 < 0.57 d  (d of x_i's block of 32)
//   Q8_K:      d = amax/127 in f32: h = d/2 (+ f32 rounding of 1/iscale, covered by 0.501 d)
//   F16:       round to nearest, 11 significant bits: h = 2^-11 |x| (+ 2^-25 for f16 subnormals);
//   BF16:      8 significant bits: h = 2^-8 |x|;  F32: h = 0.
// This bound is checked for every output. On top, the NMSE over all outlier-free rows of a type (aggregated over
// the shapes, so the estimate is stable) must match the rounding noise: with step d the error is ~uniform,
// variance d^2/12, and NMSE(y) ~ E[err^2]/E[x^2] for weights independent of the error:
//   Q8_0/Q8_1: amax of 32 Gaussians ~ 2.2 sigma -> d ~ 0.017 sigma -> ~2.5e-5 (threshold 1e-4)
//   Q8_K:      amax of 256 Gaussians ~ 2.9 sigma -> d ~ 0.023 sigma -> ~4.4e-5 (threshold 2e-4)
//   F16: 2^-22/3 ~ 8e-8 (threshold 4e-7); BF16: 2^-16/3 ~ 5e-6 (threshold 2e-5); F32: 1e-12.
double half_step(DType at, const float* x, int64_t i) {
  switch (at) {
    case DType::F32: return 0.0;
    case DType::F16: return std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.0, -25);
    case DType::BF16: return std::ldexp(std::fabs(x[i]), -8);
    default: {
      const int64_t bs = at == DType::Q8_K ? QK_K : 32;
      const int64_t b0 = i / bs * bs;
      float amax = 0.f;
      for (int64_t k = b0; k < b0 + bs; ++k) amax = std::max(amax, std::fabs(x[k]));
      return (at == DType::Q8_K ? 0.501 : 0.57) * amax / 127.0;
    }
  }
}

double ref_nmse_threshold(DType t) {
  switch (detail::act_type(t)) {
    case DType::F32: return 1e-12;
    case DType::F16: return 4e-7;
    case DType::BF16: return 2e-5;
    case DType::Q8_K: return 2e-4;
    default: return 1e-4;
  }
}

struct NmseAcc {
  double num = 0, den = 0;
};

// Checks the per-output bound and adds the outlier-free rows to `acc`.
void check_ref_against_exact(DType t, const uint8_t* w, size_t rb, int64_t n_out, int64_t n_in, const float* x,
                             size_t xs, int64_t n_tok, const float* yref, size_t ys, NmseAcc* acc) {
  const DType at = detail::act_type(t);
  std::vector<float> wf(n_in);
  std::vector<double> h(n_in * n_tok);
  for (int64_t k = 0; k < n_tok; ++k)
    for (int64_t i = 0; i < n_in; ++i) h[k * n_in + i] = half_step(at, x + k * xs, i);
  for (int64_t o = 0; o < n_out; ++o) {
    ASSERT_TRUE(dequantize_row(t, w + o * rb, wf.data(), n_in).is_ok());
    for (int64_t k = 0; k < n_tok; ++k) {
      double exact = 0, bound = 0, mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        exact += static_cast<double>(wf[i]) * x[k * xs + i];
        bound += std::fabs(wf[i]) * h[k * n_in + i];
        mag += std::fabs(static_cast<double>(wf[i]) * x[k * xs + i]);
      }
      const double got = yref[k * ys + o];
      ASSERT_LE(std::fabs(got - exact), bound + 1e-5 * mag + 1e-30) << "o=" << o << " t=" << k;
      if (k % 2 == 0) {
        acc->num += (got - exact) * (got - exact);
        acc->den += exact * exact;
      }
    }
  }
}

// Every SIMD level against matmul_ref. Both compute the same exact per-block integer sums; they differ in the f32
// accumulation: the reference adds the nb = n_in/block per-block terms in one f32 (each addition rounds with
// relative error <= 2^-24 of the running sum), the kernels in 8-16 lanes with FMA. For a sum of nb terms of random
// sign the accumulated rounding error is ~2^-24 * sqrt(nb) * |partial sums| ~ 2^-24 * nb * sigma_term, against
// |y| ~ sqrt(nb) sigma_term, so NMSE ~ 2^-48 * nb ~ 5e-13 for nb = 128; the int32 -> f32 conversion of a block sum
// (<= 2^-24 relative) adds the same order. 1e-9 leaves orders of magnitude for unlucky cancellation and still
// catches any wrong block, scale or lane (which gives NMSE >= ~1e-4).
constexpr double kLevelThreshold = 1e-9;

struct Shape {
  int64_t n_out, n_in, n_tok;
};

std::vector<int64_t> n_ins(DType t) {
  const int64_t bs = std::max<int64_t>(dtype_block_size(t), dtype_block_size(detail::act_type(t)));
  if (bs == 1) return {1, 7, 33, 4096};
  if (bs == 32) return {32, 96, 4096};
  return {256, 768, 4096};
}

class MatmulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTypes, LevelsAgreeWithReferenceAndReferenceWithExact) {
  const DType t = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(t));
  ThreadPool pool1(1), pool2(2), pool3(3);
  ThreadPool* pools[] = {&pool1, &pool2, &pool3};
  int case_index = 0;
  NmseAcc ref_err;
  for (int64_t n_in : n_ins(t)) {
    for (int64_t n_out : {1, 3, 17, 64}) {
      for (int64_t n_tok : {1, 2, 3, 5, 8, 13, 64}) {
        if (n_in == 4096 && n_out == 64 && n_tok == 64 && t != DType::Q4_K) continue;  // keeps the test short
        SCOPED_TRACE(std::string(dtype_name(t)) + " n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in) +
                     " n_tok=" + std::to_string(n_tok));
        const size_t rb = dtype_row_bytes(t, n_in).value() + 16 * (case_index % 2);  // padded rows every other case
        const size_t xs = n_in + 5 * (case_index % 3 != 0), ys = n_out + 3 * (case_index % 2);
        ++case_index;
        const std::vector<uint8_t> w = random_weights(t, n_out, n_in, rb, rng);
        const std::vector<float> x = random_x(n_tok, n_in, xs, rng);
        std::vector<float> yref(ys * n_tok, -7.f);
        MatmulArgs a = product(t, w.data(), rb, n_out, n_in, x.data(), xs, n_tok, yref.data(), ys);
        ASSERT_TRUE(matmul_ref(a).is_ok());
        std::vector<float> yr(n_out * n_tok);
        for (int64_t k = 0; k < n_tok; ++k)
          for (int64_t o = 0; o < n_out; ++o) yr[k * n_out + o] = yref[k * ys + o];
        check_ref_against_exact(t, w.data(), rb, n_out, n_in, x.data(), xs, n_tok, yref.data(), ys, &ref_err);
        for (SimdLevel lv : levels()) {
          ThreadPool& pool = *pools[(case_index + static_cast<int>(lv)) % 3];
          std::vector<float> y(ys * n_tok, -7.f);
          a.y = y.data();
          ASSERT_TRUE(detail::matmul_at_level(a, pool, lv).is_ok());
          std::vector<float> yl(n_out * n_tok);
          for (int64_t k = 0; k < n_tok; ++k) {
            for (int64_t o = 0; o < n_out; ++o) yl[k * n_out + o] = y[k * ys + o];
            for (size_t o = n_out; o < ys; ++o) ASSERT_EQ(y[k * ys + o], -7.f) << "wrote past n_out";
          }
          EXPECT_LE(test::nmse(yl.data(), yr.data(), yl.size()), kLevelThreshold) << simd_level_name(lv);
        }
      }
    }
  }
  EXPECT_LE(ref_err.num / ref_err.den, ref_nmse_threshold(t)) << "NMSE of matmul_ref vs the exact product";
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTypes, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// The i-quant grid kernels (AVX2 and AVX-512 sets) bit for bit against a scalar model of their arithmetic, which the
// tolerance above would not see a change of: per super-block the exact int32 sums of 8 lanes (lane i: elements
// 4i..4i+3 of every sub-block, as vpmaddubsw + vpmaddwd produce them), then per lane acc = fma(float(sum),
// d_w * unit * d_a, acc) in f32, and the lanes summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
float iq_grid_lane_model(DType t, const uint8_t* wrow, const detail::ActLayout& l, const uint8_t* arow) {
  const auto* q = reinterpret_cast<const int8_t*>(arow);
  const auto* d = reinterpret_cast<const float*>(arow + l.d_off);
  const int64_t ts = dtype_type_size(t);
  float acc[8] = {};
  for (int64_t b = 0; b < l.n_in / 256; ++b) {
    const uint8_t* blk = wrow + b * ts;
    int32_t isum[8] = {};
    for (int s = 0; s < 8; ++s) {
      int8_t w[32];
      int sc[2];
      detail::iq_decode_sub(t, blk, s, w, sc);
      for (int e = 0; e < 32; ++e) isum[e / 4] += w[e] * sc[e / 16] * q[b * 256 + 32 * s + e];
    }
    const float m = fp16_to_f32(detail::iq_d_bits(t, blk)) * detail::iq_unit(t) * d[b];
    for (int i = 0; i < 8; ++i) acc[i] = std::fma(static_cast<float>(isum[i]), m, acc[i]);
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

TEST(MatmulIqGrid, KernelsMatchTheirLaneModelBitForBit) {
  const DType types[] = {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                         DType::IQ3_S,   DType::IQ1_S,  DType::IQ1_M};
  std::mt19937 rng(4321);
  ThreadPool pool(2);
  for (DType t : types) {
    const int64_t n_out = 19, n_in = 1024;
    const size_t rb = dtype_row_bytes(t, n_in).value();
    const std::vector<uint8_t> w = random_weights(t, n_out, n_in, rb, rng);
    for (int64_t n_tok : {1, 6}) {
      const std::vector<float> x = random_x(n_tok, n_in, n_in, rng);
      const detail::ActLayout l = detail::act_layout(t, n_in, false);
      std::vector<uint8_t> act(l.row_bytes * n_tok + 64);
      uint8_t* a0 = act.data() + (64 - reinterpret_cast<uintptr_t>(act.data()) % 64) % 64;
      for (int64_t k = 0; k < n_tok; ++k) detail::quantize_act_row_scalar(l, x.data() + k * n_in, a0 + k * l.row_bytes);
      for (SimdLevel lv : levels()) {
        if (lv == SimdLevel::kScalar) continue;
        std::vector<float> y(n_out * n_tok);
        const MatmulArgs a = product(t, w.data(), rb, n_out, n_in, x.data(), n_in, n_tok, y.data(), n_out);
        ASSERT_TRUE(detail::matmul_at_level(a, pool, lv).is_ok());
        for (int64_t k = 0; k < n_tok; ++k)
          for (int64_t o = 0; o < n_out; ++o)
            ASSERT_EQ(y[k * n_out + o], iq_grid_lane_model(t, w.data() + o * rb, l, a0 + k * l.row_bytes))
                << dtype_name(t) << " " << simd_level_name(lv) << " o=" << o << " t=" << k;
      }
    }
  }
}

// matmul_group gives each product bit for bit what matmul gives it alone, at every level and thread count: products
// of one input with different activation layouts (Q8_K for q4_K/q6_K, Q8_0, f16), one with another input, sizes
// from one chunk to many (GEMV chunks are ~64 KiB of weights), GEMV and GEMM.
TEST(MatmulGroup, EachProductAsMatmulAlone) {
  std::mt19937 rng(99);
  ThreadPool pool1(1), pool2(2), pool3(3);
  ThreadPool* pools[] = {&pool1, &pool2, &pool3};
  const int64_t n_in = 512;
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q4_K, DType::Q8_0, DType::F16, DType::Q4_1};
  const int64_t n_outs[] = {1000, 64, 17, 300, 33, 48};
  for (int64_t n_tok : {1, 3, 9}) {
    const std::vector<float> x = random_x(n_tok, n_in, n_in, rng), x2 = random_x(n_tok, n_in, n_in, rng);
    std::vector<std::vector<uint8_t>> w;
    std::vector<MatmulArgs> args;
    std::vector<std::vector<float>> y;
    for (int i = 0; i < 6; ++i) {
      const size_t rb = dtype_row_bytes(types[i], n_in).value();
      w.push_back(random_weights(types[i], n_outs[i], n_in, rb, rng));
      // product 2: same layout as 0, another input; y is set per run below
      args.push_back(product(types[i], w.back().data(), rb, n_outs[i], n_in, i == 2 ? x2.data() : x.data(), n_in,
                             n_tok, nullptr, n_outs[i]));
      y.emplace_back(n_outs[i] * n_tok);
    }
    for (SimdLevel lv : levels()) {
      for (ThreadPool* pool : pools) {
        SCOPED_TRACE(std::string(simd_level_name(lv)) + " threads=" + std::to_string(pool->size()) +
                     " n_tok=" + std::to_string(n_tok));
        std::vector<std::vector<float>> alone(6);
        for (int i = 0; i < 6; ++i) {
          alone[i].assign(y[i].size(), -7.f);
          MatmulArgs a = args[i];
          a.y = alone[i].data();
          ASSERT_TRUE(detail::matmul_at_level(a, *pool, lv).is_ok());
        }
        for (int i = 0; i < 6; ++i) {
          std::fill(y[i].begin(), y[i].end(), -7.f);
          args[i].y = y[i].data();
        }
        ASSERT_TRUE(detail::matmul_group_at_level(args.data(), 6, *pool, lv).is_ok());
        for (int i = 0; i < 6; ++i)
          ASSERT_EQ(0, std::memcmp(y[i].data(), alone[i].data(), y[i].size() * sizeof(float))) << "product " << i;
      }
    }
  }
}

// The fast path's activation rows hold exactly the bytes quantize_row produces (ties, zero blocks, outliers).
TEST(MatmulActivations, FastQuantizersMatchReferenceBytes) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n = 1024;
  std::vector<float> x(n);
  for (int rep = 0; rep < 20; ++rep) {
    for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * std::pow(10.f, static_cast<float>(rep % 7) - 3.f);
    if (rep % 3 == 0)
      for (int64_t i = 0; i < n; ++i) x[i] = std::round(x[i] * 4.f) / 8.f;  // many exact .5 ties
    if (rep % 4 == 1)
      for (int64_t i = 256; i < 512; ++i) x[i] = 0.f;  // an all-zero Q8_K block
    if (rep % 7 == 6) {
      // Exact .5 ties: every block's |max| is 127, so Q8_0's d = 1 and Q8_K's iscale = -1 keep x * id exact.
      for (int64_t i = 0; i < n; ++i) x[i] = i % 32 == 0 ? 127.f : static_cast<float>((i * 37) % 255 - 127) * 0.5f;
    }
    if (rep % 5 == 2) {
      x[300] = 1000.f;
      x[301] = -1000.f;
    }  // equal |max| of both signs: the first one decides Q8_K's sign
    for (SimdLevel lv : levels()) {
      const detail::FastKernels* fk = detail::fast_kernels_at(lv);
      if (!fk) continue;
      for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K}) {
        SCOPED_TRACE(std::string(fk->name) + " " + dtype_name(t) + " rep " + std::to_string(rep));
        const detail::ActLayout l = detail::act_layout(t, n, fk->bias128);
        std::vector<uint8_t> row(l.row_bytes + 64);
        uint8_t* r = row.data() + (64 - reinterpret_cast<uintptr_t>(row.data()) % 64) % 64;
        fk->quantize(l, x.data(), r);
        const DType at = detail::act_type(t);
        const size_t nbytes = dtype_row_bytes(at, n).value();
        std::vector<uint8_t> got(nbytes), want(nbytes);
        detail::act_row_to_blocks(l, r, got.data());
        ASSERT_TRUE(quantize_row(at, x.data(), want.data(), n).is_ok());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), nbytes));
      }
    }
  }
}

TEST(MatmulArgs, ErrorsNameTheField) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(512), y(512);
  MatmulArgs ok;
  ok.wtype = DType::Q8_0;
  ok.w = w.data();
  ok.w_row_bytes = 34 * 2;
  ok.n_out = 4;
  ok.n_in = 64;
  ok.x = x.data();
  ok.x_stride = 64;
  ok.n_tok = 2;
  ok.y = y.data();
  ok.y_stride = 4;
  EXPECT_TRUE(matmul_check(ok).is_ok());
  struct Case {
    void (*mutate)(MatmulArgs&);
    const char* field;
  };
  const Case cases[] = {
      {[](MatmulArgs& a) { a.wtype = DType::Q8_K; }, "wtype"},
      {[](MatmulArgs& a) { a.wtype = static_cast<DType>(4); }, "wtype"},
      {[](MatmulArgs& a) { a.n_in = 48; }, "n_in"},
      {[](MatmulArgs& a) { a.n_in = 0; }, "n_in"},
      {[](MatmulArgs& a) { a.n_out = 0; }, "n_out"},
      {[](MatmulArgs& a) { a.n_tok = -1; }, "n_tok"},
      {[](MatmulArgs& a) { a.w_row_bytes = 67; }, "w_row_bytes"},
      {[](MatmulArgs& a) { a.x_stride = 63; }, "x_stride"},
      {[](MatmulArgs& a) { a.y_stride = 3; }, "y_stride"},
      {[](MatmulArgs& a) { a.w = nullptr; }, "w "},
      {[](MatmulArgs& a) { a.x = nullptr; }, "x "},
      {[](MatmulArgs& a) { a.y = nullptr; }, "y "},
  };
  ThreadPool pool(2);
  for (const Case& c : cases) {
    MatmulArgs a = ok;
    c.mutate(a);
    const Status s = matmul(a, pool);
    ASSERT_FALSE(s.is_ok()) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_FALSE(matmul_ref(a).is_ok()) << c.field;
  }
  // Q4_K needs whole super-blocks of 256.
  MatmulArgs k = ok;
  k.wtype = DType::Q4_K;
  k.n_in = 128;
  k.w_row_bytes = 144;
  EXPECT_NE(matmul_check(k).message().find("n_in"), std::string::npos);
  // Zero tokens is a no-op.
  MatmulArgs z = ok;
  z.n_tok = 0;
  z.x = nullptr;
  z.y = nullptr;
  EXPECT_TRUE(matmul(z, pool).is_ok());
}

TEST(MatmulLevel, ReportsALevel) {
  const std::string l = simd_level();
  EXPECT_TRUE(l == "scalar" || l == "avx2" || l == "avx512") << l;
}

}  // namespace
}  // namespace kiln::cpu
