// launch_mmvq: type dispatch of the decode GEMV (kernel and numerics: mmvq.cuh; instances: instances/).
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/mmvq_fast.cuh"

namespace kiln::cuda {

bool mmvq_supports(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: case DType::TQ1_0: case DType::TQ2_0:
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S:
    case DType::IQ1_M: return true;
    default: return false;
  }
}

bool mmvq_fast_supports(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

bool mmvq_mma_on() { return int8_mma_ok(); }

ActQ act_rows(const ActQ& a, int64_t t0, int64_t n) {
  ActQ b = a;
  b.qs = a.qs + static_cast<size_t>(t0) * a.qs_stride;
  b.ds = a.ds + static_cast<size_t>(t0) * a.ds_stride;
  b.n_tok = n;
  return b;
}

namespace {

Status mmvq_group_pass(DType t, const MmvqGroup& g, const ActQ& a, cudaStream_t s) {
  switch (t) {
    case DType::Q4_K: return mmvq_group_run<DType::Q4_K>(g, a, s);
    case DType::Q6_K: return mmvq_group_run<DType::Q6_K>(g, a, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "mmvq group: weight type %s", dtype_name(t));
}

Status mmvq_pass(const MatmulParams& p, const ActQ& a, cudaStream_t s) {
  return dispatch_decode32_type(p.type, "mmvq", [&](auto t) { return mmvq_run<decltype(t)::value>(p, a, s); });
}

}  // namespace

// Passes of at most kMmvqMaxTok tokens (the weights are read once per pass): the activations and outputs of
// tokens [t0, t0 + n) are the same layouts offset by t0 rows.
Status launch_mmvq_group(DType t, const MmvqGroup& g, const ActQ& a, cudaStream_t s) {
  if (g.n_tok == 0) return Status::ok();
  if (g.n_tok > kGemvMaxTok || g.n_seg < 1 || g.n_seg > 3 || (g.swiglu && (g.n_seg != 2 || g.seg[0].n_out != g.seg[1].n_out)))
    return make_error(ErrorCode::kInternal, "mmvq group: %lld tokens, %d products", static_cast<long long>(g.n_tok),
                      g.n_seg);
  // The tensor-core GEMV takes up to kGemvMaxTok tokens in one pass (mmvq_group_run), the dp4a one 16.
  const int64_t pass = g.n_tok > 2 && mmvq_mma_on() ? kGemvMaxTok : kMmvqMaxTok;
  for (int64_t t0 = 0; t0 < g.n_tok; t0 += pass) {
    MmvqGroup h = g;
    h.n_tok = std::min<int64_t>(pass, g.n_tok - t0);
    for (int i = 0; i < g.n_seg; ++i) h.seg[i].y = g.seg[i].y + static_cast<size_t>(t0) * g.seg[i].y_stride;
    KILN_TRY(mmvq_group_pass(t, h, act_rows(a, t0, h.n_tok), s));
  }
  return Status::ok();
}

Status launch_mmvq(const MatmulParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  if (p.n_tok > kGemvMaxTok)
    return make_error(ErrorCode::kInternal, "mmvq: %lld tokens (at most %d)", static_cast<long long>(p.n_tok),
                      kGemvMaxTok);
  if (mmvq_fast_supports(p.type)) {
    MmvqGroup g{};
    g.seg[0] = MmvqSeg{p.w, p.w_row_bytes, p.n_out, p.bias, p.y, p.y_stride, p.accumulate};
    g.n_seg = 1;
    g.n_in = p.n_in;
    g.n_tok = p.n_tok;
    return launch_mmvq_group(p.type, g, a, s);
  }
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kMmvqMaxTok) {
    MatmulParams q = p;
    q.n_tok = std::min<int64_t>(kMmvqMaxTok, p.n_tok - t0);
    q.y = p.y + static_cast<size_t>(t0) * p.y_stride;
    if (p.x) q.x = p.x + static_cast<size_t>(t0) * p.x_stride;
    KILN_TRY(mmvq_pass(q, act_rows(a, t0, q.n_tok), s));
  }
  return Status::ok();
}

}  // namespace kiln::cuda
