// moe_ffn (the mixture-of-experts FFN, backend.h) on every backend of the build: "cpu" (the grouped fast path),
// "cpu-ref" (the scalar reference) and a GPU backend once it runs the op (until then its cases skip, naming the op).
// The binary also runs with KILN_CPU_SIMD=avx2 and =scalar (tests/CMakeLists.txt), so every matmul level the fast
// path dispatches to is covered. Token counts are odd (1, 5, 7, 13, 33), k runs from 1 to n_expert, most experts
// receive several tokens and some none.
//
// Checks, argued from the op's numerics (u = 2^-24):
//   (1) F32 router and F32 experts against the contract evaluated in double (routing, renormalisation, SwiGLU,
//       weighted sum, the residual add): no activation is quantized for F32 weights, so the only errors are f32
//       roundings: dots of <= 64 terms (<= 70u relative to sum |w x|), exp within 2 ulp in softmax and silu, and a
//       handful of products and sums per output. NMSE <= 1e-10 (measured <= 4e-14), while a wrong expert, a missing
//       renormalisation or a dropped slot moves the output by NMSE > 1e-3.
//   (2) Quantized experts (Q4_K gate/up with a Q6_K down as in a Q4_K_M file, Q8_0, F16) against the backend's own
//       decomposition of the contract: per expert, its tokens in increasing order through matmul on the expert's
//       plane, swiglu, matmul down, then the weighted sum on the host in slot order. The CPU runs exactly these
//       products (its fast path groups the rows the same way; the reference computes each row alone, and a row's
//       matmul does not depend on its neighbours), so only the routing weights differ: f32 from the op, double in
//       the test: relative 1e-7, NMSE <= 1e-10 (measured <= 4e-14).
//   Routing is a discontinuous function: the test data are checked to keep a relative probability gap of 1e-3
//   between every token's k-th and (k+1)-th expert (far above the ~1e-6 error of an f32 softmax), so every backend
//   must choose the experts the double-precision oracle chooses.
//   (3) The operand contract: bad k, shapes, aliasing, bias shapes and unsupported types are errors naming the
//       operand, and supports(Op::kMoeFfn, t) says exactly which expert types run.
//   (4) gpt-oss's variant (softmax over the chosen logits, biases, clamped SwiGLU) against its contract in double.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/backend_test_util.h"
#include "common/moe_test_util.h"

namespace kiln {
namespace {

using test::DevTensor;
using test::MoeRouting;
using test::dev_f32;
using test::dev_read;
using test::nmse_d;
using test::randn;

class BackendOpsMoe : public test::BackendOpsTest {};

struct MoeCase {
  int64_t d, n_ff, n_expert, n_tok;
  int k;
  bool norm;
};

std::string name(const MoeCase& c, DType gt, DType dt) {
  return "moe_ffn d=" + std::to_string(c.d) + " ff=" + std::to_string(c.n_ff) + " experts=" +
         std::to_string(c.n_expert) + " n_tok=" + std::to_string(c.n_tok) + " k=" + std::to_string(c.k) +
         (c.norm ? " norm" : "") + " gate/up " + dtype_name(gt) + " down " + dtype_name(dt);
}

// The contract's routing in double for every token (moe_test_util.h).
MoeRouting route(const MoeCase& c, const std::vector<float>& router, const std::vector<float>& x) {
  return test::moe_route(c.d, c.n_expert, c.n_tok, c.k, c.norm, router, x);
}

// Router rows with logits of standard deviation ~3 for x ~ N(0, 1): well separated experts.
std::vector<float> make_router(const MoeCase& c, uint32_t seed) {
  return randn(static_cast<size_t>(c.n_expert * c.d), seed, 3.0f / std::sqrt(static_cast<float>(c.d)));
}

double silu(double v) { return v / (1 + std::exp(-v)); }

TEST_P(BackendOpsMoe, F32ExpertsMatchTheContract) {
  if (!be().supports(Op::kMoeFfn, DType::F32))
    GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run moe_ffn yet";
  const MoeCase cases[] = {{64, 48, 8, 1, 2, true},  {64, 48, 8, 7, 2, true},  {64, 48, 8, 13, 1, true},
                           {64, 48, 8, 33, 8, true}, {64, 48, 8, 5, 3, false}, {64, 48, 6, 13, 6, false}};
  uint32_t seed = 100;
  for (const MoeCase& c : cases) {
    const std::string what = name(c, DType::F32, DType::F32);
    const std::vector<float> router = make_router(c, ++seed), x = randn(static_cast<size_t>(c.d * c.n_tok), ++seed);
    const std::vector<float> wg = randn(static_cast<size_t>(c.d * c.n_ff * c.n_expert), ++seed, 0.2f);
    const std::vector<float> wu = randn(wg.size(), ++seed, 0.2f), wd = randn(wg.size(), ++seed, 0.2f);
    const std::vector<float> acc0 = randn(static_cast<size_t>(c.d * c.n_tok), ++seed, 0.5f);
    const MoeRouting r = route(c, router, x);
    ASSERT_GT(r.min_gap, 1e-3) << what << ": the test data route too close to a tie";

    const DevTensor R = dev_f32(be(), router, c.d, c.n_expert), X = dev_f32(be(), x, c.d, c.n_tok);
    const DevTensor G = dev_f32(be(), wg, c.d, c.n_ff, c.n_expert), U = dev_f32(be(), wu, c.d, c.n_ff, c.n_expert);
    const DevTensor D = dev_f32(be(), wd, c.n_ff, c.d, c.n_expert), A = dev_f32(be(), acc0, c.d, c.n_tok);
    Backend::MoeFfnArgs a;
    a.x = X.t, a.router = R.t, a.gate = G.t, a.up = U.t, a.down = D.t, a.k = c.k, a.norm_topk = c.norm;
    KILN_ASSERT_OK(be().moe_ffn(a, A.t));
    const std::vector<float> got = dev_read<float>(be(), A);

    std::vector<double> want(acc0.begin(), acc0.end()), h(static_cast<size_t>(c.n_ff));
    for (int64_t t = 0; t < c.n_tok; ++t)
      for (int j = 0; j < c.k; ++j) {
        const int64_t e = r.sel[t * c.k + j];
        for (int64_t f = 0; f < c.n_ff; ++f) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < c.d; ++i) {
            g += static_cast<double>(wg[(e * c.n_ff + f) * c.d + i]) * x[t * c.d + i];
            u += static_cast<double>(wu[(e * c.n_ff + f) * c.d + i]) * x[t * c.d + i];
          }
          h[f] = silu(g) * u;
        }
        for (int64_t o = 0; o < c.d; ++o) {
          double y = 0;
          for (int64_t f = 0; f < c.n_ff; ++f) y += static_cast<double>(wd[(e * c.d + o) * c.n_ff + f]) * h[f];
          want[t * c.d + o] += r.w[t * c.k + j] * y;
        }
      }
    EXPECT_LE(nmse_d(got, want), 1e-10) << what;
  }
}

// gpt-oss's variant (MoeGating::kSoftmaxWeight, MoeActivation::kSwigluOai, router and expert biases), F32 experts,
// against the contract in double: logits + bias, the k largest logits, softmax over them, per expert
// g = gate x + gb, u = up x + ub, h = min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1), y = down h + db.
// Same numerics argument as F32ExpertsMatchTheContract: NMSE <= 1e-10, while a dropped bias, softmax over all
// experts or an unclamped activation moves the output by NMSE > 1e-3. The biases and gains put ~10% of g and u
// past the clamp (counted below), so both clamps are exercised.
TEST_P(BackendOpsMoe, OaiVariantMatchesTheContract) {
  if (!be().supports(Op::kMoeFfn, DType::F32))
    GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run moe_ffn yet";
  const MoeCase cases[] = {{64, 48, 8, 1, 2, false}, {64, 48, 8, 13, 4, false}, {64, 32, 4, 7, 2, false},
                           {64, 32, 4, 33, 1, false}};
  const float alpha = 1.702f, limit = 7.0f;
  uint32_t seed = 300;
  for (const MoeCase& c : cases) {
    const std::string what = "oai " + name(c, DType::F32, DType::F32);
    const std::vector<float> router = make_router(c, ++seed), x = randn(static_cast<size_t>(c.d * c.n_tok), ++seed);
    const std::vector<float> rb = randn(static_cast<size_t>(c.n_expert), ++seed);
    const std::vector<float> wg = randn(static_cast<size_t>(c.d * c.n_ff * c.n_expert), ++seed, 0.5f);
    const std::vector<float> wu = randn(wg.size(), ++seed, 0.5f), wd = randn(wg.size(), ++seed, 0.2f);
    const std::vector<float> gb = randn(static_cast<size_t>(c.n_ff * c.n_expert), ++seed, 3.0f);
    const std::vector<float> ub = randn(gb.size(), ++seed, 3.0f);
    const std::vector<float> db = randn(static_cast<size_t>(c.d * c.n_expert), ++seed);
    const std::vector<float> acc0 = randn(static_cast<size_t>(c.d * c.n_tok), ++seed, 0.5f);

    // Routing in double: the k largest biased logits, decreasing; weights = softmax over them.
    std::vector<int> sel(static_cast<size_t>(c.n_tok * c.k));
    std::vector<double> wt(sel.size());
    for (int64_t t = 0; t < c.n_tok; ++t) {
      std::vector<double> l(static_cast<size_t>(c.n_expert));
      for (int64_t e = 0; e < c.n_expert; ++e) {
        l[e] = rb[e];
        for (int64_t i = 0; i < c.d; ++i) l[e] += static_cast<double>(router[e * c.d + i]) * x[t * c.d + i];
      }
      std::vector<int> order(static_cast<size_t>(c.n_expert));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      if (c.k < c.n_expert) {
        ASSERT_GT(l[order[c.k - 1]] - l[order[c.k]], 1e-3) << what << ": a routing near-tie";
      }
      double sum = 0;
      for (int j = 0; j < c.k; ++j) sum += std::exp(l[order[j]] - l[order[0]]);
      for (int j = 0; j < c.k; ++j) {
        sel[t * c.k + j] = order[j];
        wt[t * c.k + j] = std::exp(l[order[j]] - l[order[0]]) / sum;
      }
    }

    const DevTensor R = dev_f32(be(), router, c.d, c.n_expert), X = dev_f32(be(), x, c.d, c.n_tok);
    const DevTensor G = dev_f32(be(), wg, c.d, c.n_ff, c.n_expert), U = dev_f32(be(), wu, c.d, c.n_ff, c.n_expert);
    const DevTensor D = dev_f32(be(), wd, c.n_ff, c.d, c.n_expert), A = dev_f32(be(), acc0, c.d, c.n_tok);
    const DevTensor RB = dev_f32(be(), rb, c.n_expert), GB = dev_f32(be(), gb, c.n_ff, c.n_expert),
                    UB = dev_f32(be(), ub, c.n_ff, c.n_expert), DB = dev_f32(be(), db, c.d, c.n_expert);
    Backend::MoeFfnArgs a;
    a.x = X.t, a.router = R.t, a.gate = G.t, a.up = U.t, a.down = D.t, a.k = c.k, a.norm_topk = false;
    a.gating = MoeGating::kSoftmaxWeight, a.act = MoeActivation::kSwigluOai;
    a.router_bias = RB.t, a.gate_bias = GB.t, a.up_bias = UB.t, a.down_bias = DB.t;
    KILN_ASSERT_OK(be().moe_ffn(a, A.t));
    const std::vector<float> got = dev_read<float>(be(), A);

    std::vector<double> want(acc0.begin(), acc0.end()), h(static_cast<size_t>(c.n_ff));
    int64_t clamped = 0, values = 0;
    for (int64_t t = 0; t < c.n_tok; ++t)
      for (int j = 0; j < c.k; ++j) {
        const int64_t e = sel[t * c.k + j];
        for (int64_t f = 0; f < c.n_ff; ++f) {
          double g = gb[e * c.n_ff + f], u = ub[e * c.n_ff + f];
          for (int64_t i = 0; i < c.d; ++i) {
            g += static_cast<double>(wg[(e * c.n_ff + f) * c.d + i]) * x[t * c.d + i];
            u += static_cast<double>(wu[(e * c.n_ff + f) * c.d + i]) * x[t * c.d + i];
          }
          clamped += (g > limit) + (std::abs(u) > limit);
          values += 2;
          const double xg = std::min<double>(g, limit), yu = std::clamp<double>(u, -limit, limit);
          h[f] = xg / (1 + std::exp(-alpha * xg)) * (yu + 1);
        }
        for (int64_t o = 0; o < c.d; ++o) {
          double y = db[e * c.d + o];
          for (int64_t f = 0; f < c.n_ff; ++f) y += static_cast<double>(wd[(e * c.d + o) * c.n_ff + f]) * h[f];
          want[t * c.d + o] += wt[t * c.k + j] * y;
        }
      }
    EXPECT_GT(clamped, values / 50) << what << ": the data must reach the clamps";
    EXPECT_LE(nmse_d(got, want), 1e-10) << what;
  }
}

TEST_P(BackendOpsMoe, QuantizedExpertsEqualTheirProducts) {
  const struct { DType gate_up, down; } types[] = {{DType::Q4_K, DType::Q6_K}, {DType::Q8_0, DType::Q8_0},
                                                   {DType::F16, DType::F16}};
  // One expert set per type (d and n_ff whole blocks of 256 for the k-quants); the cases vary tokens, k and norm.
  const int64_t d = 256, n_ff = 256, n_expert = 8;
  // 1 and 2 tokens: the decode path of a device backend (CUDA: the experts' GEMV, its slot sum in chunks of 4 slots,
  // so k 5 and 8 too).
  const MoeCase cases[] = {{d, n_ff, n_expert, 1, 2, true},  {d, n_ff, n_expert, 13, 2, true},
                           {d, n_ff, n_expert, 5, 8, true},  {d, n_ff, n_expert, 7, 1, false},
                           {d, n_ff, n_expert, 2, 8, true},  {d, n_ff, n_expert, 1, 5, false}};
  int ran = 0;
  uint32_t seed = 200;
  for (const auto& ty : types) {
    if (!be().supports(Op::kMoeFfn, ty.gate_up) || !be().supports(Op::kMoeFfn, ty.down)) continue;
    ++ran;
    std::mt19937 rng(++seed);
    const DevTensor G = test::upload_experts(be(), ty.gate_up, d, n_ff, n_expert, rng);
    const DevTensor U = test::upload_experts(be(), ty.gate_up, d, n_ff, n_expert, rng);
    const DevTensor D = test::upload_experts(be(), ty.down, n_ff, d, n_expert, rng);
    for (const MoeCase& c : cases) {
      const std::string what = name(c, ty.gate_up, ty.down);
      const std::vector<float> router = make_router(c, ++seed), x = randn(static_cast<size_t>(c.d * c.n_tok), ++seed);
      const std::vector<float> acc0 = randn(static_cast<size_t>(c.d * c.n_tok), ++seed, 0.5f);
      const MoeRouting r = route(c, router, x);
      ASSERT_GT(r.min_gap, 1e-3) << what << ": the test data route too close to a tie";
      const DevTensor R = dev_f32(be(), router, c.d, c.n_expert), X = dev_f32(be(), x, c.d, c.n_tok);
      const DevTensor A = dev_f32(be(), acc0, c.d, c.n_tok);
      Backend::MoeFfnArgs a;
      a.x = X.t, a.router = R.t, a.gate = G.t, a.up = U.t, a.down = D.t, a.k = c.k, a.norm_topk = c.norm;
      KILN_ASSERT_OK(be().moe_ffn(a, A.t));
      const std::vector<float> got = dev_read<float>(be(), A);

      // The decomposition: expert by expert, its slots in token order.
      std::vector<float> y;
      KILN_ASSERT_OK(test::moe_decompose(be(), a, x, r, &y));
      const std::vector<double> want = test::moe_combine(acc0, y, r, c.n_tok, c.k, c.d);
      EXPECT_LE(nmse_d(got, want), 1e-10) << what << " vs matmul, swiglu, matmul per expert";
    }
  }
  if (ran == 0) GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run moe_ffn yet";
}

TEST_P(BackendOpsMoe, OperandErrorsNameTheOperand) {
  const int64_t d = 32, ff = 16, E = 4, n = 3;
  const DevTensor R = dev_f32(be(), randn(d * E, 1), d, E), X = dev_f32(be(), randn(d * n, 2), d, n);
  const DevTensor G = dev_f32(be(), randn(d * ff * E, 3), d, ff, E), U = dev_f32(be(), randn(d * ff * E, 4), d, ff, E);
  const DevTensor D = dev_f32(be(), randn(d * ff * E, 5), ff, d, E), A = dev_f32(be(), randn(d * n, 6), d, n);
  Backend::MoeFfnArgs ok;
  ok.x = X.t, ok.router = R.t, ok.gate = G.t, ok.up = U.t, ok.down = D.t, ok.k = 2, ok.norm_topk = true;
  if (!be().supports(Op::kMoeFfn, DType::F32)) {
    const Status st = be().moe_ffn(ok, A.t);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
    EXPECT_NE(st.message().find("moe_ffn"), std::string::npos) << st.to_string();
    GTEST_SKIP() << "skipped: backend " << GetParam() << " does not run moe_ffn yet (and says so)";
  }
  auto expect = [&](const Backend::MoeFfnArgs& a, const Tensor& acc, ErrorCode code, const char* needle) {
    const Status st = be().moe_ffn(a, acc);
    EXPECT_EQ(st.code(), code) << needle << ": " << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  };
  Backend::MoeFfnArgs a = ok;
  a.k = 0;
  expect(a, A.t, ErrorCode::kInvalidArgument, "k = 0");
  a.k = 5;
  expect(a, A.t, ErrorCode::kInvalidArgument, "k = 5");
  a = ok;
  a.down = G.t;  // [d, ff, E] where [ff, d, E] is wanted
  expect(a, A.t, ErrorCode::kInvalidArgument, "down");
  a = ok;
  a.router = G.t;
  expect(a, A.t, ErrorCode::kInvalidArgument, "router");
  // Biases: F32 of the operand's [width, n_expert] (router: [n_expert]).
  a = ok;
  a.gate_bias = R.t;  // [d, E] where [ff, E] is wanted
  expect(a, A.t, ErrorCode::kInvalidArgument, "gate_bias");
  a = ok;
  a.router_bias = R.t;  // [d, E] where [E] is wanted
  expect(a, A.t, ErrorCode::kInvalidArgument, "router_bias");
  a = ok;
  a.down_bias = R.t;
  a.down_bias.dtype = DType::F16;
  expect(a, A.t, ErrorCode::kUnsupported, "down_bias");
  expect(ok, X.t, ErrorCode::kInvalidArgument, "alias");
  // A type supports() rejects is kUnsupported from the op, naming the operand.
  for (DType t : {DType::Q8_K, DType::Q8_1}) {
    EXPECT_FALSE(be().supports(Op::kMoeFfn, t)) << dtype_name(t);
    a = ok;
    a.up.dtype = t;
    expect(a, A.t, ErrorCode::kUnsupported, "up type");
  }
  // On the CPU every expert type its matmul reads runs (each product goes through the matmul's own selector).
  if (is_cpu()) {
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K})
      EXPECT_EQ(be().supports(Op::kMoeFfn, t), be().supports(Op::kMatmul, t)) << dtype_name(t);
  }
}

KILN_INSTANTIATE_BACKENDS(BackendOpsMoe);

}  // namespace
}  // namespace kiln
