// qwen2 (Qwen2, Qwen2.5): the llama block with q/k/v biases and NeoX (half-split) RoPE.
//   keys:    qwen2.* common keys (model/hparams.cpp)
//   tensors: the standard manifest plus blk.N.attn_{q,k,v}.bias (required); output.weight optional (tied)
#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Status read_hparams(const gguf::File&, HParams& hp) {
  hp.rope_type = RopeType::kNeox;
  return Status::ok();
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  std::vector<TensorSpec> m = standard_manifest(hp, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "attn_q.bias", {hp.n_head * hp.head_dim_k}, &L.bq, true});
    m.push_back({TensorSpec::kF32, b + "attn_k.bias", {hp.n_head_kv * hp.head_dim_k}, &L.bk, true});
    m.push_back({TensorSpec::kF32, b + "attn_v.bias", {hp.n_head_kv * hp.head_dim_v}, &L.bv, true});
  }
  return m;
}

Status finish(const HParams&, Weights& w, HParams& hp) {
  hp.tied_embeddings = !w.output.valid();
  if (hp.tied_embeddings) w.output = w.tok_embd;
  return Status::ok();
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));  // biases are picked up from the layer's weights
  return pieces::swiglu_ffn(c, il);
}

}  // namespace

extern const ArchDef kArchQwen2 = {"qwen2", read_hparams, manifest, finish, block};

}  // namespace kiln
