// Every CPU op's fast path (threaded, SIMD) against the scalar reference backend on awkward shapes (odd widths,
// tails shorter than a vector, GQA, odd block sizes, shuffled block tables), plus the error contract: unsupported
// combinations return errors, never crash.
//
// Tolerances, from the numerics of each op:
//   - exact (0): ops whose fast path computes the same expression in the same order (get_rows, rope, add, mul,
//     scale, argmax, copy/convert, kv_store to f16/f32/q8_0: conversion is round-to-nearest-even in both).
//   - rms_norm: the sum of squares is taken in double in both, only the order differs: relative 1e-6 per element.
//   - matmul, attention: f32 dot products summed in another order (SIMD lanes, online vs two-pass softmax):
//     per-element relative error ~n * 2^-24 with n <= a few hundred -> NMSE well below 1e-10.
//   - swiglu: the SIMD exp is a polynomial within ~2 ulp of expf -> relative 1e-6 per element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "common/test_util.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln {
namespace {

struct Backends {
  std::unique_ptr<Backend> fast = make_cpu_backend({2, false});
  std::unique_ptr<Backend> ref = make_cpu_backend({1, true});
};

Backends& be() {
  static Backends b;
  return b;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor f32(std::vector<float>& v, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
  return Tensor::make(DType::F32, v.data(), nullptr, ne0, ne1, ne2);
}
Tensor i32(std::vector<int32_t>& v) { return Tensor::make(DType::I32, v.data(), nullptr, static_cast<int64_t>(v.size())); }

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
    s = std::max(s, std::fabs(static_cast<double>(b[i])));
  }
  return s > 0 ? m / s : m;
}

TEST(BackendOps, GetRowsAllTypes) {
  const int64_t d = 512, rows = 9;
  std::vector<float> src = randn(d * rows, 1);
  std::vector<int32_t> ids = {8, 0, 3, 3, 7, 1, 8};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_1, DType::Q4_K, DType::Q6_K}) {
    const uint64_t rb = dtype_row_bytes(t, d).value();
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) ASSERT_TRUE(quantize_row(t, src.data() + r * d, w.data() + r * rb, d).is_ok());
    const Tensor wt = Tensor::make(t, w.data(), nullptr, d, rows);
    std::vector<float> a(d * ids.size()), b(d * ids.size());
    ASSERT_TRUE(be().fast->get_rows(wt, i32(ids), f32(a, d, ids.size())).is_ok());
    ASSERT_TRUE(be().ref->get_rows(wt, i32(ids), f32(b, d, ids.size())).is_ok()) << dtype_name(t);
    EXPECT_EQ(a, b) << dtype_name(t);
  }
  // Id values are the step planner's to check (backend.h); shapes are the op's.
  std::vector<int32_t> two = {0, 1};
  std::vector<float> out(d * 3);
  std::vector<float> w(d * rows);
  Status st = be().fast->get_rows(f32(w, d, rows), i32(two), f32(out, d, 3));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
}

TEST(BackendOps, RmsNorm) {
  for (int64_t d : {1, 17, 255, 4096})
    for (int64_t n : {1, 3, 33})
      for (bool with_w : {false, true}) {
        std::vector<float> x = randn(d * n, 2 + d + n, 3.0f), w = randn(d, 5), a(d * n), b(d * n);
        const Tensor wt = with_w ? f32(w, d) : Tensor{};
        ASSERT_TRUE(be().fast->rms_norm(f32(x, d, n), wt, 1e-6f, f32(a, d, n)).is_ok());
        ASSERT_TRUE(be().ref->rms_norm(f32(x, d, n), wt, 1e-6f, f32(b, d, n)).is_ok());
        EXPECT_LE(max_rel(a, b), 1e-6) << "d=" << d << " n=" << n;
      }
  std::vector<uint16_t> h(32);
  std::vector<float> y(32);
  Status st = be().fast->rms_norm(Tensor::make(DType::F16, h.data(), nullptr, 32), Tensor{}, 1e-5f, f32(y, 32));
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
}

TEST(BackendOps, MatmulWithBias) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K})
    for (int64_t n_tok : {1, 5, 17}) {
      const int64_t n_in = dtype_block_size(t) > 32 ? 256 : 96, n_out = 33;
      std::vector<float> wf = randn(n_in * n_out, 7), x = randn(n_in * n_tok, 8), bias = randn(n_out, 9);
      const uint64_t rb = dtype_row_bytes(t, n_in).value();
      std::vector<uint8_t> w(rb * n_out);
      for (int64_t r = 0; r < n_out; ++r) ASSERT_TRUE(quantize_row(t, wf.data() + r * n_in, w.data() + r * rb, n_in).is_ok());
      const Tensor wt = Tensor::make(t, w.data(), nullptr, n_in, n_out);
      std::vector<float> a(n_out * n_tok), b(n_out * n_tok);
      Status st = be().fast->matmul(wt, f32(x, n_in, n_tok), f32(bias, n_out), f32(a, n_out, n_tok));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_TRUE(be().ref->matmul(wt, f32(x, n_in, n_tok), f32(bias, n_out), f32(b, n_out, n_tok)).is_ok());
      EXPECT_LE(test::nmse(a.data(), b.data(), a.size()), 1e-10) << dtype_name(t) << " n_tok=" << n_tok;
    }
  std::vector<int32_t> wi(64 * 4);
  std::vector<float> x(64), y(4);
  Status st = be().fast->matmul(Tensor::make(DType::I32, wi.data(), nullptr, 64, 4), f32(x, 64), Tensor{}, f32(y, 4));
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  st = be().fast->matmul(Tensor::make(DType::F32, x.data(), nullptr, 32, 2), f32(x, 64), Tensor{}, f32(y, 2));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
}

TEST(BackendOps, Rope) {
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox})
    for (int hd : {64, 128})
      for (int n_rot : {hd, hd / 2})
        for (bool factors : {false, true}) {
          const int64_t n_head = 3, n_tok = 5;
          std::vector<int32_t> pos = {0, 1, 7, 1000, 4095};
          std::vector<float> ff(n_rot / 2);
          for (int i = 0; i < n_rot / 2; ++i) ff[i] = 1.0f + 0.25f * (i % 5);
          RopeParams p;
          p.mode = mode;
          p.n_rot = n_rot;
          p.freq_base = 500000.0f;
          p.freq_scale = 0.5f;
          if (factors) p.freq_factors = f32(ff, n_rot / 2);
          std::vector<float> a = randn(hd * n_head * n_tok, 11), b = a, orig = a;
          ASSERT_TRUE(be().fast->rope(f32(a, hd, n_head, n_tok), i32(pos), p).is_ok());
          ASSERT_TRUE(be().ref->rope(f32(b, hd, n_head, n_tok), i32(pos), p).is_ok());
          EXPECT_EQ(a, b);
          // Position 0 is the identity; dims past n_rot pass through.
          for (int i = 0; i < hd * n_head; ++i) EXPECT_EQ(a[i], orig[i]);
          for (int i = n_rot; i < hd; ++i) EXPECT_EQ(a[3 * hd * n_head + i], orig[3 * hd * n_head + i]);
        }
  std::vector<float> x(64 * 2);
  std::vector<int32_t> pos = {0, 1};
  RopeParams p;
  p.n_rot = 65;
  EXPECT_EQ(be().fast->rope(f32(x, 64, 1, 2), i32(pos), p).code(), ErrorCode::kInvalidArgument);
}

// kv_store then attention over a paged cache: 3 sequences with shuffled, interleaved block tables.
void check_attention(DType ct, int hd_k, int hd_v, int n_head, int n_head_kv, int bs) {
  const int n_blocks = 24, n_slots = n_blocks * bs;
  const int dk = n_head_kv * hd_k, dv = n_head_kv * hd_v;
  const uint64_t rk = dtype_row_bytes(ct, dk).value(), rv = dtype_row_bytes(ct, dv).value();
  std::vector<uint8_t> kc_a(rk * n_slots), vc_a(rv * n_slots), kc_b(rk * n_slots), vc_b(rv * n_slots);
  auto layer = [&](std::vector<uint8_t>& k, std::vector<uint8_t>& v) {
    KvLayer l;
    l.k = Tensor::make(ct, k.data(), nullptr, dk, n_slots);
    l.v = Tensor::make(ct, v.data(), nullptr, dv, n_slots);
    l.n_head_kv = n_head_kv, l.head_dim_k = hd_k, l.head_dim_v = hd_v, l.block_size = bs;
    return l;
  };
  const KvLayer la = layer(kc_a, vc_a), lb = layer(kc_b, vc_b);
  // Sequences of lengths 1, 2*bs+3 and 5*bs-1 over a shuffled block pool.
  std::vector<int> lens = {1, 2 * bs + 3, 5 * bs - 1};
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  const int max_blocks = 6;
  std::vector<int32_t> tables(3 * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < 3; ++s)
    for (int b = 0; b < (lens[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = perm[next++];
  // Every token of every sequence is in the batch (a prefill of all three at once).
  std::vector<int32_t> slots, tok_table, kv_len;
  for (int s = 0; s < 3; ++s)
    for (int p = 0; p < lens[s]; ++p) {
      slots.push_back(tables[s * max_blocks + p / bs] * bs + p % bs);
      tok_table.push_back(s);
      kv_len.push_back(p + 1);
    }
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<float> k = randn(dk * n, 21), v = randn(dv * n, 22), q = randn(hd_k * n_head * n, 23, 2.0f);
  ASSERT_TRUE(be().fast->kv_store(f32(k, dk, n), f32(v, dv, n), la, i32(slots)).is_ok());
  ASSERT_TRUE(be().ref->kv_store(f32(k, dk, n), f32(v, dv, n), lb, i32(slots)).is_ok());
  for (int64_t t = 0; t < n; ++t) {  // compare only written slots (the rest is uninitialized)
    EXPECT_EQ(0, std::memcmp(kc_a.data() + slots[t] * rk, kc_b.data() + slots[t] * rk, rk)) << "k slot " << slots[t];
    EXPECT_EQ(0, std::memcmp(vc_a.data() + slots[t] * rv, vc_b.data() + slots[t] * rv, rv)) << "v slot " << slots[t];
  }
  AttnBatch m;
  m.block_tables = Tensor::make(DType::I32, tables.data(), nullptr, max_blocks, 3);
  m.tok_table = i32(tok_table);
  m.kv_len = i32(kv_len);
  m.max_kv_len = *std::max_element(kv_len.begin(), kv_len.end());
  std::vector<float> a(hd_v * n_head * n), b(hd_v * n_head * n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_k));
  Status st = be().fast->attention(f32(q, hd_k, n_head, n), la, m, scale, f32(a, hd_v, n_head, n));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(be().ref->attention(f32(q, hd_k, n_head, n), la, m, scale, f32(b, hd_v, n_head, n)).is_ok());
  EXPECT_LE(test::nmse(a.data(), b.data(), a.size()), 1e-10)
      << dtype_name(ct) << " hd " << hd_k << "/" << hd_v << " heads " << n_head << "/" << n_head_kv << " bs " << bs;
  // A token attending to one position returns that position's V row (head h reads kv head h / n_rep).
  for (int h = 0; h < n_head; ++h) {
    const int g = h / (n_head / n_head_kv);
    for (int i = 0; i < hd_v; ++i) {
      const float vi = v[g * hd_v + i];
      const float tol = ct == DType::F32 ? 0.0f : ct == DType::F16 ? 1e-3f * std::fabs(vi) : 0.02f * 4.0f;
      EXPECT_NEAR(a[h * hd_v + i], vi, tol + 1e-6f);
    }
  }
}

TEST(BackendOps, AttentionPagedGqa) {
  check_attention(DType::F16, 64, 64, 6, 2, 16);
  check_attention(DType::F16, 40, 24, 4, 4, 5);  // widths that leave SIMD tails, no GQA, odd block size
  check_attention(DType::F16, 128, 128, 4, 1, 7);
  check_attention(DType::F32, 24, 40, 6, 3, 3);
  check_attention(DType::Q8_0, 64, 32, 8, 2, 16);
}

TEST(BackendOps, AttentionErrors) {
  std::vector<uint16_t> kc(64 * 32), vc(64 * 32);
  KvLayer l;
  l.k = Tensor::make(DType::F16, kc.data(), nullptr, 64, 32);
  l.v = Tensor::make(DType::F16, vc.data(), nullptr, 64, 32);
  l.n_head_kv = 1, l.head_dim_k = 64, l.head_dim_v = 64, l.block_size = 16;
  std::vector<int32_t> tables = {0, 5}, tt = {0}, kvl = {20};
  AttnBatch m;
  m.block_tables = Tensor::make(DType::I32, tables.data(), nullptr, 2, 1);
  m.tok_table = i32(tt);
  m.kv_len = i32(kvl);
  std::vector<float> q(64 * 3), out(64 * 3);
  // (Block ids and lengths are values: the planner checks them, not the op.)
  l.n_head_kv = 2;
  Status st = be().fast->attention(f32(q, 64, 3, 1), l, m, 1.0f, f32(out, 64, 3, 1));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);  // 3 heads over 2 kv heads
  std::vector<float> k(64), v(64);
  std::vector<int32_t> slots = {0};
  KvLayer lq = l;
  lq.k.dtype = lq.v.dtype = DType::Q4_0;
  EXPECT_EQ(be().fast->kv_store(f32(k, 64), f32(v, 64), lq, i32(slots)).code(), ErrorCode::kUnsupported);
}

TEST(BackendOps, ElementwiseAndReductions) {
  for (int64_t d : {1, 15, 1000})
    for (int64_t n : {1, 4}) {
      std::vector<float> x = randn(d * n, 31, 6.0f), y = randn(d * n, 32), row = randn(d, 33);
      std::vector<float> a(d * n), b(d * n);
      // swiglu
      ASSERT_TRUE(be().fast->swiglu(f32(x, d, n), f32(y, d, n), f32(a, d, n)).is_ok());
      ASSERT_TRUE(be().ref->swiglu(f32(x, d, n), f32(y, d, n), f32(b, d, n)).is_ok());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::fabs(b[i]) + 1e-30) << i;
      // add / mul with and without row broadcast, scale
      for (bool bc : {false, true}) {
        const Tensor bt = bc ? f32(row, d) : f32(y, d, n);
        ASSERT_TRUE(be().fast->add(f32(x, d, n), bt, f32(a, d, n)).is_ok());
        ASSERT_TRUE(be().ref->add(f32(x, d, n), bt, f32(b, d, n)).is_ok());
        EXPECT_EQ(a, b);
        ASSERT_TRUE(be().fast->mul(f32(x, d, n), bt, f32(a, d, n)).is_ok());
        ASSERT_TRUE(be().ref->mul(f32(x, d, n), bt, f32(b, d, n)).is_ok());
        EXPECT_EQ(a, b);
      }
      ASSERT_TRUE(be().fast->scale(f32(x, d, n), 0.37f, f32(a, d, n)).is_ok());
      ASSERT_TRUE(be().ref->scale(f32(x, d, n), 0.37f, f32(b, d, n)).is_ok());
      EXPECT_EQ(a, b);
      // softmax: rows sum to 1
      ASSERT_TRUE(be().fast->softmax(f32(x, d, n), f32(a, d, n)).is_ok());
      ASSERT_TRUE(be().ref->softmax(f32(x, d, n), f32(b, d, n)).is_ok());
      EXPECT_EQ(a, b);
      for (int64_t r = 0; r < n; ++r) EXPECT_NEAR(std::accumulate(a.begin() + r * d, a.begin() + (r + 1) * d, 0.0), 1.0, 1e-5);
      // argmax: first of equal maxima
      std::vector<float> z = x;
      z[d - 1] = 100.0f;
      z[0] = 100.0f;
      std::vector<int32_t> ia(n), ib(n);
      ASSERT_TRUE(be().fast->argmax(f32(z, d, n), i32(ia)).is_ok());
      ASSERT_TRUE(be().ref->argmax(f32(z, d, n), i32(ib)).is_ok());
      EXPECT_EQ(ia, ib);
      EXPECT_EQ(ia[0], 0);
    }
  std::vector<float> x(8), y(7);
  EXPECT_EQ(be().fast->add(f32(x, 8), f32(y, 7), f32(x, 8)).code(), ErrorCode::kInvalidArgument);
}

TEST(BackendOps, CopyConvert) {
  const int64_t d = 37, n = 3;
  std::vector<float> x = randn(d * n, 41, 100.0f);
  x[0] = 65504.0f * 2;  // overflows f16 -> inf
  x[1] = 1e-8f;         // f16 subnormal range
  for (DType t : {DType::F16, DType::BF16}) {
    std::vector<uint16_t> ha(d * n), hb(d * n);
    const Tensor ta = Tensor::make(t, ha.data(), nullptr, d, n), tb = Tensor::make(t, hb.data(), nullptr, d, n);
    ASSERT_TRUE(be().fast->copy(f32(x, d, n), ta).is_ok());
    ASSERT_TRUE(be().ref->copy(f32(x, d, n), tb).is_ok());
    EXPECT_EQ(ha, hb) << dtype_name(t);
    for (int64_t i = 0; i < d * n; ++i)
      EXPECT_EQ(ha[i], t == DType::F16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i])) << i;
    std::vector<float> back_a(d * n), back_b(d * n);
    ASSERT_TRUE(be().fast->copy(ta, f32(back_a, d, n)).is_ok());
    ASSERT_TRUE(be().ref->copy(ta, f32(back_b, d, n)).is_ok());
    EXPECT_EQ(0, std::memcmp(back_a.data(), back_b.data(), back_a.size() * 4));
  }
  std::vector<uint8_t> q(34 * 2);
  std::vector<float> y(64);
  EXPECT_EQ(be().fast->copy(Tensor::make(DType::Q8_0, q.data(), nullptr, 64), f32(y, 64)).code(),
            ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace kiln
