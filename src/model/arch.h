// What an architecture file (model/arch/<name>.cpp) provides, the weights it binds, and the registry.
// An architecture = which GGUF keys it reads (on top of the common ones), which tensors it expects with which
// shapes, and its transformer block written with the shared pieces of model/forward.h. Adding a Llama-like
// architecture means one new file and one registry line (model/arch/registry.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "util/status.h"

namespace kiln {

struct LayerWeights {
  Tensor attn_norm;              // f32 [n_embd]
  Tensor wq, wk, wv, wo;         // [n_embd, n_head*hd_k], [n_embd, n_head_kv*hd_k], [n_embd, n_head_kv*hd_v],
                                 // [n_head*hd_v, n_embd]   (GGUF order: ne[0] = n_in)
  Tensor bq, bk, bv;             // optional f32 biases [n_head*hd_k], [n_head_kv*hd_k], [n_head_kv*hd_v]
  Tensor q_norm, k_norm;         // optional f32 [hd_k] per-head RMS norm weights (qwen3)
  Tensor ffn_norm;               // f32 [n_embd]
  Tensor w_gate, w_up, w_down;   // [n_embd, n_ff], [n_embd, n_ff], [n_ff, n_embd]
  // mixture-of-experts FFN: router and expert stacks (plane e = expert e)
  Tensor ffn_gate_inp;                            // [n_embd, n_expert]
  Tensor ffn_gate_exps, ffn_up_exps;              // [n_embd, n_ff_exp, n_expert]
  Tensor ffn_down_exps;                           // [n_ff_exp, n_embd, n_expert]
  // gpt-oss: router and expert biases (f32 [n_expert], [n_ff_exp, n_expert], [n_embd, n_expert]) and the attention
  // sinks (f32 [n_head], one logit per head in its softmax's denominator)
  Tensor ffn_gate_inp_b, ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b;
  Tensor attn_sinks;
  // gemma3: norms of the attention and FFN outputs before their residual adds
  Tensor post_attn_norm, post_ffn_norm;  // f32 [n_embd]
  // encoders (bert): the fused q/k/v projection is wqkv below (views of its rows land in wq/wk/wv) with bias bqkv;
  // biases of attn_output and the FFN, the post-norms (layer norms: weight and bias)
  Tensor bqkv;                           // f32 [3 n_embd]
  Tensor bo, b_up, b_down;               // f32 [n_embd], [n_ff], [n_embd] (bo: also gpt-oss's attn_output bias)
  Tensor attn_out_norm, attn_out_norm_b, layer_out_norm, layer_out_norm_b;  // f32 [n_embd]
  // qwen35 Gated DeltaNet layers (model/arch/qwen35.cpp has the shapes)
  Tensor wqkv, wz;                       // mixed q/k/v projection, output gate z
  Tensor ssm_conv1d, ssm_a, ssm_dt_bias, ssm_norm;  // f32
  Tensor ssm_alpha, ssm_beta, ssm_out;
};

// A NextN (multi-token prediction) block of qwen35 (model/mtp.h): a full-attention decoder block whose input row
// for a token is eh_proj(concat(enorm(embed(token)), hnorm(h))), h a hidden row of the trunk, and whose head is
// shared_head_norm then the output projection.
struct NextnWeights {
  LayerWeights block;       // the block's attention and FFN, as a trunk layer of the architecture
  Tensor eh_proj;           // [2 n_embd, n_embd]: input columns [0, n_embd) take the embedding, the rest h
  Tensor enorm, hnorm;      // f32 [n_embd]
  Tensor shared_head_norm;  // f32 [n_embd]
  Tensor embed_tokens;      // optional [n_embd, n_vocab]; invalid: the trunk's token_embd
  Tensor shared_head_head;  // optional [n_embd, n_vocab]; invalid: the trunk's output
};

struct Weights {
  Tensor tok_embd;     // [n_embd, n_vocab], any dequantizable type
  Tensor output_norm;  // f32 [n_embd]; invalid for encoders (the last layer's output is the hidden state)
  Tensor output;       // [n_embd, n_vocab]; = tok_embd when tied; invalid for encoders (no logits)
  Tensor rope_freqs;   // optional f32 [n_rot/2] (llama3 frequency factors)
  // encoders (bert): learned positions [n_embd, max_pos], token types [n_embd, n_token_types] (F32/F16/BF16), the
  // layer norm of the embeddings
  Tensor pos_embd, type_embd, tok_norm, tok_norm_b;
  std::vector<LayerWeights> layers;
  // The NextN blocks stored after the trunk (HParams::n_nextn; qwen35), not run by the trunk.
  std::vector<NextnWeights> nextn;
  // Set in the weights of a NextN view only (model/mtp.h): the first layer's input rows are the block's
  // combination of the token embedding with a hidden row given per token (StepPlan::hidden_in).
  const NextnWeights* nextn_input = nullptr;
  // rope_freqs as seen by each backend of the placement (the layers' backends all read it).
  struct OnBackend {
    Backend* backend;
    Tensor t;
  };
  std::vector<OnBackend> rope_freqs_on;
  Tensor rope_freqs_for(const Backend* be) const {
    for (const OnBackend& o : rope_freqs_on)
      if (o.backend == be) return o.t;
    return Tensor{};
  }
};

// One entry of an architecture's tensor manifest: the file must hold `name` with exactly `shape` (ne order);
// optional tensors may be absent. kind says which types are accepted: kMatrix what the backend's matmul reads,
// kEmbedding what its get_rows reads, kF32 only f32, kExperts (a stack of expert matrices) what its moe_ffn reads.
struct TensorSpec {
  enum Kind { kMatrix, kEmbedding, kF32, kExperts } kind = kMatrix;
  std::string name;
  std::vector<int64_t> shape;
  Tensor* dst = nullptr;
  bool required = true;
};

struct ForwardCtx;

struct ArchDef {
  const char* name;  // general.architecture
  // Arch-specific keys and defaults on top of read_common_hparams (model/hparams.cpp), e.g. the RoPE type.
  Status (*read_hparams)(const gguf::File& file, HParams& hp);
  // The tensor manifest, binding into `w` (w.layers is sized n_layer by the caller).
  std::vector<TensorSpec> (*manifest)(const HParams& hp, Weights& w);
  // After binding: derived settings (e.g. tied output), extra checks.
  Status (*finish)(const HParams& hp, Weights& w, HParams& hp_out);
  // One transformer block, in place on ctx.x.
  Status (*block)(ForwardCtx& ctx, int64_t il);
};

const ArchDef* find_arch(std::string_view name);
std::string supported_archs();  // "llama, qwen2, qwen3, gemma3, qwen35, qwen3moe, gpt-oss, bert, nomic-bert"

// Common hyperparameters: general.* and <arch>.* keys (see hparams.h), then validate_hparams.
Status read_common_hparams(const gguf::File& file, HParams& hp);
// Zero/negative sizes, head divisibility, n_rot range; errors name the key.
Status validate_hparams(const HParams& hp);
// An integer key (any integer type; an array is kUnsupported), or `fallback` when the file lacks it.
Result<int64_t> read_int_or(const gguf::File& file, const std::string& key, int64_t fallback);

// The standard pre-norm decoder tensors (token_embd, output_norm, output (optional), per layer attn_norm, q/k/v/o,
// ffn_norm, and with dense_ffn the FFN's gate/up/down). Architectures add their extras.
std::vector<TensorSpec> standard_manifest(const HParams& hp, Weights& w, bool dense_ffn = true);
// Extras some architectures carry, appended to a manifest:
//   blk.N.attn_{q,k,v}.bias  f32 [n_head*hd_k], [n_head_kv*hd_k], [n_head_kv*hd_v]
void add_qkv_bias_specs(const HParams& hp, Weights& w, bool required, std::vector<TensorSpec>& m);
//   blk.N.attn_{q,k}_norm.weight  f32 [hd_k]  (per-head RMS norm of q and k before RoPE)
void add_qk_norm_specs(const HParams& hp, Weights& w, bool required, std::vector<TensorSpec>& m);
//   blk.N.ffn_gate_inp.weight [n_embd, n_expert] (router), blk.N.ffn_{gate,up}_exps.weight
//   [n_embd, n_ff_exp, n_expert], blk.N.ffn_down_exps.weight [n_ff_exp, n_embd, n_expert]  (mixture of experts)
void add_moe_specs(const HParams& hp, Weights& w, std::vector<TensorSpec>& m);
// Reads <arch>.expert_count (required, in [1, 1024]), expert_used_count (required, in [1, expert_count]) and
// expert_feed_forward_length (default: feed_forward_length / expert_used_count, as llama.cpp) into hp.
Status read_moe_hparams(const gguf::File& file, HParams& hp);
// <arch>.attention.sliding_window (default 0: none; beyond int32 kInvalidFile) into hp.sliding_window.
Status read_sliding_window(const gguf::File& file, HParams& hp);
// The local layers of an interleaved-window model: <arch>.attention.sliding_window_pattern (a number, default
// `fallback_pattern`: every pattern-th layer is global, 0 all local) into hp.layer_swa, <arch>.rope.freq_base_swa
// (default `fallback_base`, > 0) into hp.rope_freq_base_swa.
Status read_swa_layers(const gguf::File& file, HParams& hp, int64_t fallback_pattern, float fallback_base);
// ArchDef::finish for the common case: no output.weight means the output projection is token_embd (tied).
Status tie_output_to_embedding(const HParams& hp, Weights& w, HParams& hp_out);

}  // namespace kiln
