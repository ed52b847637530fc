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
  add_qkv_bias_specs(hp, w, /*required=*/false, m);
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));
  return pieces::swiglu_ffn(c, il);
}

}  // namespace

extern const ArchDef kArchLlama = {"llama", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
