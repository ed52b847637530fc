// The shared pieces of every block (model/forward.h), top to bottom.
#include "model/forward.h"

namespace kiln {

Tensor strided_view(const Tensor& base, int64_t off, int64_t ne0, int64_t ne1, int64_t ne2, int64_t s1, int64_t s2) {
  Tensor t = Tensor::make(base.dtype, static_cast<char*>(base.data) + off * base.nb[0], base.backend, ne0, ne1, ne2);
  t.nb[1] = static_cast<size_t>(s1) * base.nb[0];
  t.nb[2] = static_cast<size_t>(s2) * base.nb[0];
  t.nb[3] = t.nb[2] * static_cast<size_t>(ne2);
  return t;
}

namespace pieces {

Status attend(ForwardCtx& c, int64_t il, const Tensor& q3) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  const int64_t n = c.n;
  // k [hd_k, n_head_kv, n].
  const Tensor k3 = c.k.reshape(hp.head_dim_k, hp.n_head_kv, n);
  if (L.q_norm.valid()) {  // qwen3: RMS norm over each head's vector, before RoPE
    const Tensor qh = strided_view(q3, 0, hp.head_dim_k, hp.n_head * n, 1, q3.nb[1] / sizeof(float), 0);
    const Tensor kh = c.k.reshape(hp.head_dim_k, hp.n_head_kv * n);
    KILN_TRY(be.rms_norm(qh, L.q_norm, hp.rms_eps, qh));
    KILN_TRY(be.rms_norm(kh, L.k_norm, hp.rms_eps, kh));
  }
  // RoPE, then the batch's K/V go into the cache; each token then attends to positions [0, pos] of its sequence
  // (the last `window` of them on a sliding-window layer).
  KvLayer layer = c.kv[il];
  layer.sinks = L.attn_sinks;  // gpt-oss; invalid elsewhere
  KILN_TRY(be.rope_kv_store(q3, k3, c.v, c.pos, c.rope, layer, c.slots));
  return be.attention(q3, layer, c.meta, c.attn_scale, c.attn.reshape(hp.head_dim_v, hp.n_head, n));
}

Status self_attention(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];

  KILN_TRY(be.rms_norm_for_matmul(c.x, L.attn_norm, hp.rms_eps, c.h, L.wq.dtype));
  const Backend::MatmulOut qkv[] = {{L.wq, L.bq, c.q}, {L.wk, L.bk, c.k}, {L.wv, L.bv, c.v}};
  KILN_TRY(be.matmul_group(c.h, qkv, 3));
  KILN_TRY(attend(c, il, c.q.reshape(hp.head_dim_k, hp.n_head, c.n)));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(keep_output_rows(c));
  if (c.n == 0) return Status::ok();

  return project_add(c, L.wo, c.attn, L.bo);  // x += wo attn (+ bo)
}

Status project_add(ForwardCtx& c, const Tensor& W, const Tensor& a, const Tensor& bias) {
  Backend& be = *c.be;
  if (!c.comm) return be.matmul_add(W, a, bias, c.h, c.x);
  // Every rank holds the same x; h = this rank's partial product, summed over the ranks, then added once. (Adding x
  // on rank 0 only and reducing x would save the add but round differently from the one-rank x + W a.)
  KILN_TRY(be.matmul(W, a, Tensor{}, c.h));
  KILN_TRY(c.comm->all_reduce_sum(c.h));
  if (bias.valid()) KILN_TRY(be.add(c.h, bias.reshape(bias.ne[0], 1), c.h));
  return be.add(c.x, c.h, c.x);
}

Status geglu_ffn(ForwardCtx& c, int64_t il) {
  if (c.n == 0) return Status::ok();
  Backend& be = *c.be;
  const LayerWeights& L = c.w->layers[il];
  const float eps = c.hp->rms_eps;
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.ffn_norm, eps, c.h, L.w_gate.dtype));
  const Backend::MatmulOut gu[] = {{L.w_gate, Tensor{}, c.g}, {L.w_up, Tensor{}, c.u}};
  KILN_TRY(be.matmul_group(c.h, gu, 2));
  KILN_TRY(be.geglu(c.g, c.u, c.g));  // g = gelu(gate h) * up h
  if (!L.post_ffn_norm.valid()) return be.matmul_add(L.w_down, c.g, Tensor{}, c.h, c.x);
  KILN_TRY(be.matmul(L.w_down, c.g, Tensor{}, c.h));
  KILN_TRY(be.rms_norm(c.h, L.post_ffn_norm, eps, c.h));
  return be.add(c.x, c.h, c.x);
}

Status swiglu_ffn(ForwardCtx& c, int64_t il) {
  if (c.n == 0) return Status::ok();
  Backend& be = *c.be;
  const LayerWeights& L = c.w->layers[il];
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.ffn_norm, c.hp->rms_eps, c.h, L.w_gate.dtype));
  KILN_TRY(be.matmul_swiglu(L.w_gate, L.w_up, c.h, c.g, c.u));  // g = silu(gate h) * up h
  return project_add(c, L.w_down, c.g);                          // x += down g
}

Status moe_ffn(ForwardCtx& c, int64_t il, MoeGating gating, bool norm_topk, MoeActivation act) {
  if (c.n == 0) return Status::ok();
  Backend& be = *c.be;
  const LayerWeights& L = c.w->layers[il];
  // On the layer's own backend the op's expert products read h next (a device backend may keep their activations
  // from the norm's pass); experts elsewhere get a copy of h.
  if (c.experts.be)
    KILN_TRY(be.rms_norm(c.x, L.ffn_norm, c.hp->rms_eps, c.h));
  else
    KILN_TRY(be.rms_norm_for_matmul(c.x, L.ffn_norm, c.hp->rms_eps, c.h, L.ffn_gate_exps.dtype));
  Backend::MoeFfnArgs a;
  a.x = c.h;
  a.router = L.ffn_gate_inp;
  a.gate = L.ffn_gate_exps;
  a.up = L.ffn_up_exps;
  a.down = L.ffn_down_exps;
  a.k = static_cast<int32_t>(c.hp->n_expert_used);
  a.gating = gating;
  a.norm_topk = norm_topk;
  a.act = act;
  a.router_bias = L.ffn_gate_inp_b;
  a.gate_bias = L.ffn_gate_exps_b;
  a.up_bias = L.ffn_up_exps_b;
  a.down_bias = L.ffn_down_exps_b;
  if (!c.experts.be) return be.moe_ffn(a, c.x);
  // Experts on backend E: the op needs its input there and its result here, so h goes over and the sum comes back
  // (copying x over instead and back whole would add a third transfer). out starts at zero, so it holds 0 + o = o
  // exactly, and x + o below is the add the op itself makes: the same result as the op on one backend when E runs
  // the same kernels (ModelPlacement.ExpertsOnAnotherBackendMatchOne).
  const ForwardCtx::ExpertsApart& e = c.experts;
  const Tensor xe = e.x.rows(0, c.n), oe = e.out.rows(0, c.n);
  KILN_TRY(copy_between(c.h, xe, e.bounce, e.bounce_bytes));
  KILN_TRY(e.be->copy(e.zero.rows(0, c.n), oe));
  a.x = xe;
  KILN_TRY(e.be->moe_ffn(a, oe));
  KILN_TRY(copy_between(oe, c.h, e.bounce, e.bounce_bytes));
  return be.add(c.x, c.h, c.x);
}

Status keep_output_rows(ForwardCtx& c) {
  const int64_t m = c.n_out;
  if (m > 0) {
    KILN_TRY(c.be->get_rows(c.x, c.out_ids, c.x_keep.rows(0, m)));
    KILN_TRY(c.be->get_rows(c.attn, c.out_ids, c.attn_keep.rows(0, m)));
  }
  c.x = c.x_keep.rows(0, m);
  c.attn = c.attn_keep.rows(0, m);
  c.h = c.h.rows(0, m);
  c.g = c.g.rows(0, m);
  c.u = c.u.rows(0, m);
  c.n = m;
  return Status::ok();
}

}  // namespace pieces
}  // namespace kiln
