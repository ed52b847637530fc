// The shared pieces of every block (model/forward.h), top to bottom.
#include "model/forward.h"

namespace kiln::pieces {

Status self_attention(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  const int64_t n = c.n;

  KILN_TRY(be.rms_norm_for_matmul(c.x, L.attn_norm, hp.rms_eps, c.h, L.wq.dtype));
  const Backend::MatmulOut qkv[] = {{L.wq, L.bq, c.q}, {L.wk, L.bk, c.k}, {L.wv, L.bv, c.v}};
  KILN_TRY(be.matmul_group(c.h, qkv, 3));

  // Per-head views: q [hd_k, n_head, n], k [hd_k, n_head_kv, n].
  const Tensor q3 = c.q.reshape(hp.head_dim_k, hp.n_head, n);
  const Tensor k3 = c.k.reshape(hp.head_dim_k, hp.n_head_kv, n);
  if (L.q_norm.valid()) {  // qwen3: RMS norm over each head's vector, before RoPE
    const Tensor qh = c.q.reshape(hp.head_dim_k, hp.n_head * n), kh = c.k.reshape(hp.head_dim_k, hp.n_head_kv * n);
    KILN_TRY(be.rms_norm(qh, L.q_norm, hp.rms_eps, qh));
    KILN_TRY(be.rms_norm(kh, L.k_norm, hp.rms_eps, kh));
  }
  // RoPE, then the batch's K/V go into the cache; each token then attends to positions [0, pos] of its sequence.
  const KvLayer& layer = c.kv[il];
  KILN_TRY(be.rope_kv_store(q3, k3, c.v, c.pos, c.rope, layer, c.slots));
  KILN_TRY(be.attention(q3, layer, c.meta, c.attn_scale, c.attn.reshape(hp.head_dim_v, hp.n_head, n)));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(keep_output_rows(c));
  if (c.n == 0) return Status::ok();

  return be.matmul_add(L.wo, c.attn, Tensor{}, c.h, c.x);  // x += wo attn
}

Status swiglu_ffn(ForwardCtx& c, int64_t il) {
  if (c.n == 0) return Status::ok();
  Backend& be = *c.be;
  const LayerWeights& L = c.w->layers[il];
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.ffn_norm, c.hp->rms_eps, c.h, L.w_gate.dtype));
  KILN_TRY(be.matmul_swiglu(L.w_gate, L.w_up, c.h, c.g, c.u));  // g = silu(gate h) * up h
  return be.matmul_add(L.w_down, c.g, Tensor{}, c.h, c.x);     // x += down g
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

}  // namespace kiln::pieces
