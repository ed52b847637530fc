// llama (Llama 1/2/3, Mistral-style GQA): pre-norm decoder, normal (interleaved-pair) RoPE, SwiGLU FFN.
//   keys:    llama.* common keys (model/hparams.cpp); rope.scaling.type llama3 is carried by rope_freqs.weight
//   tensors: the standard manifest; optional rope_freqs.weight [n_rot/2] (llama3 frequency factors), optional
//            output.weight (absent: tied to token_embd.weight), optional attn_q/k/v biases
#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Status read_hparams(const gguf::File&, HParams& hp) {
  hp.rope_type = RopeType::kNormal;
  return Status::ok();
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  std::vector<TensorSpec> m = standard_manifest(hp, w);
  m.push_back({TensorSpec::kF32, "rope_freqs.weight", {hp.n_rot / 2}, &w.rope_freqs, false});
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "attn_q.bias", {hp.n_head * hp.head_dim_k}, &L.bq, false});
    m.push_back({TensorSpec::kF32, b + "attn_k.bias", {hp.n_head_kv * hp.head_dim_k}, &L.bk, false});
    m.push_back({TensorSpec::kF32, b + "attn_v.bias", {hp.n_head_kv * hp.head_dim_v}, &L.bv, false});
  }
  return m;
}

Status finish(const HParams&, Weights& w, HParams& hp) {
  hp.tied_embeddings = !w.output.valid();
  if (hp.tied_embeddings) w.output = w.tok_embd;
  return Status::ok();
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));
  return pieces::swiglu_ffn(c, il);
}

}  // namespace

extern const ArchDef kArchLlama = {"llama", read_hparams, manifest, finish, block};

}  // namespace kiln
