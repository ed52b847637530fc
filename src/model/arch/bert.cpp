// bert (BERT, MiniLM, bge, e5, ...) and nomic-bert (nomic-embed-text): encoders, whose hidden states embeddings pool
// (runtime/embedding.h). Bidirectional attention: every token of a sequence sees the whole sequence (the planner
// gives each the sequence's kv length: HParams::causal), so a sequence runs whole in one step and there are no
// logits (no output projection, no final norm: the last layer's output is the hidden state).
//   embeddings  x = layer_norm(token_embd[t] + token_types[0] + position_embd[pos])   (nomic-bert: no positions)
//   per layer   (post-norm) x = layer_norm(x + attn(x)); x = layer_norm(x + ffn(x))
//     attn      q, k, v = W x + b (attn_qkv fused, or attn_q/k/v), nomic-bert: NeoX RoPE on q and k; scores over
//               the whole sequence scaled by 1/sqrt(head_dim); attn_output (+ bias)
//     ffn       bert: down(gelu(up x + b_up)) + b_down, the tanh GELU; nomic-bert: down(silu(gate x) * up x)
//   keys:    <arch>.* common keys with attention.layer_norm_epsilon (required) in place of the RMS epsilon,
//            tokenizer.ggml.token_type_count (else token_types.weight's rows); pooling_type (model/embedding.h)
//   tensors: token_embd.weight [n_embd, n_vocab], position_embd.weight [n_embd, context_length] (bert),
//            token_types.weight [n_embd, n_types] (optional; F32/F16/BF16), token_embd_norm.{weight,bias} [n_embd];
//            per layer attn_qkv.{weight,bias} [n_embd, 3 n_embd] or attn_{q,k,v}.{weight,bias},
//            attn_output.{weight,bias}, attn_output_norm.{weight,bias}, ffn_up.{weight,bias} [n_embd, n_ff],
//            ffn_gate.weight (nomic-bert), ffn_down.{weight,bias} [n_ff, n_embd], layer_output_norm.{weight,bias}
// Biases are optional (nomic-bert has none). Layer norm and GELU are CPU ops, and so is attention that reads past
// a token's own position: these models run on the CPU (check_state says so for other backends).
#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

template <bool kNomic>
Status read_hparams(const gguf::File& f, HParams& hp) {
  const std::string a = hp.arch + ".";
  hp.causal = false;
  KILN_ASSIGN_OR_RETURN(hp.norm_eps, f.get_f32(a + "attention.layer_norm_epsilon"));
  if (!(hp.norm_eps >= 0))
    return make_error(ErrorCode::kInvalidFile, "%sattention.layer_norm_epsilon %g must be >= 0", a.c_str(), hp.norm_eps);
  hp.rope_type = RopeType::kNeox;
  hp.max_pos = kNomic ? 0 : hp.n_ctx_train;
  const gguf::TensorInfo* tt = f.find_tensor("token_types.weight");
  KILN_ASSIGN_OR_RETURN(hp.n_token_types, read_int_or(f, "tokenizer.ggml.token_type_count", tt ? tt->ne[1] : 0));
  if (hp.n_token_types < 0 || hp.n_token_types > 1024 || (tt && hp.n_token_types == 0))
    return make_error(ErrorCode::kInvalidFile, "tokenizer.ggml.token_type_count is %lld: must be in [1, 1024] for a "
                      "file with token_types.weight", static_cast<long long>(hp.n_token_types));
  if (hp.n_head_kv != hp.n_head)
    return make_error(ErrorCode::kUnsupported, "%s: %sattention.head_count_kv %lld differs from head_count %lld",
                      hp.arch.c_str(), a.c_str(), static_cast<long long>(hp.n_head_kv),
                      static_cast<long long>(hp.n_head));
  return Status::ok();
}

template <bool kNomic>
std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  using K = TensorSpec::Kind;
  const int64_t e = hp.n_embd, q = hp.n_head * hp.head_dim_k, kk = hp.n_head_kv * hp.head_dim_k,
                v = hp.n_head_kv * hp.head_dim_v, o = hp.n_head * hp.head_dim_v, f = hp.n_ff;
  std::vector<TensorSpec> m = {
      {K::kEmbedding, "token_embd.weight", {e, hp.n_vocab}, &w.tok_embd, true},
      {K::kF32, "token_embd_norm.weight", {e}, &w.tok_norm, true},
      {K::kF32, "token_embd_norm.bias", {e}, &w.tok_norm_b, true},
  };
  if (!kNomic) m.push_back({K::kEmbedding, "position_embd.weight", {e, hp.max_pos}, &w.pos_embd, true});
  if (hp.n_token_types > 0)
    m.push_back({K::kEmbedding, "token_types.weight", {e, hp.n_token_types}, &w.type_embd, false});
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({K::kMatrix, b + "attn_qkv.weight", {e, q + kk + v}, &L.wqkv, false});
    m.push_back({K::kF32, b + "attn_qkv.bias", {q + kk + v}, &L.bqkv, false});
    m.push_back({K::kMatrix, b + "attn_q.weight", {e, q}, &L.wq, false});
    m.push_back({K::kMatrix, b + "attn_k.weight", {e, kk}, &L.wk, false});
    m.push_back({K::kMatrix, b + "attn_v.weight", {e, v}, &L.wv, false});
    m.push_back({K::kF32, b + "attn_q.bias", {q}, &L.bq, false});
    m.push_back({K::kF32, b + "attn_k.bias", {kk}, &L.bk, false});
    m.push_back({K::kF32, b + "attn_v.bias", {v}, &L.bv, false});
    m.push_back({K::kMatrix, b + "attn_output.weight", {o, e}, &L.wo, true});
    m.push_back({K::kF32, b + "attn_output.bias", {e}, &L.bo, false});
    m.push_back({K::kF32, b + "attn_output_norm.weight", {e}, &L.attn_out_norm, true});
    m.push_back({K::kF32, b + "attn_output_norm.bias", {e}, &L.attn_out_norm_b, true});
    m.push_back({K::kMatrix, b + "ffn_up.weight", {e, f}, &L.w_up, true});
    if (kNomic) m.push_back({K::kMatrix, b + "ffn_gate.weight", {e, f}, &L.w_gate, true});
    m.push_back({K::kMatrix, b + "ffn_down.weight", {f, e}, &L.w_down, true});
    if (!kNomic) {  // nomic-bert's FFN has no biases
      m.push_back({K::kF32, b + "ffn_up.bias", {f}, &L.b_up, false});
      m.push_back({K::kF32, b + "ffn_down.bias", {e}, &L.b_down, false});
    }
    m.push_back({K::kF32, b + "layer_output_norm.weight", {e}, &L.layer_out_norm, true});
    m.push_back({K::kF32, b + "layer_output_norm.bias", {e}, &L.layer_out_norm_b, true});
  }
  return m;
}

// A fused q/k/v projection becomes views of its rows (and of its bias); no output projection.
Status finish(const HParams& hp, Weights& w, HParams&) {
  if (w.type_embd.valid() && w.type_embd.dtype != DType::F32 && w.type_embd.dtype != DType::F16 &&
      w.type_embd.dtype != DType::BF16)
    return make_error(ErrorCode::kUnsupported, "tensor 'token_types.weight' has type %s: kiln reads it as F32, F16 "
                      "or BF16", dtype_name(w.type_embd.dtype));
  const int64_t q = hp.n_head * hp.head_dim_k, kk = hp.n_head_kv * hp.head_dim_k, v = hp.n_head_kv * hp.head_dim_v;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const bool split = L.wq.valid() && L.wk.valid() && L.wv.valid();
    if (L.wqkv.valid() == split)
      return make_error(ErrorCode::kInvalidFile, "layer %lld: expected blk.%lld.attn_qkv.weight or all of "
                        "attn_q/attn_k/attn_v.weight (exactly one of the two layouts)", static_cast<long long>(il),
                        static_cast<long long>(il));
    if (!L.wqkv.valid()) continue;
    L.wq = L.wqkv.rows(0, q);
    L.wk = L.wqkv.rows(q, kk);
    L.wv = L.wqkv.rows(q + kk, v);
    if (L.bqkv.valid()) {
      L.bq = strided_view(L.bqkv, 0, q, 1, 1, q, q);
      L.bk = strided_view(L.bqkv, q, kk, 1, 1, kk, kk);
      L.bv = strided_view(L.bqkv, q + kk, v, 1, 1, v, v);
    }
  }
  return Status::ok();
}

// Layer 0 first turns the token embeddings into the encoder's input: + token type 0, + position, layer norm.
Status embed(ForwardCtx& c) {
  Backend& be = *c.be;
  const Weights& W = *c.w;
  if (W.type_embd.valid()) {
    const Tensor row = c.h.rows(0, 1);
    KILN_TRY(be.copy(W.type_embd.rows(0, 1), row));  // to f32
    KILN_TRY(be.add(c.x, row, c.x));                  // one row: broadcast over the tokens
  }
  if (W.pos_embd.valid()) {
    KILN_TRY(be.get_rows(W.pos_embd, c.pos, c.h));
    KILN_TRY(be.add(c.x, c.h, c.x));
  }
  return be.layer_norm(c.x, W.tok_norm, W.tok_norm_b, c.hp->norm_eps, c.x);
}

template <bool kNomic>
Status block(ForwardCtx& c, int64_t il) {
  Backend& be = *c.be;
  const HParams& hp = *c.hp;
  const LayerWeights& L = c.w->layers[il];
  const float eps = hp.norm_eps;
  if (il == 0) KILN_TRY(embed(c));
  const int64_t n = c.n;
  const Backend::MatmulOut qkv[] = {{L.wq, L.bq, c.q}, {L.wk, L.bk, c.k}, {L.wv, L.bv, c.v}};
  KILN_TRY(be.matmul_group(c.x, qkv, 3));
  const Tensor q3 = c.q.reshape(hp.head_dim_k, hp.n_head, n);
  const KvLayer& layer = c.kv[il];
  if (kNomic) {
    KILN_TRY(be.rope_kv_store(q3, c.k.reshape(hp.head_dim_k, hp.n_head_kv, n), c.v, c.pos, c.rope, layer, c.slots));
  } else {
    KILN_TRY(be.kv_store(c.k, c.v, layer, c.slots));
  }
  KILN_TRY(be.attention(q3, layer, c.meta, c.attn_scale, c.attn.reshape(hp.head_dim_v, hp.n_head, n)));
  if (il == hp.n_layer - 1 && c.n_out < c.n) KILN_TRY(pieces::keep_output_rows(c));
  if (c.n == 0) return Status::ok();
  KILN_TRY(be.matmul(L.wo, c.attn, L.bo, c.h));
  KILN_TRY(be.add(c.x, c.h, c.x));
  KILN_TRY(be.layer_norm(c.x, L.attn_out_norm, L.attn_out_norm_b, eps, c.x));
  if (kNomic) {
    KILN_TRY(be.matmul_swiglu(L.w_gate, L.w_up, c.x, c.g, c.u));  // g = silu(gate x) * up x
  } else {
    KILN_TRY(be.matmul(L.w_up, c.x, L.b_up, c.g));
    KILN_TRY(be.gelu(c.g, c.g));
  }
  KILN_TRY(be.matmul(L.w_down, c.g, L.b_down, c.h));
  KILN_TRY(be.add(c.x, c.h, c.x));
  return be.layer_norm(c.x, L.layer_out_norm, L.layer_out_norm_b, eps, c.x);
}

}  // namespace

extern const ArchDef kArchBert = {"bert", read_hparams<false>, manifest<false>, finish, block<false>};
extern const ArchDef kArchNomicBert = {"nomic-bert", read_hparams<true>, manifest<true>, finish, block<true>};

}  // namespace kiln
