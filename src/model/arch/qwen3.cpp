// qwen3: the llama block without biases, with per-head RMS norm of q and k (attn_q_norm / attn_k_norm, applied
// before RoPE), NeoX RoPE, and a head size from attention.key_length that need not be n_embd / n_head (the
// fixture: 128 with n_embd 256 and 4 heads). Output usually tied to token_embd.
//   keys:    qwen3.* common keys (model/hparams.cpp), attention.key_length / value_length
//   tensors: the standard manifest plus blk.N.attn_q_norm.weight, blk.N.attn_k_norm.weight [hd_k] (required)
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
  add_qk_norm_specs(hp, w, /*required=*/true, m);
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));  // q_norm/k_norm are applied because the layer has them
  return pieces::swiglu_ffn(c, il);
}

}  // namespace

extern const ArchDef kArchQwen3 = {"qwen3", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
