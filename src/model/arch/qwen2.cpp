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
  add_qkv_bias_specs(hp, w, /*required=*/true, m);
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));  // biases are picked up from the layer's weights
  return pieces::swiglu_ffn(c, il);
}

}  // namespace

extern const ArchDef kArchQwen2 = {"qwen2", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
