// gemma3: what differs from llama, all of it here:
//   - token embeddings times sqrt(n_embd) (applied at the top of block 0, on the layer's backend);
//   - sliding-window attention on the local layers: attention.sliding_window (a query at position p sees keys
//     p-window+1 .. p), the layer pattern of 6 implicit (layers il % 6 < 5 are local, every 6th is global; an
//     explicit attention.sliding_window_pattern number overrides the 6); the local layers' RoPE base is
//     rope.freq_base_swa (default 10000), the global ones' rope.freq_base;
//   - NeoX RoPE on the whole head, per-head q/k RMS norm (attn_q_norm / attn_k_norm) before it;
//   - attention scale 1/sqrt(key_length), except the 27B shape (62 layers) which uses 1/sqrt(n_embd / n_head)
//     (Gemma's query_pre_attn_scalar);
//   - post-attention and post-FFN RMS norms (post_attention_norm, post_ffw_norm) on each sublayer's output before
//     its residual add;
//   - GeGLU FFN with the tanh GELU: down(gelu(gate h) * up h);
//   - output usually tied to token_embd. A final_logit_softcapping (Gemma 2) is not supported.
//   keys:    gemma3.* common keys, attention.key_length/value_length, attention.sliding_window, rope.freq_base_swa,
//            attention.sliding_window_pattern (optional, a number)
//   tensors: the standard manifest plus blk.N.attn_{q,k}_norm.weight [hd_k], blk.N.post_attention_norm.weight and
//            blk.N.post_ffw_norm.weight [n_embd]
#include <cmath>

#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Status read_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_type = RopeType::kNeox;
  const std::string a = hp.arch + ".";
  KILN_TRY(read_sliding_window(f, hp));
  if (hp.sliding_window > 0) KILN_TRY(read_swa_layers(f, hp, /*fallback_pattern=*/6, /*fallback_base=*/10000.0f));
  KILN_ASSIGN_OR_RETURN(const float softcap, f.get_f32_or(a + "final_logit_softcapping", 0.0f));
  if (softcap != 0.0f)
    return make_error(ErrorCode::kUnsupported, "%sfinal_logit_softcapping %g is not supported", a.c_str(), softcap);
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  hp.attn_scale = hp.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head))
                                   : 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  return Status::ok();
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  std::vector<TensorSpec> m = standard_manifest(hp, w);
  add_qk_norm_specs(hp, w, /*required=*/true, m);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "post_attention_norm.weight", {hp.n_embd}, &L.post_attn_norm, true});
    m.push_back({TensorSpec::kF32, b + "post_ffw_norm.weight", {hp.n_embd}, &L.post_ffn_norm, true});
  }
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  if (il == 0) KILN_TRY(be.scale(c.x, hp.embd_scale, c.x));  // embeddings times sqrt(n_embd)

  // Attention: pre-norm, q/k/v, q/k norms, RoPE with this layer's base, (windowed) attention, output projection,
  // post-attention norm, residual add.
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.attn_norm, hp.rms_eps, c.h, L.wq.dtype));
  const Backend::MatmulOut qkv[] = {{L.wq, Tensor{}, c.q}, {L.wk, Tensor{}, c.k}, {L.wv, Tensor{}, c.v}};
  KILN_TRY(be.matmul_group(c.h, qkv, 3));
  KILN_TRY(pieces::attend(c, il, c.q.reshape(hp.head_dim_k, hp.n_head, c.n)));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(pieces::keep_output_rows(c));
  if (c.n == 0) return Status::ok();
  KILN_TRY(be.matmul(L.wo, c.attn, Tensor{}, c.h));
  KILN_TRY(be.rms_norm(c.h, L.post_attn_norm, hp.rms_eps, c.h));
  KILN_TRY(be.add(c.x, c.h, c.x));

  return pieces::geglu_ffn(c, il);  // with post_ffw_norm
}

}  // namespace

extern const ArchDef kArchGemma3 = {"gemma3", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
