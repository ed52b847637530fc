// Hyperparameters of a decoder-only transformer, parsed once from GGUF metadata (`<arch>.*` keys) into this typed,
// validated struct. Each architecture file (model/arch/*.cpp) says which keys it reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

enum class RopeType { kNormal, kNeox };  // normal: rotate pairs (2i, 2i+1); neox: pairs (i, i + n_rot/2)

struct HParams {
  std::string arch;            // general.architecture
  std::string name;            // general.name (may be empty)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;     // <arch>.context_length
  int64_t n_embd = 0;          // <arch>.embedding_length
  int64_t n_layer = 0;         // <arch>.block_count (less the NextN blocks: the trunk)
  int64_t n_nextn = 0;         // <arch>.nextn_predict_layers: multi-token-prediction blocks stored after the trunk
  int64_t n_ff = 0;            // <arch>.feed_forward_length
  int64_t n_head = 0;          // <arch>.attention.head_count
  int64_t n_head_kv = 0;       // <arch>.attention.head_count_kv (defaults to n_head)
  int64_t head_dim_k = 0;      // <arch>.attention.key_length (defaults to n_embd / n_head)
  int64_t head_dim_v = 0;      // <arch>.attention.value_length (defaults to head_dim_k)
  float rms_eps = 1e-5f;       // <arch>.attention.layer_norm_rms_epsilon
  RopeType rope_type = RopeType::kNormal;
  int64_t n_rot = 0;           // <arch>.rope.dimension_count (defaults to head_dim_k)
  float rope_freq_base = 10000.0f;   // <arch>.rope.freq_base
  float rope_freq_scale = 1.0f;      // 1 / <arch>.rope.scaling.factor when scaling.type is linear or yarn
  // YaRN (rope.scaling.type yarn; backend.h RopeParams says what they do), as llama.cpp derives them: ext_factor 1,
  // attn_factor = rope.scaling.attn_factor (1 / (1 + 0.1 ln factor) when factor <= 1), beta_fast 32, beta_slow 1,
  // n_ctx_orig = rope.scaling.original_context_length (default context_length). ext_factor 0: no YaRN.
  float rope_ext_factor = 0.0f;
  float rope_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  int64_t n_ctx_orig_yarn = 0;
  bool tied_embeddings = false;      // no output.weight: the output projection reuses token_embd.weight

  // ---- set by architectures that need them (defaults: a plain decoder, every layer alike) ----
  float attn_scale = 0.0f;           // attention scale; 0: 1 / sqrt(head_dim_k)
  float embd_scale = 1.0f;           // token embeddings times this (gemma3: sqrt(n_embd))
  // Sliding-window (local) attention layers (gemma3): <arch>.attention.sliding_window and the RoPE base of the
  // local layers (<arch>.rope.freq_base_swa); layer_swa[il] = 1 for a local layer (empty: none).
  int32_t sliding_window = 0;
  bool attn_sinks = false;  // gpt-oss: every layer's attention has per-head sink logits (blk.N.attn_sinks.weight)
  float rope_freq_base_swa = 10000.0f;
  std::vector<uint8_t> layer_swa;
  // Hybrid models (qwen35): layer_recurrent[il] = 1 for a linear-attention (Gated DeltaNet) layer, which has no
  // K/V cache but a per-sequence recurrent state (empty: none). <arch>.ssm.* sizes:
  std::vector<uint8_t> layer_recurrent;
  int64_t ssm_d_conv = 0;    // ssm.conv_kernel: taps of the causal conv1d
  int64_t ssm_d_inner = 0;   // ssm.inner_size: value width (n_v_heads x head_v_dim)
  int64_t ssm_d_state = 0;   // ssm.state_size: key head size (= value head size)
  int64_t ssm_n_v_head = 0;  // ssm.time_step_rank: value heads
  int64_t ssm_n_k_head = 0;  // ssm.group_count: key heads
  // Mixture-of-experts FFN (qwen3moe): <arch>.expert_count experts of width expert_feed_forward_length, of which
  // expert_used_count are routed per token (0: a dense FFN).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  // Encoders (bert, nomic-bert): attention is bidirectional (every token of a sequence sees all of it, so a sequence
  // runs whole in one step and gives no logits: model/arch/bert.cpp), norms are layer norms with norm_eps
  // (<arch>.attention.layer_norm_epsilon), learned absolute positions (bert) must stay below max_pos, and
  // n_token_types rows of token-type embeddings may be added (type 0).
  bool causal = true;
  float norm_eps = 1e-12f;
  int64_t max_pos = 0;  // 0: no learned positions
  int64_t n_token_types = 0;
  // Workspace an architecture needs beyond the standard buffers (model/state.cpp): the q buffer's width per token
  // (0: n_head * head_dim_k; qwen35: query and gate) and an extra scratch region of ws_extra floats per token
  // (ForwardCtx::s).
  int64_t ws_q_width = 0;
  int64_t ws_extra = 0;

  bool is_swa(int64_t il) const { return il < static_cast<int64_t>(layer_swa.size()) && layer_swa[il]; }
  bool is_recurrent(int64_t il) const {
    return il < static_cast<int64_t>(layer_recurrent.size()) && layer_recurrent[il];
  }
  bool hybrid() const {
    for (uint8_t r : layer_recurrent)
      if (r) return true;
    return false;
  }
  int32_t window(int64_t il) const { return is_swa(il) ? sliding_window : 0; }
  float rope_base(int64_t il) const { return is_swa(il) ? rope_freq_base_swa : rope_freq_base; }
  // Recurrent state per sequence of one linear layer, in floats: conv history and delta-rule matrices.
  int64_t ssm_conv_dim() const { return 2 * ssm_n_k_head * ssm_d_state + ssm_d_inner; }
  int64_t ssm_conv_state() const { return (ssm_d_conv - 1) * ssm_conv_dim(); }
  int64_t ssm_head_v_dim() const { return ssm_n_v_head > 0 ? ssm_d_inner / ssm_n_v_head : 0; }
  int64_t ssm_delta_state() const { return ssm_head_v_dim() * ssm_d_state * ssm_n_v_head; }
};

}  // namespace kiln
