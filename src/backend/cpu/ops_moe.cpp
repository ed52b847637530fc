// CPU mixture-of-experts FFN (moe_ffn; contract and order of operations: backend/backend.h).
//
// A token's k (token, expert) pairs are its slots s = t * k + j. Both versions compute per slot the same three
// products with the matmul's numerics (backend/cpu/matmul.h: the activations quantized row by row to the weight
// type's activation type, so a slot's result does not depend on which other rows share its call):
//   reference: matmul_ref per slot (one row per call), slots in token order, single-threaded.
//   fast: the slots grouped by expert (expert 0's slots first, tokens increasing within an expert), x gathered into
//     that order, then one matmul per active expert over all its rows: the gate and up products of every active
//     expert in one matmul_group (one fork-join per 8 products, a gathered row block quantized once for gate and
//     up), SwiGLU, the down products likewise. A decode step reads only the k experts' weights; a prefill reads
//     each active expert's weights once per tile of rows instead of once per token.
// Routing (softmax, top k, renormalisation) and the weighted sum are one shared scalar code path: they are cheap
// (k * n_expert per token) and must be identical in both versions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/op_checks.h"

namespace kiln::cpu {
namespace {

// llama.cpp clamps the sum of the selected weights to the smallest normal f16 before dividing by it.
constexpr float kMinWeightSum = 6.103515625e-5f;

// One token's routing from its router logits (kSoftmax: overwritten with the probabilities, softmax_row: the
// softmax op's row, max-subtracted exp in f32, the sum in double, one f32 reciprocal), then the k largest values in
// decreasing order (ties: the lower index), their weights (kSoftmaxWeight: softmax_row over the k chosen logits)
// optionally divided by their sum (summed exactly, rounded once). sel always receives k distinct experts in
// [0, n_expert), whatever the logits hold (NaN included).
void route_token(float* p, int64_t n_expert, int k, MoeGating gating, bool norm, int32_t* sel, float* w) {
  if (gating == MoeGating::kSoftmax) softmax_row(p, p, n_expert);
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n_expert; ++e) {
      bool taken = false;
      for (int i = 0; i < j && !taken; ++i) taken = sel[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    sel[j] = static_cast<int32_t>(best);
    w[j] = p[best];
  }
  if (gating == MoeGating::kSoftmaxWeight) softmax_row(w, w, k);
  if (!norm) return;
  double s = 0;
  for (int j = 0; j < k; ++j) s += w[j];
  const float sf = std::max(static_cast<float>(s), kMinWeightSum);
  for (int j = 0; j < k; ++j) w[j] /= sf;
}

const float* bias_data(const Tensor& t) { return t.valid() ? static_cast<const float*>(t.data) : nullptr; }

void add_row(float* x, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + b[i];
}

// gpt-oss's clamped SwiGLU (MoeActivation::kSwigluOai), in ggml's f32 steps: x = min(g, limit),
// y = clamp(u, -limit, limit), out = x / (1 + exp(alpha * -x)) * (y + 1).
void swiglu_oai_row(const float* g, const float* u, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(g[i], limit);
    const float y = std::clamp(u[i], -limit, limit);
    out[i] = x / (1.0f + std::exp(alpha * (-x))) * (y + 1.0f);
  }
}

MatmulArgs plane_args(const Tensor& w, int64_t e, const float* x, int64_t n_tok, float* y) {
  MatmulArgs a;
  a.wtype = w.dtype;
  a.w = static_cast<const char*>(w.data) + static_cast<size_t>(e) * w.nb[2];
  a.w_row_bytes = w.nb[1];
  a.n_out = w.ne[1];
  a.n_in = w.ne[0];
  a.x = x;
  a.x_stride = static_cast<size_t>(w.ne[0]);
  a.n_tok = n_tok;
  a.y = y;
  a.y_stride = static_cast<size_t>(w.ne[1]);
  return a;
}

}  // namespace

Status CpuBackend::moe_ffn(const MoeFfnArgs& a, const Tensor& acc) {
  KILN_TRY(op_checks::moe_ffn_operands(a, acc, matmul_supports, matmul_supports));
  const int64_t n = a.x.n_rows(), d = a.x.ne[0], n_expert = a.router.ne[1], n_ff = a.gate.ne[1];
  const int k = a.k;
  const int64_t nk = n * k;
  if (n == 0) return Status::ok();
  auto parallel = [&](int64_t rows, auto&& fn) {
    if (reference_ || pool_.size() == 1 || rows == 1)
      fn(int64_t{0}, rows);
    else
      pool_.parallel_for(rows, fn);
  };

  // Scratch. floats: logits [n_expert, n] | xg [d, nk] (fast only) | g, u [n_ff, nk] | y [d, nk];
  // ints: sel [nk] | row [nk] (slot -> row of xg/g/u/y) | first [n_expert + 1] (expert e's rows in the fast order).
  const size_t nf = static_cast<size_t>(n_expert * n + (reference_ ? 0 : d * nk) + 2 * n_ff * nk + d * nk);
  if (moe_f32_.size() < nf) moe_f32_.resize(nf);
  const size_t ni = static_cast<size_t>(2 * nk + n_expert + 1);
  if (moe_i32_.size() < ni) moe_i32_.resize(ni);
  if (moe_w_.size() < static_cast<size_t>(nk)) moe_w_.resize(static_cast<size_t>(nk));
  float* logits = moe_f32_.data();
  float* xg = logits + n_expert * n;
  float* g = xg + (reference_ ? 0 : d * nk);
  float* u = g + n_ff * nk;
  float* y = u + n_ff * nk;
  int32_t* sel = moe_i32_.data();
  int32_t* row = sel + nk;
  int32_t* first = row + nk;
  float* wt = moe_w_.data();
  const float* x = static_cast<const float*>(a.x.data);
  const size_t xs = a.x.nb[1] / sizeof(float);

  // Router logits, then each token's experts and weights.
  MatmulArgs lg;
  lg.wtype = a.router.dtype;
  lg.w = a.router.data;
  lg.w_row_bytes = a.router.nb[1];
  lg.n_out = n_expert;
  lg.n_in = d;
  lg.x = x;
  lg.x_stride = xs;
  lg.n_tok = n;
  lg.y = logits;
  lg.y_stride = static_cast<size_t>(n_expert);
  KILN_TRY(reference_ ? matmul_ref(lg) : cpu::matmul(lg, pool_));
  const float* rb = bias_data(a.router_bias);
  parallel(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* l = logits + t * n_expert;
      if (rb)
        for (int64_t i = 0; i < n_expert; ++i) l[i] = l[i] + rb[i];
      route_token(l, n_expert, k, a.gating, a.norm_topk, sel + t * k, wt + t * k);
    }
  });

  std::vector<MatmulArgs> mm;
  if (reference_) {
    for (int64_t s = 0; s < nk; ++s) row[s] = static_cast<int32_t>(s);
    for (int64_t s = 0; s < nk; ++s) {
      const float* xt = x + (s / k) * xs;
      KILN_TRY(matmul_ref(plane_args(a.gate, sel[s], xt, 1, g + s * n_ff)));
      KILN_TRY(matmul_ref(plane_args(a.up, sel[s], xt, 1, u + s * n_ff)));
    }
  } else {
    // Rows grouped by expert: first[e] = expert e's first row; slots in token order within an expert.
    std::fill(first, first + n_expert + 1, 0);
    for (int64_t s = 0; s < nk; ++s) ++first[sel[s] + 1];
    for (int64_t e = 0; e < n_expert; ++e) first[e + 1] += first[e];
    for (int64_t s = 0; s < nk; ++s) row[s] = first[sel[s]]++;
    for (int64_t e = n_expert; e > 0; --e) first[e] = first[e - 1];  // undo the fill: back to the starts
    first[0] = 0;
    parallel(nk, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) std::memcpy(xg + row[s] * d, x + (s / k) * xs, static_cast<size_t>(d) * sizeof(float));
    });
    for (int64_t e = 0; e < n_expert; ++e) {
      const int64_t r0 = first[e], cnt = first[e + 1] - r0;
      if (cnt == 0) continue;
      mm.push_back(plane_args(a.gate, e, xg + r0 * d, cnt, g + r0 * n_ff));
      mm.push_back(plane_args(a.up, e, xg + r0 * d, cnt, u + r0 * n_ff));
    }
    KILN_TRY(cpu::matmul_group(mm.data(), static_cast<int>(mm.size()), pool_));
  }

  // Slot s's row of g/u/y is row[s]; its expert sel[s]. Gate and up biases, then the activation on every row, then
  // the down products and their bias.
  const float* gb = bias_data(a.gate_bias);
  const float* ub = bias_data(a.up_bias);
  const float* db = bias_data(a.down_bias);
  const VecKernels& vk = reference_ ? vec_kernels_scalar() : vec_kernels();
  parallel(nk, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      float* gr = g + row[s] * n_ff;
      float* ur = u + row[s] * n_ff;
      if (gb) add_row(gr, gb + sel[s] * n_ff, n_ff);
      if (ub) add_row(ur, ub + sel[s] * n_ff, n_ff);
      if (a.act == MoeActivation::kSwigluOai)
        swiglu_oai_row(gr, ur, gr, n_ff, a.oai_alpha, a.oai_limit);
      else
        vk.swiglu(gr, ur, gr, n_ff);
    }
  });
  if (reference_) {
    for (int64_t s = 0; s < nk; ++s) KILN_TRY(matmul_ref(plane_args(a.down, sel[s], g + s * n_ff, 1, y + s * d)));
  } else {
    mm.clear();
    for (int64_t e = 0; e < n_expert; ++e) {
      const int64_t r0 = first[e], cnt = first[e + 1] - r0;
      if (cnt > 0) mm.push_back(plane_args(a.down, e, g + r0 * n_ff, cnt, y + r0 * d));
    }
    KILN_TRY(cpu::matmul_group(mm.data(), static_cast<int>(mm.size()), pool_));
  }
  if (db) {
    parallel(nk, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) add_row(y + row[s] * d, db + sel[s] * d, d);
    });
  }

  // acc_t += (y_0 w_0 + y_1 w_1) + ... in slot order, each product rounded to f32 before its add.
  const size_t as = acc.nb[1] / sizeof(float);
  float* out = static_cast<float*>(acc.data);
  parallel(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int32_t* rt = row + t * k;
      const float* w = wt + t * k;
      float* o = out + t * as;
      for (int64_t i = 0; i < d; ++i) {
        float v = y[rt[0] * d + i] * w[0];
        for (int j = 1; j < k; ++j) {
          const float yw = y[rt[j] * d + i] * w[j];
          v = v + yw;
        }
        o[i] = o[i] + v;
      }
    }
  });
  return Status::ok();
}

}  // namespace kiln::cpu
