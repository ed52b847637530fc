// The ops Qwen3.5, Gemma 3, gpt-oss and the encoders added to backend.h (geglu, gelu, layer_norm, sigmoid_mul,
// sliding-window and non-causal attention, attention sinks, YaRN rope, conv1d_silu, gated_delta_net) on every backend
// of the build, each against an independent scalar computation in double
// precision written from the op contract (not from the CPU code). A backend whose supports() says no for an op
// skips that case, naming it. Plus: the multi-section RoPE of qwen35 reduces to NeoX RoPE of the leading dims for
// text positions. argmax_masked (grammar-constrained greedy decoding) against the scalar rule of backend.h: exact.
//
// Bounds, argued per op: u = 2^-24 (f32 unit roundoff).
//   geglu / sigmoid_mul: a handful of f32 operations and one libm tanh/exp (<= 2 ulp) per element: relative error
//     <= ~8u, plus the cancellation in 1 + tanh(.) for negative inputs (absolute error ~u |x| |up|): the bound is
//     16u (|ref| + |x up|). A wrong formula (erf GELU, sigmoid vs silu) is off by 1e-3 and more. The same bound
//     holds on CUDA: its tanhf / expf are documented at <= 2 ulp (the build uses no fast-math), the same budget as
//     glibc's, and FMA contraction of the polynomial only removes roundings.
//   gelu: geglu's bound with up = 1. layer_norm: argued at its test (16u relative to the terms of the formula).
//   attention with a window, non-causal or with sinks: F32 cache, so the only error is f32 summation order:
//     NMSE <= 1e-10 vs the double oracle; K/V outside the window are NaN in the cache, so reading them (masking
//     instead of skipping) poisons the output.
//   conv1d_silu: 4-term f32 dot and silu: |err| <= 16u (1 + sum |w x|) (CUDA: the same dot in the same order,
//     possibly FMA-contracted, and expf <= 2 ulp: inside the same bound).
//   gated_delta_net: f32 recurrence over up to 150 tokens with 128-long dots; the state decays (g < 0), so errors
//     do not grow without bound; measured NMSE vs the double recurrence ~1e-13; bound 1e-9, while a wrong head
//     mapping, a dropped chunk boundary or a state not carried gives NMSE > 1e-2. The bound holds for any f32
//     evaluation order: the CUDA kernel sums the dots as a warp tree (error ~u log2(S_k) per dot, smaller than a
//     sequential sum's ~u S_k worst case), normalizes q/k with f32 sums, and regroups o_t = scale (e S^T q + d k.q)
//     from the pre-update state; each is an O(u)-relative change per token, i.e. NMSE ~1e-13 like the CPU paths,
//     four orders below the bound, so the bound is the same on every backend.
//   Tokens of no sequence must not be written: outputs start as a sentinel, checked after the op (conv1d_silu,
//     gated_delta_net), and a padded sequence entry (q_len 0) leaves its state row as it was.
#include <algorithm>
#include <cmath>
#include <random>

#include "common/backend_test_util.h"

namespace kiln {
namespace {

using test::DevTensor;
using test::dev_alloc;
using test::dev_f32;
using test::dev_i32;
using test::dev_read;
using test::dev_upload;
using test::kU;
using test::randn;

class BackendOpsNext : public test::BackendOpsTest {
 protected:
  bool skip_unless(Op op, DType t = DType::F32) {
    if (be().supports(op, t)) return false;
    return true;
  }
};

#define KILN_SKIP_UNLESS(op, ...)                                                                       \
  if (skip_unless(op, ##__VA_ARGS__))                                                                   \
  GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run " << op_name(op) << " yet"

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST_P(BackendOpsNext, GegluMatchesTanhGelu) {
  KILN_SKIP_UNLESS(Op::kGeglu);
  const int64_t d = 300, n = 5;
  std::vector<float> g = randn(d * n, 1, 3.0f), u = randn(d * n, 2);
  g[0] = -12.0f, g[1] = 12.0f, g[2] = -0.0001f;  // the tails and near zero
  const DevTensor G = dev_f32(be(), g, d, n), U = dev_f32(be(), u, d, n), Y = dev_alloc(be(), DType::F32, d, n);
  KILN_ASSERT_OK(be().geglu(G.t, U.t, Y.t));
  const std::vector<float> y = dev_read<float>(be(), Y);
  for (size_t i = 0; i < y.size(); ++i) {
    const double ref = gelu_tanh(g[i]) * u[i];
    EXPECT_LE(std::fabs(y[i] - ref), 16 * kU * (std::fabs(ref) + std::fabs(g[i] * u[i]))) << i << " x=" << g[i];
  }
  // In place (dst = gate).
  KILN_ASSERT_OK(be().geglu(G.t, U.t, G.t));
  EXPECT_EQ(dev_read<float>(be(), G), y);
}

// gelu (the encoders' FFN activation): geglu's tanh GELU without the up factor, the same bound; in place too.
TEST_P(BackendOpsNext, GeluMatchesTanhGelu) {
  KILN_SKIP_UNLESS(Op::kGelu);
  const int64_t d = 300, n = 5;
  std::vector<float> x = randn(d * n, 21, 3.0f);
  x[0] = -12.0f, x[1] = 12.0f, x[2] = -0.0001f, x[3] = -4.0f;  // the tails, near zero, the cancelling side
  const DevTensor X = dev_f32(be(), x, d, n), Y = dev_alloc(be(), DType::F32, d, n);
  KILN_ASSERT_OK(be().gelu(X.t, Y.t));
  const std::vector<float> y = dev_read<float>(be(), Y);
  for (size_t i = 0; i < y.size(); ++i) {
    const double ref = gelu_tanh(x[i]);
    EXPECT_LE(std::fabs(y[i] - ref), 16 * kU * (std::fabs(ref) + std::fabs(x[i]))) << i << " x=" << x[i];
  }
  KILN_ASSERT_OK(be().gelu(X.t, X.t));
  EXPECT_EQ(dev_read<float>(be(), X), y);
}

// layer_norm (bert): (x - mean) / sqrt(var + eps) * w + b per row, the variance of the centred values (biased: / d),
// w and b optional. Rows with means 0..20 over a spread of ~2 (the centring matters), widths 300 and 1024. The f32
// evaluation the contract describes (mean and centred squares summed exactly enough, the rest in f32) is off by a few
// u relative to |v w| plus ~u |mean| s |w| from rounding the mean; the bound is 16 u (|v w| + |b| + (|mean| + rms) s
// |w|) against the double formula, while an unbiased variance (d - 1), a dropped bias or eps outside the root is off
// by 1e-3 and more. In place (dst = x) gives the same values.
TEST_P(BackendOpsNext, LayerNormMatchesTheFormula) {
  KILN_SKIP_UNLESS(Op::kLayerNorm);
  for (int64_t d : {300, 1024}) {
    const int64_t n = 6;
    std::vector<float> x = randn(static_cast<size_t>(d * n), 22, 2.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i) x[r * d + i] += 4.0f * static_cast<float>(r);
    std::vector<float> w = randn(static_cast<size_t>(d), 23), b = randn(static_cast<size_t>(d), 24);
    const DevTensor X = dev_f32(be(), x, d, n), W = dev_f32(be(), w, d), B = dev_f32(be(), b, d);
    for (int mode = 0; mode < 3; ++mode) {  // w and b; neither; w only
      const bool hw = mode != 1, hb = mode == 0;
      const float eps = mode == 1 ? 1e-12f : 1e-5f;
      const DevTensor Y = dev_alloc(be(), DType::F32, d, n);
      KILN_ASSERT_OK(be().layer_norm(X.t, hw ? W.t : Tensor{}, hb ? B.t : Tensor{}, eps, Y.t));
      const std::vector<float> y = dev_read<float>(be(), Y);
      for (int64_t r = 0; r < n; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; ++i) mean += x[r * d + i];
        mean /= static_cast<double>(d);
        for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
        var /= static_cast<double>(d);
        const double sc = 1 / std::sqrt(var + eps), rms = std::sqrt(var);
        for (int64_t i = 0; i < d; ++i) {
          const double wi = hw ? w[i] : 1.0, bi = hb ? b[i] : 0.0, vw = (x[r * d + i] - mean) * sc * wi;
          const double tol = 16 * kU * (std::fabs(vw) + std::fabs(bi) + (std::fabs(mean) + rms) * sc * std::fabs(wi));
          ASSERT_LE(std::fabs(y[r * d + i] - (vw + bi)), tol) << "d " << d << " mode " << mode << " row " << r << " i " << i;
        }
      }
      if (mode == 2) {  // in place
        const DevTensor Z = dev_f32(be(), x, d, n);
        KILN_ASSERT_OK(be().layer_norm(Z.t, W.t, Tensor{}, eps, Z.t));
        EXPECT_EQ(dev_read<float>(be(), Z), y) << "d " << d << " in place";
      }
    }
  }
  // w and b must be F32 [d].
  const DevTensor X = dev_f32(be(), randn(64 * 2, 25), 64, 2), Y = dev_alloc(be(), DType::F32, 64, 2);
  const DevTensor B = dev_f32(be(), randn(63, 26), 63);
  EXPECT_EQ(be().layer_norm(X.t, Tensor{}, B.t, 1e-5f, Y.t).code(), ErrorCode::kInvalidArgument);
}

// Non-causal attention (encoders): every token of a sequence attends to the whole sequence (kv_len = its length,
// runtime/engine.cpp), two sequences side by side in one step (each sees only itself, through its own block-table
// row), a padded token (kv_len 0: zero row). F32 cache: NMSE <= 1e-10 vs the double oracle, while the causal prefix
// (what a kernel deriving the range from the token's place in the tile would read) is off by NMSE > 1e-2.
TEST_P(BackendOpsNext, AttentionNonCausalReadsTheWholeSequence) {
  KILN_SKIP_UNLESS(Op::kAttentionNonCausal, DType::F32);
  const int hd = 64, n_head = 4, n_kv = 2, bs = 16;
  const int64_t n_blocks = 5;
  const std::vector<int32_t> table = {3, 1, 0, 4};  // [2, 2]: sequence 0 blocks 3, 1; sequence 1 blocks 0, 4
  const std::vector<int> len = {23, 9};
  const int n_tok = len[0] + len[1] + 1;  // + a padded token
  const std::vector<float> K = randn(static_cast<size_t>(n_blocks * bs * hd * n_kv), 27), V = randn(K.size(), 28);
  const std::vector<float> q = randn(static_cast<size_t>(hd * n_head * n_tok), 29);
  KvLayer l;
  const DevTensor KC = dev_f32(be(), K, hd * n_kv, n_blocks * bs), VC = dev_f32(be(), V, hd * n_kv, n_blocks * bs);
  l.k = KC.t, l.v = VC.t, l.n_head_kv = n_kv, l.head_dim_k = hd, l.head_dim_v = hd, l.block_size = bs;
  std::vector<int32_t> tok_table, kv_len;
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < len[s]; ++i) tok_table.push_back(s), kv_len.push_back(len[s]);
  tok_table.push_back(0), kv_len.push_back(0);
  const DevTensor BT = dev_upload(be(), DType::I32, table, 2, 2);
  const DevTensor TT = dev_i32(be(), tok_table), KL = dev_i32(be(), kv_len), SR = dev_i32(be(), {0, 1}),
                  QS = dev_i32(be(), {0, len[0]}), QL = dev_i32(be(), {len[0], len[1]}), SL = dev_i32(be(), {len[0], len[1]}),
                  Z = dev_i32(be(), {0, 0});
  AttnBatch m;
  m.block_tables = BT.t, m.tok_table = TT.t, m.kv_len = KL.t, m.seq_row = SR.t, m.seq_q_start = QS.t,
  m.seq_q_len = QL.t, m.seq_kv_len = SL.t, m.seq_reset = Z.t, m.n_seq = 2, m.max_kv_len = 32, m.max_q_len = len[0];
  const DevTensor Q = dev_f32(be(), q, hd, n_head, n_tok), O = dev_alloc(be(), DType::F32, hd, n_head, n_tok);
  const float scale = 0.125f;
  KILN_ASSERT_OK(be().attention(Q.t, l, m, scale, O.t));
  const std::vector<float> o = dev_read<float>(be(), O);
  auto oracle = [&](bool causal) {
    std::vector<double> ref(o.size(), 0.0);
    for (int t = 0; t < n_tok - 1; ++t) {
      const int s = tok_table[t], i_in_seq = s == 0 ? t : t - len[0];
      const int hi = causal ? i_in_seq + 1 : len[s];
      for (int h = 0; h < n_head; ++h) {
        const int g = h / (n_head / n_kv);
        std::vector<double> sc;
        double mx = -1e300;
        for (int p = 0; p < hi; ++p) {
          const int64_t slot = table[s * 2 + p / bs] * bs + p % bs;
          double d = 0;
          for (int i = 0; i < hd; ++i)
            d += static_cast<double>(q[(t * n_head + h) * hd + i]) * K[(slot * n_kv + g) * hd + i];
          sc.push_back(d * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0;
          for (int p = 0; p < hi; ++p) acc += sc[p] * V[((table[s * 2 + p / bs] * bs + p % bs) * n_kv + g) * hd + i];
          ref[(t * n_head + h) * hd + i] = acc / sum;
        }
      }
    }
    return ref;
  };
  EXPECT_LE(test::nmse_d(o, oracle(false)), 1e-10);
  EXPECT_GT(test::nmse_d(o, oracle(true)), 1e-2) << "the whole sequence must be read, not the causal prefix";
  for (int i = 0; i < hd * n_head; ++i) ASSERT_EQ(o[(n_tok - 1) * hd * n_head + i], 0.0f) << "padded token, " << i;
}

TEST_P(BackendOpsNext, SigmoidMulWithAStridedGate) {
  KILN_SKIP_UNLESS(Op::kSigmoidMul);
  // As qwen35's gated attention: per token and head [query hd | gate hd]; the gate rows are a strided view.
  const int64_t hd = 64, rows = 6;
  std::vector<float> qg = randn(2 * hd * rows, 3, 4.0f), x = randn(hd * rows, 4);
  const DevTensor QG = dev_f32(be(), qg, 2 * hd, rows), X = dev_f32(be(), x, hd, rows);
  Tensor gate = QG.t;
  gate.ne[0] = hd;
  gate.data = static_cast<float*>(QG.t.data) + hd;
  KILN_ASSERT_OK(be().sigmoid_mul(X.t, gate, X.t));
  const std::vector<float> y = dev_read<float>(be(), X);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < hd; ++i) {
      const double gv = qg[r * 2 * hd + hd + i], ref = x[r * hd + i] / (1.0 + std::exp(-gv));
      EXPECT_LE(std::fabs(y[r * hd + i] - ref), 16 * kU * (std::fabs(ref) + std::fabs(x[r * hd + i]))) << r << "," << i;
    }
}

// Sliding window: a token at position p sees (p - window, p]. The F32 cache holds NaN in every slot outside the
// union of the windows, so an op that reads them (instead of skipping) returns NaN.
TEST_P(BackendOpsNext, AttentionWindowSkipsPositionsOutsideIt) {
  KILN_SKIP_UNLESS(Op::kAttentionWindow, DType::F32);
  const int hd = 64, n_head = 2, n_kv = 1, bs = 16, window = 16;
  const int64_t n_blocks = 8, len = 100;  // one sequence of 100 positions, blocks scattered in the pool
  const std::vector<int32_t> table = {5, 2, 7, 0, 3, 6, 1, 4};
  std::vector<float> K = randn(static_cast<size_t>(n_blocks * bs * hd), 5), V = randn(K.size(), 6);
  // Queries: the last 20 positions (80..99) of the sequence; earliest window start is 80 - 15 = 65.
  const int n_tok = 20;
  for (int64_t pos = 0; pos < 65; ++pos) {
    const int64_t slot = table[pos / bs] * bs + pos % bs;
    for (int i = 0; i < hd; ++i) K[slot * hd + i] = V[slot * hd + i] = std::nanf("");
  }
  const std::vector<float> q = randn(static_cast<size_t>(hd * n_head * n_tok), 7);
  KvLayer l;
  const DevTensor KC = dev_f32(be(), K, hd * n_kv, n_blocks * bs), VC = dev_f32(be(), V, hd * n_kv, n_blocks * bs);
  l.k = KC.t, l.v = VC.t, l.n_head_kv = n_kv, l.head_dim_k = hd, l.head_dim_v = hd, l.block_size = bs;
  l.window = window;
  std::vector<int32_t> tok_table(n_tok, 0), kv_len(n_tok);
  for (int t = 0; t < n_tok; ++t) kv_len[t] = static_cast<int32_t>(len - n_tok + t + 1);
  const DevTensor BT = dev_upload(be(), DType::I32, table, static_cast<int64_t>(table.size()), 1);
  const DevTensor TT = dev_i32(be(), tok_table), KL = dev_i32(be(), kv_len), Z = dev_i32(be(), {0}),
                  QS = dev_i32(be(), {0}), QL = dev_i32(be(), {n_tok}), SK = dev_i32(be(), {static_cast<int32_t>(len)});
  AttnBatch m;
  m.block_tables = BT.t, m.tok_table = TT.t, m.kv_len = KL.t, m.seq_row = Z.t, m.seq_q_start = QS.t,
  m.seq_q_len = QL.t, m.seq_kv_len = SK.t, m.seq_reset = Z.t, m.n_seq = 1, m.max_kv_len = 128, m.max_q_len = n_tok;
  const DevTensor Q = dev_f32(be(), q, hd, n_head, n_tok), O = dev_alloc(be(), DType::F32, hd, n_head, n_tok);
  const float scale = 0.125f;
  KILN_ASSERT_OK(be().attention(Q.t, l, m, scale, O.t));
  const std::vector<float> o = dev_read<float>(be(), O);
  std::vector<double> ref(o.size());
  for (int t = 0; t < n_tok; ++t)
    for (int h = 0; h < n_head; ++h) {
      const int64_t hi = kv_len[t], lo = std::max<int64_t>(0, hi - window);
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t slot = table[p / bs] * bs + p % bs;
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(q[(t * n_head + h) * hd + i]) * K[slot * hd + i];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = lo; p < hi; ++p) acc += s[p - lo] * V[(table[p / bs] * bs + p % bs) * hd + i];
        ref[(t * n_head + h) * hd + i] = acc / sum;
      }
    }
  for (float x : o) ASSERT_FALSE(std::isnan(x)) << "a position outside the window was read";
  EXPECT_LE(test::nmse_d(o, ref), 1e-10);
  // window 0 on the same cache reads position 0: NaN (the poison works).
  l.window = 0;
  KILN_ASSERT_OK(be().attention(Q.t, l, m, scale, O.t));
  EXPECT_TRUE(std::isnan(dev_read<float>(be(), O)[0]));
}

// Attention sinks (gpt-oss): head h's sink logit joins its softmax's denominator and adds no value. One sequence of
// 40 positions, every position a query (kv_len 1..40: with one key the sink takes a large share), GQA 4/2, sinks
// above every score (the online softmax must rescale), below, and around them; with and without a window. F32
// cache: NMSE <= 1e-10 vs the double oracle, while dropping the sinks moves the output by NMSE > 1e-2.
TEST_P(BackendOpsNext, AttentionSinksJoinTheDenominator) {
  const int hd = 64, n_head = 4, n_kv = 2, bs = 16, n_tok = 40;
  const int64_t n_blocks = 4;
  const std::vector<int32_t> table = {2, 0, 3, 1};
  const std::vector<float> K = randn(static_cast<size_t>(n_blocks * bs * hd * n_kv), 15), V = randn(K.size(), 16);
  const std::vector<float> q = randn(static_cast<size_t>(hd * n_head * n_tok), 17);
  const std::vector<float> sinks = {6.0f, -2.0f, 0.5f, 1.5f};
  KvLayer l;
  const DevTensor KC = dev_f32(be(), K, hd * n_kv, n_blocks * bs), VC = dev_f32(be(), V, hd * n_kv, n_blocks * bs);
  const DevTensor SK = dev_f32(be(), sinks, n_head);
  l.k = KC.t, l.v = VC.t, l.n_head_kv = n_kv, l.head_dim_k = hd, l.head_dim_v = hd, l.block_size = bs;
  l.sinks = SK.t;
  std::vector<int32_t> tok_table(n_tok, 0), kv_len(n_tok);
  for (int t = 0; t < n_tok; ++t) kv_len[t] = t + 1;
  const DevTensor BT = dev_upload(be(), DType::I32, table, static_cast<int64_t>(table.size()), 1);
  const DevTensor TT = dev_i32(be(), tok_table), KL = dev_i32(be(), kv_len), Z = dev_i32(be(), {0}),
                  QS = dev_i32(be(), {0}), QL = dev_i32(be(), {n_tok}), SL = dev_i32(be(), {n_tok});
  AttnBatch m;
  m.block_tables = BT.t, m.tok_table = TT.t, m.kv_len = KL.t, m.seq_row = Z.t, m.seq_q_start = QS.t,
  m.seq_q_len = QL.t, m.seq_kv_len = SL.t, m.seq_reset = Z.t, m.n_seq = 1, m.max_kv_len = 64, m.max_q_len = n_tok;
  const DevTensor Q = dev_f32(be(), q, hd, n_head, n_tok), O = dev_alloc(be(), DType::F32, hd, n_head, n_tok);
  const float scale = 0.125f;
  if (!be().supports(Op::kAttentionSinks, DType::F32, DType::F32)) {
    const Status st = be().attention(Q.t, l, m, scale, O.t);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
    EXPECT_NE(st.message().find("sinks"), std::string::npos) << st.to_string();
    GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run attention sinks yet (and says so)";
  }
  for (int window : {0, 8}) {
    auto oracle = [&](bool with_sinks) {
      std::vector<double> ref(static_cast<size_t>(hd * n_head * n_tok));
      for (int t = 0; t < n_tok; ++t)
        for (int h = 0; h < n_head; ++h) {
          const int g = h / (n_head / n_kv);
          const int64_t hi = kv_len[t], lo = window > 0 ? std::max<int64_t>(0, hi - window) : 0;
          std::vector<double> sc;
          double mx = with_sinks ? sinks[h] : -1e300;
          for (int64_t p = lo; p < hi; ++p) {
            const int64_t slot = table[p / bs] * bs + p % bs;
            double d = 0;
            for (int i = 0; i < hd; ++i)
              d += static_cast<double>(q[(t * n_head + h) * hd + i]) * K[(slot * n_kv + g) * hd + i];
            sc.push_back(d * scale);
            mx = std::max(mx, sc.back());
          }
          double sum = with_sinks ? std::exp(sinks[h] - mx) : 0.0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int i = 0; i < hd; ++i) {
            double acc = 0;
            for (int64_t p = lo; p < hi; ++p)
              acc += sc[p - lo] * V[((table[p / bs] * bs + p % bs) * n_kv + g) * hd + i];
            ref[(t * n_head + h) * hd + i] = acc / sum;
          }
        }
      return ref;
    };
    l.window = window;
    KILN_ASSERT_OK(be().attention(Q.t, l, m, scale, O.t));
    const std::vector<float> o = dev_read<float>(be(), O);
    EXPECT_LE(test::nmse_d(o, oracle(true)), 1e-10) << "window " << window;
    EXPECT_GT(test::nmse_d(o, oracle(false)), 1e-2) << "window " << window << ": the sinks must matter";
  }
  // Sinks must be F32 [n_head].
  const DevTensor bad = dev_f32(be(), {1.0f, 2.0f}, 2);
  l.sinks = bad.t;
  const Status st = be().attention(Q.t, l, m, scale, O.t);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("sinks"), std::string::npos) << st.to_string();
}

// YaRN RoPE (gpt-oss: factor 32, original context 4096, freq_base 150000, beta_fast 32, beta_slow 1) against
// ggml's formula in double: the pair's angle mixes the interpolated and extrapolated theta by the ramp over the
// correction range, cos and sin times attn_factor (1 + 0.1 ln factor). The angle is built in f32 as in plain rope
// (|d theta| <= theta_extrap (3i + 8) u), the mix and the scale add a few u: the per-element bound is
// (theta_extrap (3i + 8) u + 16 u) mscale r for a pair of norm r. Positions up to 4095; n_rot 64 of head 64 and
// 32 of 64 (dims past n_rot pass through unchanged); ext_factor 0 with attn_factor != 1 scales only.
TEST_P(BackendOpsNext, RopeYarnMatchesGgmlFormula) {
  const std::vector<int32_t> pos = {0, 1, 5, 130, 1000, 4095};
  const int64_t n_tok = static_cast<int64_t>(pos.size()), n_head = 2;
  const int hd = 64;
  for (int n_rot : {64, 32})
    for (float ext : {1.0f, 0.0f}) {
      const std::vector<float> x = randn(static_cast<size_t>(hd * n_head * n_tok), 40 + n_rot);
      const DevTensor X = dev_f32(be(), x, hd, n_head, n_tok), P = dev_i32(be(), pos);
      RopeParams p;
      p.mode = RopeMode::kNeox, p.n_rot = n_rot, p.freq_base = 150000.0f, p.freq_scale = 1.0f / 32;
      p.ext_factor = ext, p.attn_factor = ext != 0 ? 1.0f : 0.75f, p.n_ctx_orig = 4096;
      if (!be().supports(Op::kRopeYarn, DType::F32)) {
        const Status st = be().rope(X.t, P.t, p);
        EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
        EXPECT_NE(st.message().find("YaRN"), std::string::npos) << st.to_string();
        GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run YaRN rope yet (and says so)";
      }
      KILN_ASSERT_OK(be().rope(X.t, P.t, p));
      const std::vector<float> got = dev_read<float>(be(), X);
      auto corr = [&](double beta) {
        return n_rot * std::log(4096.0 / (beta * 2 * M_PI)) / (2 * std::log(150000.0));
      };
      const double lo = std::max(0.0, std::floor(corr(32))), hi = std::min(n_rot - 1.0, std::ceil(corr(1)));
      const double mscale = p.attn_factor * (ext != 0 ? 1 + 0.1 * std::log(32.0) : 1.0);
      const int half = n_rot / 2;
      int mixed = 0;
      for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t h = 0; h < n_head; ++h) {
          const float* a = &x[(t * n_head + h) * hd];
          const float* g = &got[(t * n_head + h) * hd];
          for (int i = 0; i < half; ++i) {
            const double extrap = pos[t] * std::pow(150000.0, -2.0 * i / n_rot);
            double th = extrap / 32;
            if (ext != 0) {
              const double mix = 1 - std::min(1.0, std::max(0.0, (i - lo) / std::max(0.001, hi - lo)));
              th = th * (1 - mix) + extrap * mix;
              mixed += mix > 0 && mix < 1;
            }
            const double a0 = a[i], a1 = a[i + half];
            const double w0 = (a0 * std::cos(th) - a1 * std::sin(th)) * mscale;
            const double w1 = (a0 * std::sin(th) + a1 * std::cos(th)) * mscale;
            const double tol = (extrap * (3 * i + 8) * kU + 16 * kU) * mscale * std::hypot(a0, a1);
            EXPECT_NEAR(g[i], w0, tol) << "n_rot " << n_rot << " ext " << ext << " pos " << pos[t] << " i " << i;
            EXPECT_NEAR(g[i + half], w1, tol) << "n_rot " << n_rot << " ext " << ext << " pos " << pos[t] << " i " << i;
          }
          for (int i = n_rot; i < hd; ++i) EXPECT_EQ(g[i], a[i]) << "dim " << i << " past n_rot changed";
        }
      if (ext != 0) {
        EXPECT_GT(mixed, 0) << "n_rot " << n_rot << ": no pair inside the ramp";
      }
    }
}

// Per-sequence metadata of a step: sequences (row, first token, token count, reset).
struct Seqs {
  DevTensor row, start, len, reset;
  AttnBatch m;
  Seqs(Backend& be, const std::vector<int32_t>& r, const std::vector<int32_t>& s, const std::vector<int32_t>& l,
       const std::vector<int32_t>& z) {
    row = dev_i32(be, r), start = dev_i32(be, s), len = dev_i32(be, l), reset = dev_i32(be, z);
    m.seq_row = row.t, m.seq_q_start = start.t, m.seq_q_len = len.t, m.seq_reset = reset.t;
    m.n_seq = static_cast<int32_t>(r.size());
    m.max_q_len = *std::max_element(l.begin(), l.end());
  }
};

// conv1d_silu: two sequences in one step (one starting, one continuing from a state row), then a second step
// continuing both; against the double oracle over each sequence's whole input history.
TEST_P(BackendOpsNext, Conv1dSiluCarriesTheStatePerSequence) {
  KILN_SKIP_UNLESS(Op::kConv1dSilu);
  const int64_t C = 96, K = 4, slots = 3;
  const std::vector<float> w = randn(K * C, 8, 0.5f);
  // Slot 2 starts with a history (sequence B was running before); slot 0 is garbage but reset.
  std::vector<float> st0 = randn((K - 1) * C * slots, 9);
  const DevTensor W = dev_f32(be(), w, K, C), ST = dev_f32(be(), st0, (K - 1) * C, slots);
  // Histories in double: B's known past (3 inputs from the state row), A none.
  std::vector<std::vector<float>> hist(2);
  for (int64_t j = 0; j < K - 1; ++j)
    for (int64_t c = 0; c < C; ++c) hist[1].push_back(st0[2 * (K - 1) * C + j * C + c]);
  const size_t b_past = hist[1].size() / C;
  struct Step { int a, b; int ra; };
  const Step steps[] = {{2, 5, 1}, {7, 1, 0}, {1, 2, 0}};  // token counts of A (slot 0) and B (slot 2) per step
  uint32_t seed = 10;
  for (const Step& s : steps) {
    const int64_t n = s.a + s.b;
    const std::vector<float> x = randn(C * n, seed++);
    const DevTensor X = dev_f32(be(), x, C, n), Y = dev_alloc(be(), DType::F32, C, n);
    Seqs q(be(), {0, 2}, {0, s.a}, {s.a, s.b}, {s.ra, 0});
    KILN_ASSERT_OK(be().conv1d_silu(X.t, W.t, ST.t, q.m, Y.t));
    const std::vector<float> y = dev_read<float>(be(), Y);
    for (int sq = 0; sq < 2; ++sq) {
      const int64_t t0 = sq == 0 ? 0 : s.a, cnt = sq == 0 ? s.a : s.b;
      for (int64_t t = 0; t < cnt; ++t) hist[sq].insert(hist[sq].end(), x.begin() + (t0 + t) * C, x.begin() + (t0 + t + 1) * C);
      const int64_t H = static_cast<int64_t>(hist[sq].size() / C);
      for (int64_t t = 0; t < cnt; ++t) {
        const int64_t p = H - cnt + t;  // index of this token in the history
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0, mag = 0;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t u = p - (K - 1) + j;
            const double in = u >= 0 ? hist[sq][u * C + c] : 0.0;
            acc += static_cast<double>(w[c * K + j]) * in;
            mag += std::fabs(w[c * K + j] * in);
          }
          const double ref = acc / (1.0 + std::exp(-acc));
          EXPECT_LE(std::fabs(y[(t0 + t) * C + c] - ref), 16 * kU * (1 + mag)) << "seq " << sq << " t " << t << " c " << c;
        }
      }
    }
  }
  (void)b_past;
}

constexpr float kSentinel = 12345.0f;  // outputs of tokens of no sequence keep it

// The double-precision oracle of the gated delta rule, straight from the contract (backend.h).
struct DeltaOracle {
  int64_t Sk, Sv, Hk, Hv;
  std::vector<double> S;  // per head [Sk][Sv]: S[h][i][j]
  DeltaOracle(int64_t sk, int64_t sv, int64_t hk, int64_t hv) : Sk(sk), Sv(sv), Hk(hk), Hv(hv), S(hv * sk * sv, 0.0) {}
  // State row as the backend stores it: (h * Sv + j) * Sk + i = S[i][j].
  void load(const float* row) {
    for (int64_t h = 0; h < Hv; ++h)
      for (int64_t j = 0; j < Sv; ++j)
        for (int64_t i = 0; i < Sk; ++i) S[(h * Sk + i) * Sv + j] = row[(h * Sv + j) * Sk + i];
  }
  void store(std::vector<double>& row) const {
    row.assign(Hv * Sv * Sk, 0);
    for (int64_t h = 0; h < Hv; ++h)
      for (int64_t j = 0; j < Sv; ++j)
        for (int64_t i = 0; i < Sk; ++i) row[(h * Sv + j) * Sk + i] = S[(h * Sk + i) * Sv + j];
  }
  // One token: q, k [Hk][Sk], v [Hv][Sv], alpha/beta [Hv]; out [Hv][Sv].
  void step(const float* q, const float* k, const float* v, const float* alpha, const float* beta, const float* A,
            const float* dt, double scale, double eps, double* out) {
    for (int64_t h = 0; h < Hv; ++h) {
      const float* qh = q + (h % Hk) * Sk;
      const float* kh = k + (h % Hk) * Sk;
      double nq = 0, nk = 0;
      for (int64_t i = 0; i < Sk; ++i) nq += static_cast<double>(qh[i]) * qh[i], nk += static_cast<double>(kh[i]) * kh[i];
      nq = 1 / std::sqrt(nq + eps), nk = 1 / std::sqrt(nk + eps);
      const double x = static_cast<double>(alpha[h]) + dt[h];
      const double g = A[h] * (x > 20 ? x : std::log1p(std::exp(x)));
      const double b = 1 / (1 + std::exp(-static_cast<double>(beta[h])));
      double* Sh = S.data() + h * Sk * Sv;
      for (int64_t e = 0; e < Sk * Sv; ++e) Sh[e] *= std::exp(g);
      for (int64_t j = 0; j < Sv; ++j) {
        double skj = 0;
        for (int64_t i = 0; i < Sk; ++i) skj += Sh[i * Sv + j] * kh[i] * nk;
        const double d = b * (v[h * Sv + j] - skj);
        for (int64_t i = 0; i < Sk; ++i) Sh[i * Sv + j] += kh[i] * nk * d;
      }
      for (int64_t j = 0; j < Sv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < Sk; ++i) o += Sh[i * Sv + j] * qh[i] * nq;
        out[h * Sv + j] = o * scale;
      }
    }
  }
};

// One step of gated_delta_net over the sequences of `q`, inputs laid out as qwen35's conv output (q | k | v per
// token, q/k/v strided views), returns the output [n][Hv][Sv].
struct DeltaCase {
  int64_t Sk, Sv, Hk, Hv, slots;
  std::vector<float> A, dt;
  DevTensor Ad, dtd, state;
  DeltaCase(Backend& be, int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t sl, uint32_t seed)
      : Sk(sk), Sv(sv), Hk(hk), Hv(hv), slots(sl) {
    A = randn(hv, seed);
    for (float& a : A) a = -std::exp(a);  // ssm_a = -exp(A_log) < 0
    dt = randn(hv, seed + 1);
    Ad = dev_f32(be, A, hv), dtd = dev_f32(be, dt, hv);
    state = dev_f32(be, randn(hv * sv * sk * sl, seed + 2, 0.3f), hv * sv * sk, sl);
  }
  int64_t C() const { return 2 * Sk * Hk + Sv * Hv; }
  Status run(Backend& be, const std::vector<float>& x, const std::vector<float>& al, const std::vector<float>& bt,
             int64_t n, const AttnBatch& m, std::vector<float>* out) {
    const DevTensor X = dev_f32(be, x, C(), n), AL = dev_f32(be, al, Hv, n), BE = dev_f32(be, bt, Hv, n);
    const DevTensor O = dev_f32(be, std::vector<float>(static_cast<size_t>(Sv * Hv * n), kSentinel), Sv, Hv, n);
    Backend::DeltaNetArgs a;
    auto view = [&](int64_t off, int64_t d, int64_t h) {
      Tensor t = Tensor::make(DType::F32, static_cast<float*>(X.t.data) + off, &be, d, h, n);
      t.nb[2] = static_cast<size_t>(C()) * sizeof(float);
      t.nb[3] = t.nb[2] * static_cast<size_t>(n);
      return t;
    };
    a.q = view(0, Sk, Hk), a.k = view(Sk * Hk, Sk, Hk), a.v = view(2 * Sk * Hk, Sv, Hv);
    a.alpha = AL.t, a.beta = BE.t, a.A = Ad.t, a.dt_bias = dtd.t, a.state = state.t;
    a.scale = 1.0f / std::sqrt(static_cast<float>(Sk));
    a.l2_eps = 1e-6f;
    KILN_TRY(be.gated_delta_net(a, m, O.t));
    *out = dev_read<float>(be, O);
    return Status::ok();
  }
};

// Two sequences over three steps: A (slot 1) starts with 150 tokens (chunks 64 + 64 + 22), B (slot 0) continues a
// pre-set state with 5; then A decodes one token and B prefills 70; then both decode one. Outputs of every step
// and the final state rows against the oracle (which starts A from zero and B from the pre-set row).
TEST_P(BackendOpsNext, GatedDeltaNetMatchesTheRecurrence) {
  KILN_SKIP_UNLESS(Op::kDeltaNet);
  for (const auto& [Sk, Hk, Hv] : {std::tuple<int64_t, int64_t, int64_t>{64, 2, 4}, {128, 1, 2}}) {
    const int64_t Sv = Sk;
    DeltaCase dc(be(), Sk, Sv, Hk, Hv, 2, 20);
    const std::vector<float> st0 = dev_read<float>(be(), dc.state);
    DeltaOracle oa(Sk, Sv, Hk, Hv), ob(Sk, Sv, Hk, Hv);
    ob.load(st0.data());  // B's pre-set state, slot 0
    struct Step { int a, b, reset_a; };
    const Step steps[] = {{150, 5, 1}, {1, 70, 0}, {1, 1, 0}};
    uint32_t seed = 30;
    double worst = 0;
    for (const Step& s : steps) {
      const int64_t n = s.a + s.b, C = dc.C();
      const std::vector<float> x = randn(C * n, seed++), al = randn(Hv * n, seed++), bt = randn(Hv * n, seed++);
      Seqs q(be(), {1, 0}, {0, s.a}, {s.a, s.b}, {s.reset_a, 0});
      std::vector<float> out;
      KILN_ASSERT_OK(dc.run(be(), x, al, bt, n, q.m, &out));
      std::vector<double> ref(out.size());
      for (int64_t t = 0; t < n; ++t) {
        DeltaOracle& o = t < s.a ? oa : ob;
        const float* xt = x.data() + t * C;
        o.step(xt, xt + Sk * Hk, xt + 2 * Sk * Hk, al.data() + t * Hv, bt.data() + t * Hv, dc.A.data(), dc.dt.data(),
               1.0 / std::sqrt(static_cast<double>(Sk)), 1e-6, ref.data() + t * Hv * Sv);
      }
      const double e = test::nmse_d(out, ref);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-9) << "S " << Sk << " step a=" << s.a << " b=" << s.b;
    }
    const std::vector<float> st = dev_read<float>(be(), dc.state);
    std::vector<double> ra, rb;
    oa.store(ra), ob.store(rb);
    const int64_t W = Hv * Sv * Sk;
    EXPECT_LE(test::nmse_d(std::vector<float>(st.begin() + W, st.begin() + 2 * W), ra), 1e-9) << "state of A";
    EXPECT_LE(test::nmse_d(std::vector<float>(st.begin(), st.begin() + W), rb), 1e-9) << "state of B";
    std::printf("[delta-net] %s S=%lld H_k=%lld H_v=%lld: max NMSE vs double recurrence %.3e\n", GetParam().c_str(),
                static_cast<long long>(Sk), static_cast<long long>(Hk), static_cast<long long>(Hv), worst);
  }
}

// The chunked prefill (one call of 150 tokens) and the one-step recurrence (150 calls of one token) give the same
// outputs and the same final state (f32 evaluations of one recurrence in different orders: NMSE ~1e-13).
TEST_P(BackendOpsNext, ChunkedPrefillMatchesOneStepRecurrence) {
  KILN_SKIP_UNLESS(Op::kDeltaNet);
  const int64_t Sk = 128, Hk = 2, Hv = 4, n = 150;
  DeltaCase one(be(), Sk, Sk, Hk, Hv, 1, 40), many(be(), Sk, Sk, Hk, Hv, 1, 40);
  const int64_t C = one.C();
  const std::vector<float> x = randn(C * n, 41), al = randn(Hv * n, 42), bt = randn(Hv * n, 43);
  std::vector<float> chunked, stepwise, o;
  {
    Seqs q(be(), {0}, {0}, {static_cast<int32_t>(n)}, {1});
    KILN_ASSERT_OK(one.run(be(), x, al, bt, n, q.m, &chunked));
  }
  for (int64_t t = 0; t < n; ++t) {
    Seqs q(be(), {0}, {0}, {1}, {t == 0 ? 1 : 0});
    const std::vector<float> xt(x.begin() + t * C, x.begin() + (t + 1) * C), at(al.begin() + t * Hv, al.begin() + (t + 1) * Hv),
        bt1(bt.begin() + t * Hv, bt.begin() + (t + 1) * Hv);
    KILN_ASSERT_OK(many.run(be(), xt, at, bt1, 1, q.m, &o));
    stepwise.insert(stepwise.end(), o.begin(), o.end());
  }
  std::vector<double> ref(stepwise.begin(), stepwise.end());
  const double e = test::nmse_d(chunked, ref);
  std::printf("[delta-net] %s chunked vs one-step: NMSE %.3e\n", GetParam().c_str(), e);
  EXPECT_LE(e, 1e-9);
  const std::vector<float> s1 = dev_read<float>(be(), one.state), s2 = dev_read<float>(be(), many.state);
  EXPECT_LE(test::nmse_d(s1, std::vector<double>(s2.begin(), s2.end())), 1e-9);
}

// CUDA-relevant shapes of conv1d_silu: qwen35's width (C = 2 * 16 * 128 + 32 * 128 = 8192 channels, K = 4), seven
// sequence entries in one step: lengths 1 and 2 (shorter than K - 1: the new state row mixes the old row and the
// inputs), 63 / 64 / 65 / 130 (around the token tiles of a parallel kernel and the 64-token chunks), and a padded
// entry (q_len 0: its state row must stay as it was); resets mixed; 3 trailing batch tokens belong to no sequence
// (their outputs must stay unwritten). Then a decode step of every sequence (the state rows carried).
TEST_P(BackendOpsNext, Conv1dSiluManySequencesAtQwenWidth) {
  KILN_SKIP_UNLESS(Op::kConv1dSilu);
  const int64_t C = 8192, K = 4, slots = 8;
  const std::vector<float> w = randn(K * C, 60, 0.5f);
  const std::vector<float> st0 = randn((K - 1) * C * slots, 61);
  const DevTensor W = dev_f32(be(), w, K, C), ST = dev_f32(be(), st0, (K - 1) * C, slots);
  const std::vector<int32_t> rows = {3, 0, 5, 1, 6, 2, 7};  // entry 6 is the padded one (row 7)
  const std::vector<int32_t> reset = {1, 0, 0, 1, 0, 1, 0};
  // Per entry, its inputs oldest first, starting with the K-1 values in(-K+1..-1) (the state row, or zeros).
  std::vector<std::vector<float>> hist(rows.size());
  for (size_t e = 0; e < rows.size(); ++e)
    for (int64_t j = 0; j < K - 1; ++j)
      for (int64_t c = 0; c < C; ++c) hist[e].push_back(reset[e] ? 0.0f : st0[(rows[e] * (K - 1) + j) * C + c]);
  const std::vector<std::vector<int32_t>> lens = {{1, 2, 63, 64, 65, 130, 0}, {1, 1, 1, 1, 1, 1, 0}};
  uint32_t seed = 62;
  for (size_t step = 0; step < lens.size(); ++step) {
    std::vector<int32_t> start(rows.size(), 0);
    int32_t n_seq_tok = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
      start[e] = lens[step][e] > 0 ? n_seq_tok : 0;  // the padded entry points at token 0 with q_len 0
      n_seq_tok += lens[step][e];
    }
    const int64_t n = n_seq_tok + 3;
    const std::vector<float> x = randn(C * n, seed++);
    const DevTensor X = dev_f32(be(), x, C, n), Y = dev_f32(be(), std::vector<float>(C * n, kSentinel), C, n);
    Seqs q(be(), rows, start, lens[step], step == 0 ? reset : std::vector<int32_t>(rows.size(), 0));
    KILN_ASSERT_OK(be().conv1d_silu(X.t, W.t, ST.t, q.m, Y.t));
    const std::vector<float> y = dev_read<float>(be(), Y);
    int bad = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
      const int64_t t0 = start[e], cnt = lens[step][e];
      for (int64_t t = 0; t < cnt; ++t)
        hist[e].insert(hist[e].end(), x.begin() + (t0 + t) * C, x.begin() + (t0 + t + 1) * C);
      const int64_t H = static_cast<int64_t>(hist[e].size() / C);
      for (int64_t t = 0; t < cnt; ++t) {
        const int64_t p = H - cnt + t;
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0, mag = 0;
          for (int64_t j = 0; j < K; ++j) {
            const double in = hist[e][(p - (K - 1) + j) * C + c];
            acc += static_cast<double>(w[c * K + j]) * in;
            mag += std::fabs(w[c * K + j] * in);
          }
          const double ref = acc / (1.0 + std::exp(-acc));
          const bool ok = std::fabs(y[(t0 + t) * C + c] - ref) <= 16 * kU * (1 + mag);
          if (!ok && ++bad < 10) ADD_FAILURE() << "step " << step << " entry " << e << " t " << t << " c " << c;
        }
      }
    }
    EXPECT_EQ(bad, 0);
    for (int64_t i = n_seq_tok * C; i < n * C; ++i)
      ASSERT_EQ(y[i], kSentinel) << "a token of no sequence was written (element " << i << ")";
  }
  // State rows: each entry's last K-1 inputs; the padded entry's row and the unused row 4 as they were.
  const std::vector<float> st = dev_read<float>(be(), ST);
  for (size_t e = 0; e + 1 < rows.size(); ++e) {
    const size_t H = hist[e].size() / C;
    for (int64_t j = 0; j < K - 1; ++j)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(st[(rows[e] * (K - 1) + j) * C + c], hist[e][(H - (K - 1) + j) * C + c]) << e << "," << j << "," << c;
  }
  for (int64_t r : {4, 7})
    for (int64_t i = 0; i < (K - 1) * C; ++i) ASSERT_EQ(st[r * (K - 1) * C + i], st0[r * (K - 1) * C + i]) << r;
}

// gated_delta_net at qwen35's real head shapes (S_k = S_v = 128, 16 key heads tiled over 32 value heads), six
// sequence entries in one step: 1 token (the decode path inside a prefill step), 63 / 64 / 65 / 130 (chunk
// boundaries of a chunked evaluation), a padded entry (q_len 0: its state row unchanged); resets mixed (entries 0,
// 2, 4 start from zero, 1 and 3 continue pre-set rows); 2 trailing tokens of no sequence (outputs unwritten). Then
// one decode token per sequence. Outputs of both steps and the final state rows against the double oracle.
TEST_P(BackendOpsNext, GatedDeltaNetQwenShapesManySequences) {
  KILN_SKIP_UNLESS(Op::kDeltaNet);
  const int64_t Sk = 128, Sv = 128, Hk = 16, Hv = 32, slots = 7, W = Hv * Sv * Sk;
  DeltaCase dc(be(), Sk, Sv, Hk, Hv, slots, 70);
  const std::vector<float> st0 = dev_read<float>(be(), dc.state);
  const std::vector<int32_t> rows = {3, 0, 5, 1, 6, 2};  // entry 5 is the padded one (row 2); row 4 unused
  const std::vector<int32_t> reset = {1, 0, 1, 0, 1, 0};
  std::vector<DeltaOracle> orc(rows.size(), DeltaOracle(Sk, Sv, Hk, Hv));
  for (size_t e = 0; e < rows.size(); ++e)
    if (!reset[e]) orc[e].load(st0.data() + rows[e] * W);
  const std::vector<std::vector<int32_t>> lens = {{1, 63, 64, 65, 130, 0}, {1, 1, 1, 1, 1, 0}};
  uint32_t seed = 71;
  for (size_t step = 0; step < lens.size(); ++step) {
    std::vector<int32_t> start(rows.size(), 0);
    int32_t n_seq_tok = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
      start[e] = lens[step][e] > 0 ? n_seq_tok : 0;
      n_seq_tok += lens[step][e];
    }
    const int64_t n = n_seq_tok + 2, C = dc.C();
    const std::vector<float> x = randn(C * n, seed++), al = randn(Hv * n, seed++), bt = randn(Hv * n, seed++);
    Seqs q(be(), rows, start, lens[step], step == 0 ? reset : std::vector<int32_t>(rows.size(), 0));
    std::vector<float> out;
    KILN_ASSERT_OK(dc.run(be(), x, al, bt, n, q.m, &out));
    std::vector<double> ref(static_cast<size_t>(n_seq_tok * Hv * Sv));
    for (size_t e = 0; e < rows.size(); ++e)
      for (int64_t t = start[e]; t < start[e] + lens[step][e]; ++t) {
        const float* xt = x.data() + t * C;
        orc[e].step(xt, xt + Sk * Hk, xt + 2 * Sk * Hk, al.data() + t * Hv, bt.data() + t * Hv, dc.A.data(),
                    dc.dt.data(), 1.0 / std::sqrt(static_cast<double>(Sk)), 1e-6, ref.data() + t * Hv * Sv);
      }
    const double err = test::nmse_d(std::vector<float>(out.begin(), out.begin() + n_seq_tok * Hv * Sv), ref);
    std::printf("[delta-net] %s qwen35 shapes, step %zu: NMSE %.3e\n", GetParam().c_str(), step, err);
    EXPECT_LE(err, 1e-9) << "step " << step;
    for (size_t i = static_cast<size_t>(n_seq_tok * Hv * Sv); i < out.size(); ++i)
      ASSERT_EQ(out[i], kSentinel) << "a token of no sequence was written (element " << i << ")";
  }
  const std::vector<float> st = dev_read<float>(be(), dc.state);
  for (size_t e = 0; e + 1 < rows.size(); ++e) {
    std::vector<double> r;
    orc[e].store(r);
    EXPECT_LE(test::nmse_d(std::vector<float>(st.begin() + rows[e] * W, st.begin() + (rows[e] + 1) * W), r), 1e-9)
        << "state of entry " << e;
  }
  for (int64_t r : {2, 4})
    EXPECT_TRUE(std::equal(st.begin() + r * W, st.begin() + (r + 1) * W, st0.begin() + r * W))
        << "state row " << r << " (padded / unused) changed";
}

// qwen35's RoPE is llama.cpp's interleaved multi-section form (rope.dimension_sections [11, 11, 10, 0], 64 of
// 256 dims rotated): rotated pair i takes the angle of position component sec(i) (t, h, w interleaved over the
// sections), pos_sec * base^(-2i/n_rot), NeoX pairs (i, i + n_rot/2). For text all components equal the token
// position, so the op's plain NeoX RoPE of the first 64 dims must give the same result; dims 64..255 pass through.
TEST_P(BackendOpsNext, MultiSectionRopeOfTextIsNeoxOfTheLeadingDims) {
  const int hd = 256, n_rot = 64, n_head = 3, n_tok = 5;
  const int sections[4] = {11, 11, 10, 0};
  const double base = 1e7;
  const std::vector<int32_t> pos = {0, 1, 17, 63, 100};
  const std::vector<float> x = randn(static_cast<size_t>(hd * n_head * n_tok), 50);
  const DevTensor X = dev_f32(be(), x, hd, n_head, n_tok), P = dev_i32(be(), pos);
  RopeParams p;
  p.mode = RopeMode::kNeox;
  p.n_rot = n_rot;
  p.freq_base = static_cast<float>(base);
  KILN_ASSERT_OK(be().rope(X.t, P.t, p));
  const std::vector<float> y = dev_read<float>(be(), X);
  const int half = n_rot / 2;
  for (int t = 0; t < n_tok; ++t) {
    const double comp[4] = {static_cast<double>(pos[t]), static_cast<double>(pos[t]), static_cast<double>(pos[t]), 0.0};
    for (int h = 0; h < n_head; ++h) {
      const float* v = x.data() + (t * n_head + h) * hd;
      const float* r = y.data() + (t * n_head + h) * hd;
      for (int i = 0; i < half; ++i) {
        // Interleaved sections: pair i belongs to component i % 3 while that component has pairs left.
        const int m3 = i % 3;
        const int sec = i < 3 * sections[m3] ? m3 : 3;  // past its component's pairs: the 4th (position 0 here)
        const double th = comp[sec] * std::pow(base, -2.0 * i / n_rot);
        const double a0 = v[i], a1 = v[i + half];
        EXPECT_NEAR(r[i], a0 * std::cos(th) - a1 * std::sin(th), 1e-4) << t << "," << h << "," << i;
        EXPECT_NEAR(r[i + half], a0 * std::sin(th) + a1 * std::cos(th), 1e-4) << t << "," << h << "," << i;
      }
      for (int i = n_rot; i < hd; ++i) EXPECT_EQ(r[i], v[i]);
    }
  }
}

// argmax_masked: the allowed entries' first maximum, NaN below every number, -1 when nothing is allowed, bits past
// d ignored. Widths: a partial last word (1000), whole words (128), and a vocabulary-sized row (151936) whose
// walk takes many strides per thread.
int32_t masked_argmax_ref(const float* x, const uint64_t* m, int64_t d) {
  int64_t best = -1;
  for (int64_t i = 0; i < d; ++i) {
    if (!((m[i / 64] >> (i % 64)) & 1)) continue;
    const bool bn = best >= 0 && std::isnan(x[best]);
    if (best < 0 || (bn && !std::isnan(x[i])) || (!bn && !std::isnan(x[i]) && x[i] > x[best])) best = i;
  }
  return static_cast<int32_t>(best);
}

TEST_P(BackendOpsNext, ArgmaxMaskedMatchesTheScalarRule) {
  KILN_SKIP_UNLESS(Op::kArgmaxMasked);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t d : {int64_t{1000}, int64_t{128}, int64_t{151936}}) {
    const int64_t W = (d + 63) / 64;
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<uint64_t>> ms;
    std::vector<int32_t> expect;  // -2: only the reference decides
    const std::vector<float> base = randn(static_cast<size_t>(d), 91);
    std::mt19937_64 rng(7);
    auto add = [&](std::vector<float> x, std::vector<uint64_t> m, int32_t e) {
      xs.push_back(std::move(x)), ms.push_back(std::move(m)), expect.push_back(e);
    };
    const std::vector<uint64_t> none(static_cast<size_t>(W), 0), all(static_cast<size_t>(W), ~uint64_t{0});
    auto only = [&](std::initializer_list<int64_t> ids) {
      std::vector<uint64_t> m = none;
      for (int64_t i : ids) m[static_cast<size_t>(i / 64)] |= uint64_t{1} << (i % 64);
      return m;
    };
    {  // a sparse random mask, and a dense one
      std::vector<uint64_t> sparse(static_cast<size_t>(W)), dense(static_cast<size_t>(W));
      for (int64_t w = 0; w < W; ++w) {
        sparse[w] = rng() & rng() & rng();
        dense[w] = rng() | rng();
      }
      add(base, sparse, -2);
      add(base, dense, -2);
    }
    const int32_t base_max = static_cast<int32_t>(std::max_element(base.begin(), base.end()) - base.begin());
    add(base, all, base_max);  // every bit: argmax
    add(base, none, -1);       // nothing allowed
    {
      std::vector<uint64_t> m = none;  // only bits past d (none when d is whole words)
      if (d % 64) m.back() = ~uint64_t{0} << (d % 64);
      add(base, m, -1);
    }
    {  // ties among the allowed, a larger disallowed entry
      std::vector<float> x = base;
      x[5] = 200.0f, x[9] = 100.0f, x[d - 1] = 100.0f, x[d - 2] = 100.0f;
      add(x, only({9, d - 2, d - 1, 3}), 9);
      add(x, only({d - 1, d - 2}), static_cast<int32_t>(d - 2));
    }
    {  // NaN allowed around the maximum; all-NaN allowed gives the first allowed; -inf beats NaN; +inf is a number
      std::vector<float> x = base;
      x[10] = nan, x[11] = 50.0f, x[12] = nan, x[20] = nan, x[21] = nan, x[30] = -inf, x[31] = nan, x[40] = inf;
      add(x, only({10, 11, 12}), 11);
      add(x, only({21, 20}), 20);
      add(x, only({31, 30}), 30);
      add(x, only({11, 40, 12}), 40);
      add(std::vector<float>(static_cast<size_t>(d), nan), all, 0);
      add(std::vector<float>(static_cast<size_t>(d), -inf), only({d - 1, 70}), 70);
    }
    const int64_t n = static_cast<int64_t>(xs.size());
    std::vector<float> xf;
    std::vector<uint64_t> mf;
    for (int64_t r = 0; r < n; ++r) {
      xf.insert(xf.end(), xs[r].begin(), xs[r].end());
      mf.insert(mf.end(), ms[r].begin(), ms[r].end());
      const int32_t ref = masked_argmax_ref(xs[r].data(), ms[r].data(), d);
      if (expect[r] != -2) {
        EXPECT_EQ(ref, expect[r]) << "test table row " << r << " d " << d;
      }
      expect[r] = ref;
    }
    const DevTensor X = dev_f32(be(), xf, d, n), M = dev_upload(be(), DType::I64, mf, W, n);
    const DevTensor out = dev_alloc(be(), DType::I32, n);
    KILN_ASSERT_OK(be().argmax_masked(X.t, M.t, out.t));
    const std::vector<int32_t> got = dev_read<int32_t>(be(), out);
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(got[r], expect[r]) << "row " << r << " d " << d;
  }
  // Operands: a mask of the wrong width names it.
  const DevTensor X = dev_f32(be(), randn(200, 3), 100, 2), M = dev_upload(be(), DType::I64, std::vector<uint64_t>(6), 3, 2);
  const DevTensor out = dev_alloc(be(), DType::I32, 2);
  const Status st = be().argmax_masked(X.t, M.t, out.t);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.to_string().find("mask"), std::string::npos) << st.to_string();
}

KILN_INSTANTIATE_BACKENDS(BackendOpsNext);

}  // namespace
}  // namespace kiln
