// gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp's LLM_ARCH_OPENAI_MOE): a mixture-of-experts decoder. What differs
// from qwen3moe, all of it here:
//   - attention: q/k/v and attn_output biases, no q/k norm, per-head attention sinks (blk.N.attn_sinks.weight: a
//     learned logit in each softmax's denominator that contributes no value), scale 1/sqrt(n_rot);
//   - alternating sliding-window layers: attention.sliding_window (128 in the released files), the pattern of 2
//     implicit (even layers local, odd layers global; an attention.sliding_window_pattern number overrides it), the
//     local layers' RoPE base rope.freq_base_swa (default rope.freq_base);
//   - NeoX RoPE with YaRN scaling (rope.scaling.type yarn, factor 32, original_context_length 4096: model/hparams.cpp
//     reads it for every architecture);
//   - the FFN's pre-norm is stored as blk.N.post_attention_norm.weight;
//   - routing (build_moe_ffn with SOFTMAX_WEIGHT gating, no renormalisation): logits = ffn_gate_inp h + router
//     bias; the expert_used_count largest logits chosen; their weights the softmax over those logits;
//   - experts with gate/up/down biases and the clamped SwiGLU: x = min(g, 7), y = clamp(u, -7, 7),
//     h = x sigmoid(1.702 x) (y + 1);
//   - untied output.
//   keys:    gpt-oss.* common keys, attention.key_length / value_length, expert_count, expert_used_count,
//            expert_feed_forward_length, attention.sliding_window (required), attention.sliding_window_pattern and
//            rope.freq_base_swa (optional)
//   tensors: the standard attention tensors with blk.N.attn_{q,k,v}.bias (optional) and blk.N.attn_output.bias
//            [n_embd], blk.N.attn_sinks.weight [n_head], blk.N.post_attention_norm.weight [n_embd] (the FFN norm),
//            the qwen3moe expert tensors plus blk.N.ffn_gate_inp.bias [n_expert], blk.N.ffn_{gate,up}_exps.bias
//            [n_ff_exp, n_expert], blk.N.ffn_down_exps.bias [n_embd, n_expert].
#include <cmath>

#include "model/arch.h"
#include "model/forward.h"

namespace kiln {
namespace {

Status read_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_type = RopeType::kNeox;
  KILN_TRY(read_moe_hparams(f, hp));
  const std::string a = hp.arch + ".";
  if (!f.has(a + "attention.sliding_window"))
    return make_error(ErrorCode::kNotFound, "missing metadata key '%sattention.sliding_window'", a.c_str());
  KILN_TRY(read_sliding_window(f, hp));
  KILN_TRY(read_swa_layers(f, hp, /*fallback_pattern=*/2, /*fallback_base=*/hp.rope_freq_base));
  hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_rot));
  hp.attn_sinks = true;
  return Status::ok();
}

std::vector<TensorSpec> manifest(const HParams& hp, Weights& w) {
  std::vector<TensorSpec> m = standard_manifest(hp, w, /*dense_ffn=*/false);
  for (TensorSpec& s : m)  // the FFN's pre-norm has the name of a post-attention norm here
    if (s.dst && s.name.size() > 15 && s.name.compare(s.name.size() - 15, 15, "ffn_norm.weight") == 0)
      s.name.replace(s.name.size() - 15, 15, "post_attention_norm.weight");
  add_qkv_bias_specs(hp, w, /*required=*/false, m);
  add_moe_specs(hp, w, m);
  const int64_t e = hp.n_embd, f = hp.n_ff_exp, x = hp.n_expert;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "attn_output.bias", {e}, &L.bo, true});
    m.push_back({TensorSpec::kF32, b + "attn_sinks.weight", {hp.n_head}, &L.attn_sinks, true});
    m.push_back({TensorSpec::kF32, b + "ffn_gate_inp.bias", {x}, &L.ffn_gate_inp_b, true});
    m.push_back({TensorSpec::kF32, b + "ffn_gate_exps.bias", {f, x}, &L.ffn_gate_exps_b, true});
    m.push_back({TensorSpec::kF32, b + "ffn_up_exps.bias", {f, x}, &L.ffn_up_exps_b, true});
    m.push_back({TensorSpec::kF32, b + "ffn_down_exps.bias", {e, x}, &L.ffn_down_exps_b, true});
  }
  return m;
}

Status block(ForwardCtx& c, int64_t il) {
  KILN_TRY(pieces::self_attention(c, il));  // biases, sinks and the window come with the layer
  return pieces::moe_ffn(c, il, MoeGating::kSoftmaxWeight, /*norm_topk=*/false, MoeActivation::kSwigluOai);
}

}  // namespace

extern const ArchDef kArchGptOss = {"gpt-oss", read_hparams, manifest, tie_output_to_embedding, block};

}  // namespace kiln
