// qwen35 (Qwen3.5): a hybrid stack; what differs from llama, all of it here.
//   Layer kinds: attention.recurrent_layers (a per-layer array) when present, else full_attention_interval (default
//   4): layer il is a linear-attention (Gated DeltaNet) layer unless (il + 1) % interval == 0. nextn_predict_layers
//   (MTP draft blocks stored after the trunk) are not run by the trunk: block_count minus them is the trunk; they
//   are loaded into Weights::nextn (add_nextn below) and run as the draft of --spec-type draft-mtp (model/mtp.h).
//   Full-attention layers ("gated attention"): attn_q is twice as wide, per head [query hd | gate hd]; per-head q/k
//   RMS norm; RoPE on the leading rope.dimension_count dims only (64 of 256), NeoX pairs (i, i + n_rot/2).
//   llama.cpp runs this as interleaved multi-section RoPE (rope.dimension_sections, e.g. [11, 11, 10, 0]): each
//   rotated pair takes the angle of its section's position component, and for text all components are the token
//   position, so it is exactly NeoX RoPE of the first n_rot dims (tests/unit/test_backend_ops_next.cpp checks the
//   sectioned form against the op). Attention output times sigmoid(gate), then attn_output.
//   Linear-attention layers: attn_qkv (mixed q | k | v rows) and attn_gate (z) projections, ssm_alpha / ssm_beta
//   (one value per V head), the causal depthwise conv1d (ssm_conv1d, kernel ssm.conv_kernel) over q|k|v with a
//   per-sequence conv state, SiLU; the gated delta rule (Backend::gated_delta_net: L2-normalized q/k, V head h reads
//   K head h mod n_k (tiled), decay from ssm_a and softplus(alpha + ssm_dt.bias), beta = sigmoid) on a per-sequence
//   state; out = RMSNorm(o) * ssm_norm * SiLU(z) per V head; ssm_out.
//   Every layer: residual adds; post_attention_norm is the pre-FFN norm (bound as ffn_norm); SwiGLU; output tied.
//   keys:    qwen35.* common keys, attention.key_length/value_length, rope.dimension_count/sections,
//            ssm.conv_kernel, ssm.inner_size, ssm.state_size, ssm.time_step_rank (V heads), ssm.group_count (K
//            heads), full_attention_interval or attention.recurrent_layers, nextn_predict_layers (optional)
#include <cmath>
#include <variant>

#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Result<int64_t> item_int(const gguf::Value& v, const std::string& key) {
  return std::visit(
      [&](const auto& x) -> Result<int64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(x);
        return make_error(ErrorCode::kInvalidFile, "metadata key '%s' must hold integers", key.c_str());
      },
      v.v);
}

Status read_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_type = RopeType::kNeox;
  const std::string a = hp.arch + ".";
  KILN_ASSIGN_OR_RETURN(const int64_t nextn, read_int_or(f, a + "nextn_predict_layers", 0));
  if (nextn < 0 || nextn >= hp.n_layer)
    return make_error(ErrorCode::kInvalidFile, "%snextn_predict_layers %lld must be in [0, block_count %lld)",
                      a.c_str(), static_cast<long long>(nextn), static_cast<long long>(hp.n_layer));
  hp.n_layer -= nextn;
  hp.n_nextn = nextn;
  struct Key { const char* k; int64_t* dst; };
  const Key keys[] = {{"ssm.conv_kernel", &hp.ssm_d_conv},    {"ssm.inner_size", &hp.ssm_d_inner},
                      {"ssm.state_size", &hp.ssm_d_state},    {"ssm.time_step_rank", &hp.ssm_n_v_head},
                      {"ssm.group_count", &hp.ssm_n_k_head}};
  for (const Key& k : keys) {
    const std::string name = a + k.k;
    if (!f.has(name)) return make_error(ErrorCode::kNotFound, "missing metadata key '%s'", name.c_str());
    KILN_ASSIGN_OR_RETURN(*k.dst, read_int_or(f, name, 0));
    if (*k.dst <= 0 || *k.dst > (1 << 20))
      return make_error(ErrorCode::kInvalidFile, "%s is %lld: out of range", name.c_str(), static_cast<long long>(*k.dst));
  }
  if (hp.ssm_d_inner % hp.ssm_n_v_head || hp.ssm_n_v_head % hp.ssm_n_k_head)
    return make_error(ErrorCode::kInvalidFile, "%sssm.inner_size %lld / time_step_rank %lld / group_count %lld: the "
                      "value heads must divide the inner size and be a multiple of the key heads", a.c_str(),
                      static_cast<long long>(hp.ssm_d_inner), static_cast<long long>(hp.ssm_n_v_head),
                      static_cast<long long>(hp.ssm_n_k_head));

  // Layer kinds.
  hp.layer_recurrent.assign(static_cast<size_t>(hp.n_layer), 0);
  if (const gguf::Value* rl = f.find(a + "attention.recurrent_layers"); rl && rl->is_array()) {
    const auto& items = rl->arr().items;
    if (static_cast<int64_t>(items.size()) < hp.n_layer)
      return make_error(ErrorCode::kInvalidFile, "%sattention.recurrent_layers has %zu entries for %lld layers",
                        a.c_str(), items.size(), static_cast<long long>(hp.n_layer));
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      KILN_ASSIGN_OR_RETURN(const int64_t r, item_int(items[il], a + "attention.recurrent_layers"));
      hp.layer_recurrent[il] = r != 0;
    }
  } else {
    KILN_ASSIGN_OR_RETURN(const int64_t interval, read_int_or(f, a + "full_attention_interval", 4));
    if (interval < 1)
      return make_error(ErrorCode::kInvalidFile, "%sfull_attention_interval %lld must be >= 1", a.c_str(),
                        static_cast<long long>(interval));
    for (int64_t il = 0; il < hp.n_layer; ++il) hp.layer_recurrent[il] = (il + 1) % interval != 0;
  }

  // Multi-section RoPE: with text positions it is NeoX RoPE of the first n_rot dims (see the top of the file);
  // the sections must cover exactly the n_rot / 2 rotated pairs.
  if (const gguf::Value* sec = f.find(a + "rope.dimension_sections"); sec && sec->is_array()) {
    int64_t pairs = 0;
    for (const gguf::Value& v : sec->arr().items) {
      KILN_ASSIGN_OR_RETURN(const int64_t x, item_int(v, a + "rope.dimension_sections"));
      if (x < 0) return make_error(ErrorCode::kInvalidFile, "%srope.dimension_sections has a negative entry", a.c_str());
      pairs += x;
    }
    if (pairs != hp.n_rot / 2)
      return make_error(ErrorCode::kUnsupported, "%srope.dimension_sections cover %lld rotated pairs, not "
                        "rope.dimension_count / 2 = %lld", a.c_str(), static_cast<long long>(pairs),
                        static_cast<long long>(hp.n_rot / 2));
  }

  // Workspace: the q buffer holds query and gate; the linear layers carve qkv, conv, z, alpha, beta, o.
  hp.ws_q_width = 2 * hp.n_head * hp.head_dim_k;
  const int64_t C = hp.ssm_conv_dim(), Di = hp.ssm_d_inner, Hv = hp.ssm_n_v_head;
  hp.ws_extra = 2 * Carver::width(C) + 2 * Carver::width(Di) + 2 * Carver::width(Hv);
  return Status::ok();
}

// One block's tensors under prefix b ("blk.N."): a Gated DeltaNet or a gated full-attention layer, the FFN.
void add_block(const HParams& hp, LayerWeights& L, const std::string& b, bool recurrent, std::vector<TensorSpec>& m) {
  using K = TensorSpec::Kind;
  const int64_t e = hp.n_embd, hd = hp.head_dim_k;
  const int64_t C = hp.ssm_conv_dim(), Di = hp.ssm_d_inner, Hv = hp.ssm_n_v_head;
  m.push_back({K::kF32, b + "attn_norm.weight", {e}, &L.attn_norm, true});
  m.push_back({K::kF32, b + "post_attention_norm.weight", {e}, &L.ffn_norm, true});  // the pre-FFN norm
  m.push_back({K::kMatrix, b + "ffn_gate.weight", {e, hp.n_ff}, &L.w_gate, true});
  m.push_back({K::kMatrix, b + "ffn_up.weight", {e, hp.n_ff}, &L.w_up, true});
  m.push_back({K::kMatrix, b + "ffn_down.weight", {hp.n_ff, e}, &L.w_down, true});
  if (recurrent) {
    m.push_back({K::kMatrix, b + "attn_qkv.weight", {e, C}, &L.wqkv, true});
    m.push_back({K::kMatrix, b + "attn_gate.weight", {e, Di}, &L.wz, true});
    m.push_back({K::kF32, b + "ssm_conv1d.weight", {hp.ssm_d_conv, C}, &L.ssm_conv1d, true});
    m.push_back({K::kF32, b + "ssm_dt.bias", {Hv}, &L.ssm_dt_bias, true});
    m.push_back({K::kF32, b + "ssm_a", {Hv}, &L.ssm_a, true});
    m.push_back({K::kMatrix, b + "ssm_beta.weight", {e, Hv}, &L.ssm_beta, true});
    m.push_back({K::kMatrix, b + "ssm_alpha.weight", {e, Hv}, &L.ssm_alpha, true});
    m.push_back({K::kF32, b + "ssm_norm.weight", {hp.ssm_head_v_dim()}, &L.ssm_norm, true});
    m.push_back({K::kMatrix, b + "ssm_out.weight", {Di, e}, &L.ssm_out, true});
  } else {
    m.push_back({K::kMatrix, b + "attn_q.weight", {e, 2 * hp.n_head * hd}, &L.wq, true});
    m.push_back({K::kMatrix, b + "attn_k.weight", {e, hp.n_head_kv * hd}, &L.wk, true});
    m.push_back({K::kMatrix, b + "attn_v.weight", {e, hp.n_head_kv * hp.head_dim_v}, &L.wv, true});
    m.push_back({K::kMatrix, b + "attn_output.weight", {hp.n_head * hp.head_dim_v, e}, &L.wo, true});
    m.push_back({K::kF32, b + "attn_q_norm.weight", {hd}, &L.q_norm, true});
    m.push_back({K::kF32, b + "attn_k_norm.weight", {hd}, &L.k_norm, true});
  }
}

// The NextN blocks as llama.cpp's converter writes Qwen3.5's mtp.* tensors: block_count counts them after the
// trunk, so NextN block k is blk.(n_layer + k): mtp.layers.k's attention and FFN under the trunk's layer names (a
// full-attention layer), and mtp.fc -> nextn.eh_proj, mtp.pre_fc_norm_embedding -> nextn.enorm,
// mtp.pre_fc_norm_hidden -> nextn.hnorm, mtp.norm -> nextn.shared_head_norm, every one through the same tensor
// conversion as the trunk's (so the norm weights are read as the trunk's are). Qwen3.5 shares the trunk's embedding
// and output, so the converter writes no nextn.embed_tokens / nextn.shared_head_head; other files may. (Its --mtp
// option writes the block alone into a companion mtp-*.gguf; kiln reads the block from the model's own file.)
void add_nextn(const HParams& hp, Weights& w, std::vector<TensorSpec>& m) {
  using K = TensorSpec::Kind;
  const int64_t e = hp.n_embd;
  w.nextn.assign(static_cast<size_t>(hp.n_nextn), NextnWeights{});
  for (int64_t k = 0; k < hp.n_nextn; ++k) {
    NextnWeights& N = w.nextn[static_cast<size_t>(k)];
    const std::string b = "blk." + std::to_string(hp.n_layer + k) + ".";
    add_block(hp, N.block, b, false, m);
    m.push_back({K::kMatrix, b + "nextn.eh_proj.weight", {2 * e, e}, &N.eh_proj, true});
    m.push_back({K::kF32, b + "nextn.enorm.weight", {e}, &N.enorm, true});
    m.push_back({K::kF32, b + "nextn.hnorm.weight", {e}, &N.hnorm, true});
    m.push_back({K::kF32, b + "nextn.shared_head_norm.weight", {e}, &N.shared_head_norm, true});
    m.push_back({K::kEmbedding, b + "nextn.embed_tokens.weight", {e, hp.n_vocab}, &N.embed_tokens, false});
    m.push_back({K::kMatrix, b + "nextn.shared_head_head.weight", {e, hp.n_vocab}, &N.shared_head_head, false});
  }
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  using K = TensorSpec::Kind;
  const int64_t e = hp.n_embd;
  std::vector<TensorSpec> m = {
      {K::kEmbedding, "token_embd.weight", {e, hp.n_vocab}, &w.tok_embd, true},
      {K::kF32, "output_norm.weight", {e}, &w.output_norm, true},
      {K::kMatrix, "output.weight", {e, hp.n_vocab}, &w.output, false},
  };
  for (int64_t il = 0; il < hp.n_layer; ++il)
    add_block(hp, w.layers[il], "blk." + std::to_string(il) + ".", hp.is_recurrent(il), m);
  add_nextn(hp, w, m);
  return m;
}

// Full attention with the output gate: x += wo (attention(q) * sigmoid(gate)).
Status gated_attention(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  const int64_t n = c.n, hd = hp.head_dim_k, nh = hp.n_head;
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.attn_norm, hp.rms_eps, c.h, L.wq.dtype));
  const Backend::MatmulOut qkv[] = {{L.wq, Tensor{}, c.q}, {L.wk, Tensor{}, c.k}, {L.wv, Tensor{}, c.v}};
  KILN_TRY(be.matmul_group(c.h, qkv, 3));
  // Per token and head: [query hd | gate hd]. Query heads [hd, n_head, n] and gate rows [hd, n_head * n] are views.
  const Tensor q3 = strided_view(c.q, 0, hd, nh, n, 2 * hd, 2 * hd * nh);
  const Tensor gate = strided_view(c.q, hd, hd, nh * n, 1, 2 * hd, 0);
  KILN_TRY(pieces::attend(c, il, q3));
  const Tensor attn = c.attn.reshape(hp.head_dim_v, nh * n);
  KILN_TRY(be.sigmoid_mul(attn, gate, attn));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(pieces::keep_output_rows(c));
  if (c.n == 0) return Status::ok();
  return be.matmul_add(L.wo, c.attn, Tensor{}, c.h, c.x);
}

// Gated DeltaNet: x += ssm_out(rms_norm(delta_rule(silu(conv(qkv)))) * ssm_norm * silu(z)).
Status delta_net(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  const int64_t n = c.n, C = hp.ssm_conv_dim(), Di = hp.ssm_d_inner;
  const int64_t Sk = hp.ssm_d_state, Hk = hp.ssm_n_k_head, Hv = hp.ssm_n_v_head, Sv = hp.ssm_head_v_dim();
  KILN_TRY(be.rms_norm_for_matmul(c.x, L.attn_norm, hp.rms_eps, c.h, L.wqkv.dtype));
  Carver cv(c.s);
  const Tensor qkv = cv.take(C, n), conv = cv.take(C, n), z = cv.take(Di, n), alpha = cv.take(Hv, n),
               beta = cv.take(Hv, n), o = cv.take(Di, n);
  const Backend::MatmulOut proj[] = {
      {L.wqkv, Tensor{}, qkv}, {L.wz, Tensor{}, z}, {L.ssm_alpha, Tensor{}, alpha}, {L.ssm_beta, Tensor{}, beta}};
  KILN_TRY(be.matmul_group(c.h, proj, 4));
  KILN_TRY(be.conv1d_silu(qkv, L.ssm_conv1d, c.conv_state, c.meta, conv));
  Backend::DeltaNetArgs d;
  d.q = strided_view(conv, 0, Sk, Hk, n, Sk, C);
  d.k = strided_view(conv, Sk * Hk, Sk, Hk, n, Sk, C);
  d.v = strided_view(conv, 2 * Sk * Hk, Sv, Hv, n, Sv, C);
  d.alpha = alpha, d.beta = beta, d.A = L.ssm_a, d.dt_bias = L.ssm_dt_bias, d.state = c.ssm_state;
  d.scale = 1.0f / std::sqrt(static_cast<float>(Sk));
  d.l2_eps = hp.rms_eps;
  KILN_TRY(be.gated_delta_net(d, c.meta, o.reshape(Sv, Hv, n)));
  const Tensor oh = o.reshape(Sv, Hv * n);
  KILN_TRY(be.rms_norm(oh, L.ssm_norm, hp.rms_eps, oh));  // per V head
  KILN_TRY(be.swiglu(z, o, o));                          // * silu(z)
  KILN_TRY(be.matmul_add(L.ssm_out, o, Tensor{}, c.h, c.x));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(pieces::keep_output_rows(c));
  return Status::ok();
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(c.hp->is_recurrent(il) ? delta_net(c, il) : gated_attention(c, il));
  return pieces::swiglu_ffn(c, il);  // ffn_norm = post_attention_norm
}

}  // namespace

extern const ArchDef kArchQwen35 = {"qwen35", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
