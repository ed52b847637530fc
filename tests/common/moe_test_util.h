// Helpers of the moe_ffn op tests (test_backend_ops_moe.cpp, test_backend_cuda_moe.cpp): the contract's routing in
// double, an expert's plane as a 2-D matmul weight, random expert stacks in backend memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/backend_test_util.h"

namespace kiln::test {

// Every token's experts (decreasing probability) and weights, computed in double.
struct MoeRouting {
  std::vector<int> sel;   // [n_tok * k]
  std::vector<double> w;  // [n_tok * k]
  double min_gap = 1e30;  // smallest relative gap (p_k - p_k+1) / p_k over the tokens (k < n_expert)
};

// kSoftmax gating: p = softmax(router x_t (+ bias, added to the f32 logit as the op does)), the k largest,
// renormalised by their sum (clamped to 2^-14) when norm.
inline MoeRouting moe_route(int64_t d, int64_t n_expert, int64_t n_tok, int k, bool norm,
                            const std::vector<float>& router, const std::vector<float>& x,
                            const std::vector<float>* bias = nullptr) {
  MoeRouting r;
  r.sel.resize(static_cast<size_t>(n_tok * k));
  r.w.resize(r.sel.size());
  for (int64_t t = 0; t < n_tok; ++t) {
    std::vector<double> p(static_cast<size_t>(n_expert));
    double mx = -1e300;
    for (int64_t e = 0; e < n_expert; ++e) {
      double l = 0;
      for (int64_t i = 0; i < d; ++i) l += static_cast<double>(router[e * d + i]) * x[t * d + i];
      if (bias) l = static_cast<double>(static_cast<float>(l) + (*bias)[e]);
      p[e] = l;
      mx = std::max(mx, l);
    }
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - mx));
    for (double& v : p) v /= sum;
    std::vector<int> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    if (k < n_expert) r.min_gap = std::min(r.min_gap, (p[order[k - 1]] - p[order[k]]) / p[order[k - 1]]);
    double s = 0;
    for (int j = 0; j < k; ++j) s += p[order[j]];
    for (int j = 0; j < k; ++j) {
      r.sel[t * k + j] = order[j];
      r.w[t * k + j] = norm ? p[order[j]] / std::max(s, 6.103515625e-5) : p[order[j]];
    }
  }
  return r;
}

// Plane e of an expert stack [n_in, n_out, n_expert] as a 2-D matmul weight.
inline Tensor expert_plane(const Tensor& w, int64_t e) {
  Tensor p = w;
  p.data = static_cast<char*>(w.data) + static_cast<size_t>(e) * w.nb[2];
  p.ne[2] = 1;
  p.nb[3] = p.nb[2];
  return p;
}

// Expert weights of type t (F32 values for the float types, the block format's bytes otherwise).
inline DevTensor upload_experts(Backend& be, DType t, int64_t n_in, int64_t n_out, int64_t n_expert,
                                std::mt19937& rng) {
  return dev_upload(be, t, random_weights(t, n_in, n_out * n_expert, rng), n_in, n_out, n_expert);
}

// Expert e's F32 bias vector of n values (a [n, n_expert] stack), or an empty tensor for an unset stack.
inline Tensor expert_bias(const Tensor& b, int64_t e, int64_t n) {
  if (!b.valid()) return Tensor{};
  return Tensor::make(DType::F32, static_cast<float*>(b.data) + e * n, b.backend, n);
}

// The op's products decomposed on backend `be`: per expert, its slots' rows of x (host, [n_tok][d]) in slot order
// through matmul on the expert's planes of a's gate / up (+ their biases), swiglu, matmul down (+ bias); y gets
// [n_tok * k][d], each slot's down product.
inline Status moe_decompose(Backend& be, const Backend::MoeFfnArgs& a, const std::vector<float>& x,
                            const MoeRouting& r, std::vector<float>* y) {
  const int64_t d = a.gate.ne[0], n_ff = a.gate.ne[1], n_expert = a.gate.ne[2], nk = static_cast<int64_t>(r.sel.size());
  y->assign(static_cast<size_t>(nk * d), 0.0f);
  for (int64_t e = 0; e < n_expert; ++e) {
    std::vector<int64_t> slots;
    for (int64_t s = 0; s < nk; ++s)
      if (r.sel[s] == e) slots.push_back(s);
    if (slots.empty()) continue;
    const int64_t m = static_cast<int64_t>(slots.size());
    std::vector<float> xe;
    for (int64_t s : slots) xe.insert(xe.end(), x.begin() + (s / a.k) * d, x.begin() + (s / a.k + 1) * d);
    const DevTensor XE = dev_f32(be, xe, d, m), GE = dev_alloc(be, DType::F32, n_ff, m),
                    UE = dev_alloc(be, DType::F32, n_ff, m), YE = dev_alloc(be, DType::F32, d, m);
    KILN_TRY(be.matmul(expert_plane(a.gate, e), XE.t, expert_bias(a.gate_bias, e, n_ff), GE.t));
    KILN_TRY(be.matmul(expert_plane(a.up, e), XE.t, expert_bias(a.up_bias, e, n_ff), UE.t));
    KILN_TRY(be.swiglu(GE.t, UE.t, GE.t));
    KILN_TRY(be.matmul(expert_plane(a.down, e), GE.t, expert_bias(a.down_bias, e, d), YE.t));
    const std::vector<float> ye = dev_read<float>(be, YE);
    for (int64_t i = 0; i < m; ++i) std::copy_n(ye.begin() + i * d, d, y->begin() + slots[i] * d);
  }
  return Status::ok();
}

// The contract's weighted sum: acc_t + (y_{t,0} w_0 + y_{t,1} w_1 + ...) in f32, slot order, with the routing's
// weights rounded to f32 (the op's); y: [n_tok * k][d] each slot's down product.
inline std::vector<double> moe_combine(const std::vector<float>& acc0, const std::vector<float>& y, const MoeRouting& r,
                                       int64_t n_tok, int k, int64_t d) {
  std::vector<double> want(acc0.size());
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t o = 0; o < d; ++o) {
      float v = y[(t * k) * d + o] * static_cast<float>(r.w[t * k]);
      for (int j = 1; j < k; ++j) v = v + y[(t * k + j) * d + o] * static_cast<float>(r.w[t * k + j]);
      want[t * d + o] = acc0[t * d + o] + v;
    }
  return want;
}

}  // namespace kiln::test
