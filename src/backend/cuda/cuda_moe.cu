// CudaBackend::moe_ffn: the mixture-of-experts FFN (contract and order of operations: backend/backend.h; the CPU's
// ops_moe.cpp is the spec). The order of operations:
//   1. router logits: matmul (router, x) -> [n_tok][n_expert]
//   2. moe_route (moe.cu): each token's k experts and weights, on the device
//   3. the experts' products, one of three ways (the first that applies):
//      GEMV path (moe_gemv_ok: matmul would take the GEMV for every expert's share of the step, i.e. for 1..n_tok
//      tokens of each weight type): x quantized once (by the norm before the op when it wrote x:
//      rms_norm_for_matmul, whose q8_1 rows moe_ffn takes before use() drops them), then per slot (t, j) gate and
//      up reading expert sel[t][j] on the device, the activation (one launch: launch_mmvq_id_glu), h quantized, the
//      down GEMV per slot summed into acc (one launch: launch_mmvq_id_sum, which is step 4 too). A slot's result is
//      its expert's matmul row.
//      device-grouped path (moe_grouped_ok: prefill-sized steps, n_tok > kGemvMaxTok, every expert type on mmq):
//      moe_group (moe.cu) groups the slots by expert on the device (expert 0's first, tokens increasing within an
//      expert: row[s] of slot s, tok[r] of row r, first[e], mmq's tile sections), moe_gather puts the x rows in that
//      order, then one grouped mmq launch per product (launch.h MatmulGroup: each block one expert's tile of rows),
//      the activation over all rows, the grouped down product. Each expert's rows get mmq's 64 x 64 arithmetic
//      (q8_1 activations for the quantized types), which is matmul's wherever matmul takes the int8 kernels (mmvq,
//      mmq) and differs from it by the activations' rounding where matmul takes mmf (f16) or cuBLAS.
//      host-grouped path (otherwise: types mmq lacks, such as IQ4_XS and the other i-quants, or 3..32 tokens): the
//      experts back to the host (one device-to-host copy and a stream synchronize), the grouping above on the
//      host, per active expert gate and up matmuls over its rows (their biases added by matmul), the activation
//      over all rows, the down matmul (+ bias): every slot's result is its expert's matmul over those rows.
//   4. moe_combine: acc_t += sum_j w_{t,j} y_{row(t,j)} in slot order.
// Nothing but the host-grouped path waits on the host. It is never captured: its eager run (a step is captured on
// its second occurrence) marks its graph key (graph_seen_ -1). A decode step reads only the active experts'
// weights; a prefill reads each active expert's weights once per token tile of its rows.
// Scratch (moe_buf_, grown outside captures; MoeScratch): logits n_tok x n_expert, w and sel, row and tok (nk =
// n_tok k each), first (n_expert + 1), tiles (MatmulGroup's sections), xg nk x d, g and u nk x n_ff, y nk x d
// floats, each region 256-byte aligned.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/op_checks.h"

namespace kiln::cuda {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }
size_t fstride(const Tensor& t) { return t.nb[1] / sizeof(float); }

// Expert e's plane of a [n_in, n_out, n_expert] weight as a 2-D matrix (the file's layout: planes contiguous).
Tensor plane(const Tensor& w, int64_t e) {
  Tensor p = w;
  p.data = static_cast<char*>(w.data) + static_cast<size_t>(e) * w.nb[2];
  p.ne[2] = 1, p.ne[3] = 1;
  p.nb[2] = p.nb[1] * static_cast<size_t>(p.ne[1]), p.nb[3] = p.nb[2];
  return p;
}

// Rows [r0, r0 + cnt) of a contiguous F32 [cols, rows] buffer.
Tensor rows(float* base, Backend* be, int64_t cols, int64_t r0, int64_t cnt) {
  return Tensor::make(DType::F32, base + r0 * cols, be, cols, cnt);
}

// Expert e's F32 bias vector of n values (biases [n, n_expert]), or an empty tensor.
Tensor bias_of(const Tensor& b, int64_t e, int64_t n) {
  if (!b.valid()) return Tensor{};
  return Tensor::make(DType::F32, static_cast<float*>(b.data) + e * n, b.backend, n);
}

}  // namespace

struct CudaBackend::MoeScratch {
  float* logits;
  float* w;
  int32_t *sel, *row, *tok, *first;
  int2* tiles;
  float *xg, *g, *u, *y;
};

Status CudaBackend::moe_ffn(const MoeFfnArgs& a, const Tensor& acc) {
  KILN_TRY(op_checks::moe_ffn_operands(a, acc, gemm_supports, gemm_supports));
  ActQ px{};  // x's q8_1 rows when rms_norm_for_matmul wrote x (taken before use() drops them)
  const bool pend = take_pending(a.x, &px);
  KILN_TRY(use());
  const int64_t n = a.x.n_rows(), d = a.x.ne[0], n_expert = a.router.ne[1], n_ff = a.gate.ne[1];
  const int64_t nk = n * a.k;
  if (n == 0) return Status::ok();
  const bool gemv = moe_gemv_ok(a, n), grouped = !gemv && moe_grouped_ok(a, n);
  if (!gemv && !grouped) {
    if (capturing_) {
      capture_failed_ = true;
      return make_error(ErrorCode::kInternal, "%s: moe_ffn of %lld tokens waits for the routing on the host and "
                        "cannot run inside a CUDA graph capture (set KILN_CUDA_GRAPHS=0)", name_.c_str(),
                        static_cast<long long>(n));
    }
    if (step_key_set_) graph_seen_[step_key_] = -1;  // this step shape runs eagerly from now on
  }

  size_t total = 0;
  const auto region = [&](size_t bytes) {
    const size_t at = total;
    total += align256(bytes);
    return at;
  };
  const size_t i4 = sizeof(int32_t), f4 = sizeof(float);
  const size_t o_logits = region(static_cast<size_t>(n * n_expert) * f4), o_w = region(static_cast<size_t>(nk) * f4);
  const size_t o_sel = region(static_cast<size_t>(nk) * i4), o_row = region(static_cast<size_t>(nk) * i4);
  const size_t o_tok = region(static_cast<size_t>(nk) * i4), o_first = region(static_cast<size_t>(n_expert + 1) * i4);
  const size_t o_tiles = region(static_cast<size_t>(mmq_group_entries(nk, static_cast<int>(n_expert))) * sizeof(int2));
  const size_t o_xg = region(static_cast<size_t>(nk * d) * f4), o_g = region(static_cast<size_t>(nk * n_ff) * f4);
  const size_t o_u = region(static_cast<size_t>(nk * n_ff) * f4), o_y = region(static_cast<size_t>(nk * d) * f4);
  KILN_TRY(ensure_scratch(&moe_buf_, &moe_bytes_, total, "moe_ffn"));
  char* base = static_cast<char*>(moe_buf_);
  const auto at = [&](size_t off) { return static_cast<void*>(base + off); };
  const MoeScratch m{static_cast<float*>(at(o_logits)), static_cast<float*>(at(o_w)),
                     static_cast<int32_t*>(at(o_sel)),  static_cast<int32_t*>(at(o_row)),
                     static_cast<int32_t*>(at(o_tok)),  static_cast<int32_t*>(at(o_first)),
                     static_cast<int2*>(at(o_tiles)),   static_cast<float*>(at(o_xg)),
                     static_cast<float*>(at(o_g)),      static_cast<float*>(at(o_u)),
                     static_cast<float*>(at(o_y))};

  // 1, 2: logits and routing on the device
  const ActQ* ax = pend ? &px : nullptr;
  KILN_TRY(matmul_run(a.router, a.x, Tensor{}, Tensor::make(DType::F32, m.logits, this, n_expert, n), false,
                      mmvq_supports(a.router.dtype) ? ax : nullptr));
  MoeRouteParams rp{};
  rp.logits = m.logits;
  rp.bias = a.router_bias.valid() ? static_cast<const float*>(a.router_bias.data) : nullptr;
  rp.n_tok = n, rp.n_expert = static_cast<int>(n_expert), rp.k = a.k;
  rp.softmax_all = a.gating == MoeGating::kSoftmax;
  rp.softmax_chosen = a.gating == MoeGating::kSoftmaxWeight;
  rp.norm = a.norm_topk;
  rp.sel = m.sel, rp.w = m.w;
  KILN_TRY(launch_moe_route(rp, stream_));

  // 3, 4
  if (gemv) return moe_ffn_gemv(a, m, acc, ax);
  if (grouped) return moe_ffn_grouped(a, m, acc);
  return moe_ffn_host(a, m, acc);
}

// Steps 3 and 4 on the host-grouped path (the header).
Status CudaBackend::moe_ffn_host(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc) {
  const int64_t n = a.x.n_rows(), d = a.x.ne[0], n_expert = a.router.ne[1], n_ff = a.gate.ne[1];
  const int k = a.k;
  const int64_t nk = n * k;
  std::vector<int32_t> sel(static_cast<size_t>(nk)), row(static_cast<size_t>(nk)), tok(static_cast<size_t>(nk));
  std::vector<int64_t> first(static_cast<size_t>(n_expert) + 1, 0);
  KILN_CUDA_TRY(cudaMemcpyAsync(sel.data(), m.sel, static_cast<size_t>(nk) * 4, cudaMemcpyDeviceToHost, stream_));
  KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
  for (int64_t s = 0; s < nk; ++s) {
    if (sel[s] < 0 || sel[s] >= n_expert)
      return make_error(ErrorCode::kInternal, "%s: moe_ffn routed a token to expert %d of %lld", name_.c_str(), sel[s],
                        static_cast<long long>(n_expert));
    ++first[static_cast<size_t>(sel[s]) + 1];
  }
  for (int64_t e = 0; e < n_expert; ++e) first[e + 1] += first[e];
  {
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t s = 0; s < nk; ++s) {
      const int64_t r = next[static_cast<size_t>(sel[s])]++;
      row[s] = static_cast<int32_t>(r);
      tok[r] = static_cast<int32_t>(s / k);
    }
  }
  KILN_CUDA_TRY(cudaMemcpyAsync(m.row, row.data(), static_cast<size_t>(nk) * 4, cudaMemcpyHostToDevice, stream_));
  KILN_CUDA_TRY(cudaMemcpyAsync(m.tok, tok.data(), static_cast<size_t>(nk) * 4, cudaMemcpyHostToDevice, stream_));

  KILN_TRY(launch_moe_gather(static_cast<const float*>(a.x.data), fstride(a.x), m.tok, nk, d, m.xg, stream_));
  for (int64_t e = 0; e < n_expert; ++e) {
    const int64_t r0 = first[e], cnt = first[e + 1] - r0;
    if (cnt == 0) continue;
    const Tensor xe = rows(m.xg, this, d, r0, cnt);
    KILN_TRY(matmul_run(plane(a.gate, e), xe, bias_of(a.gate_bias, e, n_ff), rows(m.g, this, n_ff, r0, cnt), false, nullptr));
    KILN_TRY(matmul_run(plane(a.up, e), xe, bias_of(a.up_bias, e, n_ff), rows(m.u, this, n_ff, r0, cnt), false, nullptr));
  }
  KILN_TRY(moe_activation(a, m.g, m.u, nk));
  for (int64_t e = 0; e < n_expert; ++e) {
    const int64_t r0 = first[e], cnt = first[e + 1] - r0;
    if (cnt == 0) continue;
    KILN_TRY(matmul_run(plane(a.down, e), rows(m.g, this, n_ff, r0, cnt), bias_of(a.down_bias, e, d),
                        rows(m.y, this, d, r0, cnt), false, nullptr));
  }
  MoeCombineParams cp{m.y, m.row, m.w, static_cast<float*>(acc.data), fstride(acc), n, d, k};
  return launch_moe_combine(cp, stream_);
}

MatmulParams CudaBackend::moe_grouped_params(const Tensor& w, const Tensor& bias, const Tensor& x, const Tensor& out) {
  return matmul_params(plane(w, 0), x, bias_of(bias, 0, w.ne[1]), out, false);
}

// Whether the device-grouped path takes n tokens: prefill-sized steps (the 3..32-token steps keep the per-expert
// matmuls of the host-grouped path, whose kernels the selector picks per row count), every expert type on mmq with
// these shapes, and at most kMoeGroupMaxExperts experts.
bool CudaBackend::moe_grouped_ok(const MoeFfnArgs& a, int64_t n) const {
  if (n <= kGemvMaxTok || a.router.ne[1] > kMoeGroupMaxExperts) return false;
  const int64_t d = a.x.ne[0], n_ff = a.gate.ne[1];
  // shapes and alignment as the scratch gives them (256-byte aligned rows of whole floats)
  const auto at = [](uintptr_t v) { return reinterpret_cast<float*>(v << 8); };
  const Tensor xd = Tensor::make(DType::F32, at(1), nullptr, d, n), xf = Tensor::make(DType::F32, at(2), nullptr, n_ff, n);
  const Tensor yf = Tensor::make(DType::F32, at(3), nullptr, n_ff, n), yd = Tensor::make(DType::F32, at(4), nullptr, d, n);
  return mmq_usable(moe_grouped_params(a.gate, Tensor{}, xd, yf)) && mmq_usable(moe_grouped_params(a.up, Tensor{}, xd, yf)) &&
         mmq_usable(moe_grouped_params(a.down, Tensor{}, xf, yd));
}

// Steps 3 and 4 on the device-grouped path (the header).
Status CudaBackend::moe_ffn_grouped(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc) {
  const int64_t n = a.x.n_rows(), d = a.x.ne[0], n_expert = a.router.ne[1], n_ff = a.gate.ne[1], nk = n * a.k;
  MoeGroupParams gp{m.sel, nk, static_cast<int>(n_expert), a.k, m.first, m.row, m.tok, m.tiles};
  KILN_TRY(launch_moe_group(gp, stream_));
  KILN_TRY(launch_moe_gather(static_cast<const float*>(a.x.data), fstride(a.x), m.tok, nk, d, m.xg, stream_));
  const auto product = [&](const Tensor& w, const Tensor& b, const Tensor& x, float* out, int64_t n_out,
                           const ActQ& act) {
    const MatmulGroup g{m.first, m.tiles, nk, static_cast<int>(n_expert), w.nb[2]};
    return launch_mmq(moe_grouped_params(w, b, x, rows(out, this, n_out, 0, nk)), act, stream_, &g);
  };
  const auto act_of = [&](const Tensor& x, DType t1, DType t2) -> Result<ActQ> {
    if (!mmvq_supports(t1) && !mmvq_supports(t2)) return ActQ{};  // F16 / BF16 read x as f32
    return quantize_act(x);
  };
  {
    const Tensor xg = rows(m.xg, this, d, 0, nk);
    KILN_ASSIGN_OR_RETURN(const ActQ ax, act_of(xg, a.gate.dtype, a.up.dtype));
    KILN_TRY(product(a.gate, a.gate_bias, xg, m.g, n_ff, ax));
    KILN_TRY(product(a.up, a.up_bias, xg, m.u, n_ff, ax));
  }
  KILN_TRY(moe_activation(a, m.g, m.u, nk));
  const Tensor h = rows(m.g, this, n_ff, 0, nk);
  KILN_ASSIGN_OR_RETURN(const ActQ ah, act_of(h, a.down.dtype, a.down.dtype));
  KILN_TRY(product(a.down, a.down_bias, h, m.y, d, ah));
  MoeCombineParams cp{m.y, m.row, m.w, static_cast<float*>(acc.data), fstride(acc), n, d, a.k};
  return launch_moe_combine(cp, stream_);
}

// Step 3's activation over nk rows of n_ff, in place on g: h = act(g, u) (MoeActivation).
Status CudaBackend::moe_activation(const MoeFfnArgs& a, float* g, float* u, int64_t nk) {
  const int64_t n_ff = a.gate.ne[1];
  if (a.act == MoeActivation::kSwigluOai) return launch_swiglu_oai(g, u, nk * n_ff, a.oai_alpha, a.oai_limit, stream_);
  const Tensor gt = rows(g, this, n_ff, 0, nk);
  return swiglu(gt, rows(u, this, n_ff, 0, nk), gt);
}

// The GEMV path's condition: every expert's share of the step (1..n tokens) goes to the GEMV in matmul for each of
// the three weight types, so a slot's GEMV is that expert's matmul row (the contract), and the GEMV reads q8_1.
bool CudaBackend::moe_gemv_ok(const MoeFfnArgs& a, int64_t n) const {
  if (n > kMmvqMaxTok) return false;
  const DType type[3] = {a.gate.dtype, a.up.dtype, a.down.dtype};
  const int64_t n_in[3] = {a.x.ne[0], a.x.ne[0], a.gate.ne[1]};
  for (int i = 0; i < 3; ++i) {
    if (!mmvq_supports(type[i])) return false;
    for (int64_t c = 1; c <= n; ++c)
      if (probe_matmul(type[i], n_in[i], c) != MatmulKernel::kMmvq) return false;
  }
  return true;
}

// Steps 3 and 4 on the GEMV path (the header): sel / w from moe_route; g, u: nk x n_ff of the scratch; x_q: x's
// q8_1 rows when the norm before the op wrote them (rms_norm_for_matmul), else x is quantized here.
// Gate, up and the activation are one launch when gate and up share a type (launch_mmvq_id_glu), the down products
// and the slot sum one launch (launch_mmvq_id_sum), in the separate launches' arithmetic.
Status CudaBackend::moe_ffn_gemv(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc, const ActQ* x_q) {
  const int64_t n = a.x.n_rows(), d = a.x.ne[0], n_ff = a.gate.ne[1], nk = n * a.k;
  const auto params = [&](const Tensor& wt, const Tensor& b, int64_t n_in, int64_t n_out, int x_div, float* out) {
    MmvqIdParams p{};
    p.type = wt.dtype;
    p.w = static_cast<const uint8_t*>(wt.data);
    p.expert_bytes = wt.nb[2];
    p.w_row_bytes = wt.nb[1];
    p.n_in = n_in, p.n_out = n_out, p.n_slot = nk;
    p.ids = m.sel;
    p.x_div = x_div;
    p.bias = b.valid() ? static_cast<const float*>(b.data) : nullptr;
    p.y = out, p.y_stride = static_cast<size_t>(n_out);
    return p;
  };
  {
    ActQ ax{};
    if (x_q) {
      ax = *x_q;
    } else {
      KILN_ASSIGN_OR_RETURN(ax, quantize_act(a.x));
    }
    const MmvqIdParams pg = params(a.gate, a.gate_bias, d, n_ff, a.k, m.g);
    const MmvqIdParams pu = params(a.up, a.up_bias, d, n_ff, a.k, m.u);
    if (a.gate.dtype == a.up.dtype) {
      const MoeGlu act = a.act == MoeActivation::kSwigluOai ? MoeGlu::kSwigluOai : MoeGlu::kSwiglu;
      KILN_TRY(launch_mmvq_id_glu(MmvqIdGluParams{pg, pu, act, a.oai_alpha, a.oai_limit}, ax, stream_));
    } else {
      KILN_TRY(launch_mmvq_id(pg, ax, stream_));
      KILN_TRY(launch_mmvq_id(pu, ax, stream_));
      KILN_TRY(moe_activation(a, m.g, m.u, nk));
    }
  }
  KILN_ASSIGN_OR_RETURN(const ActQ ah, quantize_act(rows(m.g, this, n_ff, 0, nk)));
  const MmvqIdParams pd = params(a.down, a.down_bias, n_ff, d, 1, m.y);
  return launch_mmvq_id_sum(MmvqIdSumParams{pd, m.w, a.k, static_cast<float*>(acc.data), fstride(acc)}, ah, stream_);
}

}  // namespace kiln::cuda
