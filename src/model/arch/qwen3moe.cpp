// qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): the qwen3 block (per-head q/k RMS norm before
// NeoX RoPE, head size from attention.key_length) with the dense FFN replaced by a routed mixture of experts, as
// llama.cpp builds it (build_moe_ffn with softmax gating and norm_w = true):
//   h = rms_norm(x) * ffn_norm; logits = ffn_gate_inp h; p = softmax(logits) over all experts; the
//   expert_used_count experts of largest p, their p renormalised to sum 1; x += sum_j w_j down_j(silu(gate_j h) *
//   up_j h). No shared expert, no expert bias, no weight scale (llama.cpp reads none for qwen3moe).
//   keys:    qwen3moe.* common keys, attention.key_length / value_length, expert_count, expert_used_count,
//            expert_feed_forward_length (default feed_forward_length / expert_used_count)
//   tensors: the standard attention tensors, blk.N.attn_{q,k}_norm.weight [hd_k], blk.N.ffn_norm.weight, and
//            instead of ffn_{gate,up,down}: blk.N.ffn_gate_inp.weight [n_embd, n_expert],
//            blk.N.ffn_{gate,up}_exps.weight [n_embd, n_ff_exp, n_expert], blk.N.ffn_down_exps.weight
//            [n_ff_exp, n_embd, n_expert]. Output usually untied (tied when output.weight is absent).
#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Status read_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_type = RopeType::kNeox;
  return read_moe_hparams(f, hp);
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  std::vector<TensorSpec> m = standard_manifest(hp, w, /*dense_ffn=*/false);
  add_qk_norm_specs(hp, w, /*required=*/true, m);
  add_moe_specs(hp, w, m);
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));
  return pieces::moe_ffn(c, il, MoeGating::kSoftmax, /*norm_topk=*/true);
}

}  // namespace

extern const ArchDef kArchQwen3Moe = {"qwen3moe", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
